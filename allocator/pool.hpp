// allocator/pool.hpp: a pool of segments on one device and the blocks carved
// from them.
//
// The pool is mechanism only: it splits free blocks to serve a request,
// merges a freed block with its free physical neighbours, files free blocks
// in one FreeIndex per (owning stream, size class), and keeps the pool's
// byte and block counters. Policy (when to reserve a segment, what to do out
// of memory, when a pending free completes) lives in the Allocator, which
// holds the lock: a Pool is not thread-safe on its own.
//
// Invariants (checked by check_invariants):
//  - each segment's blocks tile it exactly, in address order;
//  - no two physically adjacent blocks are both free unless one of them is
//    in a quick cache;
//  - a block is filed iff it is free: in the FreeIndex of its segment's
//    (stream, size class), or in that index's QuickCache, exactly once;
//  - the counters equal the sums recomputed from the blocks.
//
// Cost: take() is O(1) (a quick-cache pop, or FreeIndex::find plus at most
// one split; a drain of the quick cache first when the index cannot serve,
// O(1) amortized per cached free); give_back() is O(1) (at most two merges);
// cache_freed() is O(1) (a list push).
#ifndef CAPALLOC_ALLOCATOR_POOL_HPP_
#define CAPALLOC_ALLOCATOR_POOL_HPP_

#include <algorithm>
#include <cstddef>
#include <functional>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "allocator/block.hpp"
#include "allocator/free_index.hpp"
#include "common/fibonacci_hash.hpp"
#include "capalloc/allocator.hpp"

namespace capalloc::detail {

// Adds `delta` to a counter and raises its peak; drop() subtracts (a peak
// never moves down).
inline void bump(StatCounter& counter, std::int64_t delta) {
  counter.current += delta;
  if (counter.current > counter.peak) counter.peak = counter.current;
}
inline void drop(StatCounter& counter, std::int64_t delta) { counter.current -= delta; }

// Which segments serve a request, and how big a new segment is.
struct SizePolicy {
  std::size_t granularity = 512;
  unsigned granule_shift = 9;
  std::size_t small_request_limit = 0;
  std::size_t small_segment_bytes = 0;
  std::size_t medium_request_limit = 0;
  std::size_t large_segment_bytes = 0;

  static SizePolicy from(const AllocatorOptions& options);
  bool is_small(std::size_t rounded) const { return rounded <= small_request_limit; }
  SizeClass class_of(std::size_t rounded) const {
    return rounded <= small_request_limit    ? SizeClass::kSmall
           : rounded <= medium_request_limit ? SizeClass::kLarge
                                             : SizeClass::kOversize;
  }
  std::size_t segment_bytes_for(std::size_t rounded) const;
};

struct SegmentRange {
  void* base = nullptr;
  std::size_t bytes = 0;
  StreamHandle stream = kDefaultStream;  // the stream owning the segment
  SizeClass size_class = SizeClass::kSmall;
};

// The counters a pool operation changes, and the arena its Block objects
// come from and go back to: the pool's own (Pool::books_), or a stream
// shard's (stream_shards.hpp), whose counters are deltas that the
// allocator's lock folds into the pool's and whose arena holds only blocks
// lent by the allocator's. Its peaks mean nothing in a shard's books.
struct PoolBooks {
  AllocatorStats stats;
  std::int64_t free_bytes = 0;  // bytes in free blocks
  BlockArena* arena = nullptr;
};

// What a quick cache may hold at least (Pool::caches_freed).
inline constexpr std::size_t kMinQuickCacheBytes = std::size_t{1} << 20;

class Pool {
 public:
  // `handle` is kDefaultPool for a device's default pool, else the graph
  // pool's handle.
  Pool(int device, PoolHandle handle, const SizePolicy& policy, BlockArena& arena)
      : device_(device), handle_(handle), policy_(policy) {
    books_.arena = &arena;
  }
  ~Pool();
  Pool(const Pool&) = delete;
  Pool& operator=(const Pool&) = delete;

  int device() const { return device_; }
  PoolHandle handle() const { return handle_; }
  bool is_graph_pool() const { return handle_ != kDefaultPool; }
  // Blocks the pool cannot give back yet: allocated or pending-free.
  std::int64_t blocks_in_use() const {
    return books_.stats.allocated_blocks.current + books_.stats.pending_free_blocks;
  }

  // Who keeps a graph pool alive, each owner counted apart so that no owner
  // can give up a reference another holds:
  //  - handle_refs: the caller's handles (create_graph_pool, retain_graph_pool;
  //    given up by release_graph_pool);
  //  - route_refs: capture routes allocating into the pool;
  //  - graph_holds: graphs that may replay into the pool, by capture id (a
  //    tracker's hold_graph_pool, or a discovered capture's unknown graph);
  //    where the runtime watches a graph, its hold goes only once the runtime
  //    reports it gone, which may be after its handle is destroyed (its
  //    nodes live on in a graph it was launched into).
  int handle_refs = 0;
  int route_refs = 0;
  absl::flat_hash_set<CaptureId> graph_holds;
  bool referenced() const { return handle_refs > 0 || route_refs > 0 || !graph_holds.empty(); }
  // Set when the pool had no reference and no block left but could not go,
  // for segments it could not give back yet: memory a live graph's record
  // names, a segment the runtime failed to release, or any segment while a
  // capture is routed on the device (maybe_destroy_pool). Whoever releases
  // them (empty_cache, the allocator's destructor) destroys the pool.
  bool kept_for_segments = false;

  // Serves `rounded` bytes on `stream` from a cached free block, splitting
  // off the remainder; nullptr when no cached block fits. The block comes
  // back allocated, with its size and accounting set.
  Block* take(StreamHandle stream, std::size_t rounded, std::size_t requested);
  // take() when the quick cache of the (stream, size class) has a block of
  // the request's class; else nullptr, and nothing changed. Inline: the
  // Allocator's steady-state path.
  Block* take_cached(StreamHandle stream, std::size_t rounded, std::size_t requested) {
    FreeIndex* index = find_index(stream, policy_.class_of(rounded));
    return index == nullptr ? nullptr : take_cached_from(*index, rounded, requested, books_);
  }
  // take_cached with the (stream, size class)'s index found, counted in
  // `b` (the pool's books, or a stream shard's).
  Block* take_cached_from(FreeIndex& index, std::size_t rounded, std::size_t requested,
                          PoolBooks& b) {
    if (!index.quick.caches(rounded)) return nullptr;
    Block* block = index.quick.pop(rounded);
    if (block == nullptr) return nullptr;
    --b.stats.free_blocks;
    b.free_bytes -= static_cast<std::int64_t>(block->size);
    account_allocated(block, requested, b);
    return block;
  }
  // take() past its quick cache: the FreeIndex, split, and a drain of the
  // quick cache when the index cannot serve.
  Block* take_indexed(StreamHandle stream, std::size_t rounded, std::size_t requested) {
    FreeIndex* index = find_index(stream, policy_.class_of(rounded));
    return index == nullptr ? nullptr : take_indexed_from(*index, rounded, requested, books_);
  }
  Block* take_indexed_from(FreeIndex& index, std::size_t rounded, std::size_t requested,
                           PoolBooks& b);
  // Adds a fresh segment owned by `stream` and serves the request from it.
  Block* take_from_new_segment(void* base, std::size_t bytes, StreamHandle stream,
                               std::size_t rounded, std::size_t requested);
  // Frees an allocated or pending-free block: merges and files it.
  void give_back(Block* block) { give_back(block, books_); }
  void give_back(Block* block, PoolBooks& b);
  // The peaks an allocation may raise (Pool::take and its kin), read
  // before it so that untake() can put them back.
  // No initializers: the steady-state path reads them only with an observer
  // set, and does not pay for zeroing them without one.
  struct AllocationPeaks {
    std::int64_t allocated_bytes;
    std::int64_t requested_bytes;
    std::int64_t allocated_blocks;
  };
  AllocationPeaks allocation_peaks() const {
    return {books_.stats.allocated_bytes.peak, books_.stats.requested_bytes.peak,
            books_.stats.allocated_blocks.peak};
  }
  // Takes back an allocated block its caller never saw (a later step of the
  // allocation failed): give_back(), neither the allocation nor the free
  // counted, and the peaks as they were before the take (`before`).
  void untake(Block* block, const AllocationPeaks& before) {
    give_back(block);
    --books_.stats.allocations;
    --books_.stats.frees;
    books_.stats.allocated_bytes.peak = before.allocated_bytes;
    books_.stats.requested_bytes.peak = before.requested_bytes;
    books_.stats.allocated_blocks.peak = before.allocated_blocks;
  }
  // Whether cache_freed may take `block` (its size is one the quick cache
  // of its segment's index keeps, and the cache has room). Inline, with
  // cache_freed: the steady-state free.
  bool caches_freed(const Block& block) const {
    // Cached blocks are holes the FreeIndex does not see: past a share of
    // the pool, requests the cache misses would carve free runs the holes
    // could have served, and the pool would fragment. So a cache holds at
    // most 1/8 of the pool's reserved bytes (at least 1 MiB): without the
    // cap, the two-stream churn of tests/steady_state_test.cpp reserved a
    // segment more than the merging path needs.
    const FreeIndex& index = *block.segment->index;
    const QuickCache& quick = index.quick;
    const std::size_t cap = std::max(kMinQuickCacheBytes,
                                     static_cast<std::size_t>(books_.stats.reserved_bytes.current) / 8);
    // An orphan's index caches nothing (QuickCache::refuse_all).
    if (!quick.caches(block.size) || quick.bytes() + block.size > cap) return false;
    // A freed block beside a free one (filed or cached) would keep that run
    // short while it waits in the cache, and requests the cache misses carve
    // fresh runs elsewhere: over churn of mid-sized working sets, a segment
    // or two more than merging needs. So while free memory is scarce in
    // the block's own index (FreeIndex::scarce: the stream's segments of
    // its class, not the pool's, which other streams' or classes' free
    // memory would mislead), the block merges instead. Measured in
    // docs/performance.md ("Memory", twelfth session).
    const bool beside_free = (block.prev != nullptr && block.prev->is_free()) ||
                             (block.next != nullptr && block.next->is_free());
    return !beside_free || !index.scarce();
  }
  // Frees an allocated block into its index's quick cache, unmerged
  // (quick_cache.hpp). Precondition: caches_freed(*block).
  void cache_freed(Block* block) { cache_freed(block, books_); }
  void cache_freed(Block* block, PoolBooks& b) {
    release_accounting(block, b);
    block->state = BlockState::kFree;
    block->segment->index->quick.push(block);
    ++b.stats.free_blocks;
    b.free_bytes += static_cast<std::int64_t>(block->size);
  }
  // Merges every quick-cached block into the free indexes: before anything
  // that needs whole free segments (take_free_segments does it itself).
  void drain_quick_caches();
  // An allocated block becomes pending-free (out of the allocated counters).
  void mark_pending(Block* block);

  // `stream` was destroyed: its segments become orphans (their quick caches
  // merged first, so that each is fully free once its last block is). They
  // stay reserved; nothing is released here, which would synchronize the
  // device inside an allocator call. An orphan belongs to no stream: its
  // stream becomes kOrphanKey (kNoStream), and its free blocks move to the
  // orphans' free indexes, which no stream allocates from. CUDA and HIP hand
  // a destroyed stream's handle to the next stream created; that stream
  // must not take an orphan's memory, nor pass for the owner of its blocks
  // (record_stream would skip it, a release by stream would take it).
  void orphan_stream(StreamHandle stream);
  static constexpr StreamHandle kOrphanKey = kNoStream;
  // A fully free orphan of the request's size class and of at least
  // `segment_bytes`, moved to `stream`, serves the request as a new segment
  // would, without a reservation; nullptr when there is none. Its stream's
  // work is done (a destroyed stream's is), so any stream may use it.
  Block* take_from_orphan(StreamHandle stream, std::size_t segment_bytes, std::size_t rounded,
                          std::size_t requested);
  // What the orphans hold: reserved bytes, and the free bytes among them.
  struct OrphanedBytes {
    std::int64_t reserved = 0;
    std::int64_t free = 0;
  };
  OrphanedBytes orphaned_bytes() const;

  // Removes the fully free segments (of `only_stream` and `only_class`,
  // when given) for which `keep` is false and appends their ranges to
  // `out`, for the caller to release; the quick caches of those segments'
  // indexes are drained first. Free indexes that no segment files into any
  // more go too (a destroyed stream's, for one).
  void take_free_segments(std::vector<SegmentRange>& out, std::optional<StreamHandle> only_stream,
                          std::optional<SizeClass> only_class,
                          const std::function<bool(const SegmentRange&)>& keep);

  const std::vector<std::unique_ptr<Segment>>& segments() const { return segments_; }
  const AllocatorStats& stats() const { return books_.stats; }
  AllocatorStats& mutable_stats() { return books_.stats; }
  std::int64_t cached_free_bytes() const { return books_.free_bytes; }
  // The pool's own books, into which a stream shard's are folded.
  PoolBooks& books() { return books_; }
  // The free index of (stream, size class), or null; found without the
  // lookup caches, which it leaves as they are (a stream shard keeps what
  // it finds here).
  FreeIndex* index_of(StreamHandle stream, SizeClass size_class) const {
    return lookup_index({stream, size_class});
  }
  // Changes whenever a free index is made or dropped: what index_of found
  // before still holds while it is the same.
  std::uint64_t index_generation() const { return index_generation_; }

  absl::Status check_invariants() const;

 private:
  struct IndexKey {
    StreamHandle stream;
    SizeClass size_class;
    bool operator==(const IndexKey&) const = default;
    template <typename H>
    friend H AbslHashValue(H h, const IndexKey& k) {
      return H::combine(std::move(h), k.stream, k.size_class);
    }
  };
  FreeIndex& index_for(const Segment& segment);
  // Files `segment`'s free blocks under `index` from now on (nullptr: the
  // segment goes), its bytes counted there (FreeIndex::segment_bytes) and
  // no longer under the index it had. Moves no block.
  void file_segment(Segment& segment, FreeIndex* index);
  FreeIndex* find_index(StreamHandle stream, SizeClass size_class) const {
    // Most requests come from the stream of the previous one, or of the one
    // before (two streams taking turns: a compute and a copy stream, or two
    // threads): two compares, inline. More streams find their index out of
    // line (find_index_slow), most without a hash-table lookup.
    const IndexKey key{stream, size_class};
    if (recent_[0].index != nullptr && recent_[0].key == key) return recent_[0].index;
    if (recent_[1].index != nullptr && recent_[1].key == key) return recent_[1].index;
    return find_index_slow(stream, size_class);
  }
  // Out of line even in the flattened Pool::take: inlined there, it cost
  // every take an instruction (callgrind, capalloc_bench_capture part 1:
  // 64,473,585 -> 64,413,702 for 60,000 pairs in a capture).
  [[gnu::noinline]] FreeIndex* find_index_slow(StreamHandle stream, SizeClass size_class) const;
  // indexes_' entry for `key`, or null, leaving recent_ and seen_ as they
  // are (check_invariants, which checks them against it).
  FreeIndex* lookup_index(const IndexKey& key) const {
    auto it = indexes_.find(key);
    return it == indexes_.end() ? nullptr : it->second.get();
  }
  FreeIndex* make_index(StreamHandle stream, SizeClass size_class);
  // The block a split of a `size`-byte block to `rounded` bytes files the
  // remainder in, or null when the remainder stays inside the block. Made
  // before anything changes: it is the one step of a take that can throw.
  Block* spare_for_split(std::size_t size, std::size_t rounded, PoolBooks& b) {
    return size - rounded < policy_.granularity ? nullptr : b.arena->make();
  }
  // Splits `block` (free, out of the index) so that it is `rounded` bytes;
  // the remainder goes in `rest` (from spare_for_split), filed as free.
  void split(Block* block, std::size_t rounded, Block* rest, PoolBooks& b) noexcept;
  void account_allocated(Block* block, std::size_t requested, PoolBooks& b) {
    block->state = BlockState::kAllocated;
    block->requested = requested;
    bump(b.stats.allocated_bytes, static_cast<std::int64_t>(block->size));
    bump(b.stats.requested_bytes, static_cast<std::int64_t>(requested));
    bump(b.stats.allocated_blocks, 1);
    ++b.stats.allocations;
  }
  // The allocated or pending counters of a block being freed, and its
  // per-allocation fields reset.
  void release_accounting(Block* block, PoolBooks& b) {
    if (block->state == BlockState::kAllocated) {
      drop(b.stats.allocated_bytes, static_cast<std::int64_t>(block->size));
      drop(b.stats.requested_bytes, static_cast<std::int64_t>(block->requested));
      drop(b.stats.allocated_blocks, 1);
      ++b.stats.frees;
    } else {
      --b.stats.pending_free_blocks;
    }
    block->requested = 0;
    block->used_on.clear();
    block->lifetime = Lifetime::kTransient;
    block->tag_id = 0;
    block->owner_id = 0;
    block->capture = 0;
    block->capture_position = 0;
  }

  // Merges a free block (counted as free, filed nowhere) with its free
  // neighbours and files the result in its index.
  void merge_and_file(Block* block, PoolBooks& b);
  void drain_quick(FreeIndex& index, PoolBooks& b);
  void file_free(Block* block, PoolBooks& b);
  void drop_unused_indexes();

  int device_;
  PoolHandle handle_;
  SizePolicy policy_;
  std::vector<std::unique_ptr<Segment>> segments_;
  absl::flat_hash_map<IndexKey, std::unique_ptr<FreeIndex>> indexes_;
  // The indexes find_index found last, newest first, and those found
  // before by seen_slot(key), a small table in front of indexes_ (index
  // null: none). An index that goes is cleared from both
  // (drop_unused_indexes).
  struct IndexEntry {
    IndexKey key{kDefaultStream, SizeClass::kSmall};
    FreeIndex* index = nullptr;
  };
  static constexpr int kSeenBits = 3;
  static std::size_t seen_slot(const IndexKey& key) {
    return fibonacci_slot(
        static_cast<std::uint64_t>(key.stream) ^ static_cast<std::uint64_t>(key.size_class),
        64 - kSeenBits);
  }
  mutable IndexEntry recent_[2];
  mutable IndexEntry seen_[std::size_t{1} << kSeenBits];
  PoolBooks books_;
  std::uint64_t index_generation_ = 0;
  // Segments whose stream is gone (Segment::orphaned), in no order.
  std::vector<Segment*> orphans_;
};


}  // namespace capalloc::detail

#endif  // CAPALLOC_ALLOCATOR_POOL_HPP_
