// allocator/pool.cpp: splitting, merging and accounting of one pool; see
// pool.hpp for the invariants.
#include "allocator/pool.hpp"

#include <algorithm>
#include <bit>
#include <iterator>

#include "absl/strings/str_format.h"

namespace capalloc::detail {

namespace {
constexpr std::size_t kHugeSegmentRounding = std::size_t{2} << 20;
}  // namespace

SizePolicy SizePolicy::from(const AllocatorOptions& options) {
  SizePolicy p;
  p.granularity = options.round_granularity;
  p.granule_shift = static_cast<unsigned>(std::countr_zero(options.round_granularity));
  p.small_request_limit = options.small_request_limit;
  p.small_segment_bytes = options.small_segment_bytes;
  p.medium_request_limit = options.medium_request_limit;
  p.large_segment_bytes = options.large_segment_bytes;
  return p;
}

std::size_t SizePolicy::segment_bytes_for(std::size_t rounded) const {
  if (rounded <= small_request_limit) return std::max(small_segment_bytes, rounded);
  if (rounded <= medium_request_limit) return std::max(large_segment_bytes, rounded);
  // A huge request gets a segment of its own. Callers have checked that this
  // cannot overflow (rounded is far below SIZE_MAX).
  return (rounded + kHugeSegmentRounding - 1) / kHugeSegmentRounding * kHugeSegmentRounding;
}

Pool::~Pool() {
  for (auto& segment : segments_) {
    for (Block* b = segment->first; b != nullptr;) {
      Block* next = b->next;
      books_.arena->recycle(b);
      b = next;
    }
  }
}

FreeIndex& Pool::index_for(const Segment& segment) { return *segment.index; }

void Pool::file_segment(Segment& segment, FreeIndex* index) {
  if (segment.index != nullptr) segment.index->remove_segment_bytes(segment.size);
  if (index != nullptr) index->add_segment_bytes(segment.size);
  segment.index = index;
}

FreeIndex* Pool::find_index_slow(StreamHandle stream, SizeClass size_class) const {
  const IndexKey key{stream, size_class};
  IndexEntry& seen = seen_[seen_slot(key)];
  if (seen.index == nullptr || !(seen.key == key)) {
    auto it = indexes_.find(key);
    if (it == indexes_.end()) return nullptr;
    seen = {key, it->second.get()};
  }
  recent_[1] = recent_[0];
  recent_[0] = seen;
  return seen.index;
}

FreeIndex* Pool::make_index(StreamHandle stream, SizeClass size_class) {
  auto& slot = indexes_[IndexKey{stream, size_class}];
  if (!slot) {
    ++index_generation_;
    slot = std::make_unique<FreeIndex>(policy_.granule_shift);
    if (stream == kOrphanKey) slot->quick.refuse_all();
  }
  return slot.get();
}

void Pool::file_free(Block* block, PoolBooks& b) {
  block->state = BlockState::kFree;
  index_for(*block->segment).insert(block);
  ++b.stats.free_blocks;
  b.free_bytes += static_cast<std::int64_t>(block->size);
}

void Pool::split(Block* block, std::size_t rounded, Block* rest, PoolBooks& b) noexcept {
  if (rest == nullptr) return;  // the slack stays inside the block
  const std::size_t remainder = block->size - rounded;
  rest->addr = block->addr + rounded;
  rest->size = remainder;
  rest->segment = block->segment;
  rest->prev = block;
  rest->next = block->next;
  if (block->next != nullptr) block->next->prev = rest;
  block->next = rest;
  block->size = rounded;
  file_free(rest, b);
}

// Flattened: the index's find, remove and insert, the split and the
// accounting are each a few instructions, and as calls their frames cost
// about as much again (a graph pool's every allocation comes here).
[[gnu::flatten]] Block* Pool::take(StreamHandle stream, std::size_t rounded,
                                   std::size_t requested) {
  // The index is found once for both steps. An empty cache (always, in a
  // graph pool: its frees merge) costs one test.
  FreeIndex* index = find_index(stream, policy_.class_of(rounded));
  if (index == nullptr) return nullptr;
  if (!index->quick.empty()) {
    if (Block* block = take_cached_from(*index, rounded, requested, books_)) return block;
  }
  return take_indexed_from(*index, rounded, requested, books_);
}

Block* Pool::take_indexed_from(FreeIndex& index, std::size_t rounded, std::size_t requested,
                               PoolBooks& b) {
  Block* block = index.find(rounded);
  if (block == nullptr) {
    // Before the caller reserves a segment: what the quick cache holds,
    // merged, may serve the request.
    if (index.quick.empty()) return nullptr;
    drain_quick(index, b);
    block = index.find(rounded);
    if (block == nullptr) return nullptr;
  }
  Block* rest = spare_for_split(block->size, rounded, b);
  index.remove(block);
  --b.stats.free_blocks;
  b.free_bytes -= static_cast<std::int64_t>(block->size);
  split(block, rounded, rest, b);
  account_allocated(block, requested, b);
  return block;
}

Block* Pool::take_from_new_segment(void* base, std::size_t bytes, StreamHandle stream,
                                   std::size_t rounded, std::size_t requested) {
  // What can throw comes first (the segment, its index, the blocks, room in
  // segments_): if any of it does, the pool is as it was (an index made for
  // the stream stays, empty) and the caller still owns `base`.
  auto segment = std::make_unique<Segment>();
  segment->base = reinterpret_cast<std::uintptr_t>(base);
  segment->size = bytes;
  segment->device = device_;
  segment->stream = stream;
  segment->size_class = policy_.class_of(rounded);
  segment->pool = this;
  FreeIndex* const index = make_index(stream, segment->size_class);
  Block* block = books_.arena->make();
  Block* rest = nullptr;
  try {
    rest = spare_for_split(bytes, rounded, books_);
    segments_.reserve(segments_.size() + 1);
  } catch (...) {
    if (rest != nullptr) books_.arena->recycle(rest);
    books_.arena->recycle(block);
    throw;
  }
  block->addr = segment->base;
  block->size = bytes;
  block->segment = segment.get();
  segment->first = block;
  file_segment(*segment, index);
  segments_.push_back(std::move(segment));
  bump(books_.stats.reserved_bytes, static_cast<std::int64_t>(bytes));
  bump(books_.stats.segments, 1);
  split(block, rounded, rest, books_);
  account_allocated(block, requested, books_);
  return block;
}

void Pool::mark_pending(Block* block) {
  bump(books_.stats.allocated_bytes, -static_cast<std::int64_t>(block->size));
  bump(books_.stats.requested_bytes, -static_cast<std::int64_t>(block->requested));
  bump(books_.stats.allocated_blocks, -1);
  ++books_.stats.pending_free_blocks;
  ++books_.stats.frees;
  block->state = BlockState::kPendingFree;
}

// Flattened for the same reason as take(): a graph pool's every free.
[[gnu::flatten]] void Pool::give_back(Block* block, PoolBooks& b) {
  release_accounting(block, b);
  merge_and_file(block, b);
}

void Pool::drain_quick(FreeIndex& index, PoolBooks& b) {
  index.quick.drain([&](Block* block) {
    // Counted as free already; merge_and_file counts the survivor again.
    --b.stats.free_blocks;
    b.free_bytes -= static_cast<std::int64_t>(block->size);
    merge_and_file(block, b);
  });
}

void Pool::drain_quick_caches() {
  for (auto& [key, index] : indexes_) drain_quick(*index, books_);
}

void Pool::merge_and_file(Block* block, PoolBooks& b) {
  FreeIndex& index = index_for(*block->segment);
  // Merge with free neighbours (filed in the index or cached); the survivor
  // is the lowest-addressed block.
  auto unfile = [&](Block* neighbour) {
    if (neighbour->in_quick_cache) {
      index.quick.remove(neighbour);
    } else {
      index.remove(neighbour);
    }
    --b.stats.free_blocks;
    b.free_bytes -= static_cast<std::int64_t>(neighbour->size);
  };
  // A cached neighbour may itself border free blocks (cached blocks do not
  // merge), so merging runs until a non-free block or the segment's end on
  // each side; each block absorbed is gone, so the work is paid once.
  while (Block* prev = block->prev) {
    if (!prev->is_free()) break;
    unfile(prev);
    prev->size += block->size;
    prev->next = block->next;
    if (block->next != nullptr) block->next->prev = prev;
    b.arena->recycle(block);
    block = prev;
  }
  while (Block* next = block->next) {
    if (!next->is_free()) break;
    unfile(next);
    block->size += next->size;
    block->next = next->next;
    if (next->next != nullptr) next->next->prev = block;
    b.arena->recycle(next);
  }
  file_free(block, b);
}

void Pool::take_free_segments(std::vector<SegmentRange>& out,
                              std::optional<StreamHandle> only_stream,
                              std::optional<SizeClass> only_class,
                              const std::function<bool(const SegmentRange&)>& keep_segment) {
  // A segment whose blocks are all free but some cached is fully free once
  // the caches are merged: those of the indexes concerned are.
  for (auto& [key, index] : indexes_) {
    if ((!only_stream || key.stream == *only_stream) &&
        (!only_class || key.size_class == *only_class)) {
      drain_quick(*index, books_);
    }
  }
  auto keep = segments_.begin();
  for (auto it = segments_.begin(); it != segments_.end(); ++it) {
    Segment& segment = **it;
    if (!segment.fully_free() || (only_stream && segment.stream != *only_stream) ||
        (only_class && segment.size_class != *only_class) ||
        keep_segment({reinterpret_cast<void*>(segment.base), segment.size, segment.stream,
                      segment.size_class})) {
      if (keep != it) *keep = std::move(*it);
      ++keep;
      continue;
    }
    Block* block = segment.first;
    index_for(segment).remove(block);
    file_segment(segment, nullptr);
    --books_.stats.free_blocks;
    books_.free_bytes -= static_cast<std::int64_t>(block->size);
    books_.arena->recycle(block);
    bump(books_.stats.reserved_bytes, -static_cast<std::int64_t>(segment.size));
    bump(books_.stats.segments, -1);
    out.push_back({reinterpret_cast<void*>(segment.base), segment.size, segment.stream,
                   segment.size_class});
    if (segment.orphaned) std::erase(orphans_, &segment);
    it->reset();
  }
  if (keep != segments_.end()) {
    segments_.erase(keep, segments_.end());
    drop_unused_indexes();
  }
}

void Pool::orphan_stream(StreamHandle stream) {
  // Room first, so that nothing below throws once a segment has moved.
  orphans_.reserve(orphans_.size() + segments_.size());
  for (auto& [key, index] : indexes_) {
    if (key.stream == stream) drain_quick(*index, books_);
  }
  for (const auto& segment : segments_) {
    if (segment->stream != stream) continue;  // an orphan's is kOrphanKey
    // May throw: then this segment and the later ones stay the stream's.
    FreeIndex* home = make_index(kOrphanKey, segment->size_class);
    for (Block* b = segment->first; b != nullptr; b = b->next) {
      if (!b->in_free_index) continue;
      segment->index->remove(b);
      home->insert(b);
    }
    file_segment(*segment, home);
    segment->stream = kOrphanKey;
    segment->orphaned = true;
    orphans_.push_back(segment.get());
  }
  drop_unused_indexes();  // the stream's own, now empty
}

Block* Pool::take_from_orphan(StreamHandle stream, std::size_t segment_bytes,
                              std::size_t rounded, std::size_t requested) {
  // Only the default pool's: a graph pool's orphan may hold memory a graph
  // writes, which no capture may take without the tracker's say.
  if (orphans_.empty() || is_graph_pool()) return nullptr;
  const SizeClass size_class = policy_.class_of(rounded);
  // The smallest fully free orphan of the class that holds what a new
  // segment would. An oversize one at most 1/8 larger than that: a larger
  // one waits for a request of its size, or for the out-of-memory retry to
  // give it back, rather than be pinned by a small request.
  Segment* best = nullptr;
  for (Segment* segment : orphans_) {
    if (segment->size_class != size_class || segment->size < segment_bytes ||
        (size_class == SizeClass::kOversize && segment->size > segment_bytes + segment_bytes / 8) ||
        !segment->fully_free() || (best != nullptr && segment->size >= best->size)) {
      continue;
    }
    best = segment;
  }
  if (best == nullptr) return nullptr;
  FreeIndex* index = make_index(stream, size_class);  // may throw: nothing moved yet
  Block* block = best->first;
  index_for(*best).remove(block);
  file_segment(*best, index);
  best->stream = stream;
  best->orphaned = false;
  std::erase(orphans_, best);
  index->insert(block);
  drop_unused_indexes();  // the orphans' index, if it files nothing else
  return take_indexed_from(*index, rounded, requested, books_);
}

Pool::OrphanedBytes Pool::orphaned_bytes() const {
  OrphanedBytes out;
  for (const Segment* segment : orphans_) {
    out.reserved += static_cast<std::int64_t>(segment->size);
    for (const Block* b = segment->first; b != nullptr; b = b->next) {
      if (b->is_free()) out.free += static_cast<std::int64_t>(b->size);
    }
  }
  return out;
}

void Pool::drop_unused_indexes() {
  absl::flat_hash_set<const FreeIndex*> used;
  for (const auto& segment : segments_) used.insert(segment->index);
  for (auto it = indexes_.begin(); it != indexes_.end();) {
    if (used.contains(it->second.get())) {
      ++it;
      continue;
    }
    for (IndexEntry& recent : recent_) {
      if (recent.index == it->second.get()) recent.index = nullptr;
    }
    for (IndexEntry& seen : seen_) {
      if (seen.index == it->second.get()) seen.index = nullptr;
    }
    indexes_.erase(it++);
    ++index_generation_;
  }
}

absl::Status Pool::check_invariants() const {
  std::int64_t allocated = 0, requested = 0, reserved = 0, allocated_blocks = 0;
  std::int64_t free_blocks = 0, pending = 0, free_bytes = 0;
  for (const auto& segment : segments_) {
    reserved += static_cast<std::int64_t>(segment->size);
    std::uintptr_t expected = segment->base;
    const Block* prev = nullptr;
    for (const Block* b = segment->first; b != nullptr; prev = b, b = b->next) {
      if (b->addr != expected || b->prev != prev || b->segment != segment.get()) {
        return absl::InternalError(absl::StrFormat(
            "segment 0x%x: block 0x%x does not continue the tiling at 0x%x", segment->base,
            b->addr, expected));
      }
      if (b->size == 0 || b->size % policy_.granularity != 0) {
        return absl::InternalError(absl::StrFormat("block 0x%x has size %d, not a granule multiple",
                                                   b->addr, b->size));
      }
      expected += b->size;
      if (b->is_free()) {
        if (prev != nullptr && prev->is_free() && !prev->in_quick_cache && !b->in_quick_cache) {
          return absl::InternalError(
              absl::StrFormat("free blocks 0x%x and 0x%x are adjacent and unmerged", prev->addr,
                              b->addr));
        }
        // kOrphanKey for an orphan.
        FreeIndex* index = lookup_index({segment->stream, segment->size_class});
        if (index != segment->index) {
          return absl::InternalError(absl::StrFormat(
              "segment 0x%x files its free blocks in another index than its stream's%s",
              segment->base, segment->orphaned ? " (orphans')" : ""));
        }
        const bool filed = index != nullptr && (b->in_quick_cache
                                                    ? !b->in_free_index && index->quick.contains(b)
                                                    : b->in_free_index && index->contains(b));
        if (!filed) {
          return absl::InternalError(
              absl::StrFormat("free block 0x%x is missing from its free index", b->addr));
        }
        ++free_blocks;
        free_bytes += static_cast<std::int64_t>(b->size);
      } else {
        if (b->in_free_index || b->in_quick_cache) {
          return absl::InternalError(
              absl::StrFormat("block 0x%x is in use but filed as free", b->addr));
        }
        if (b->state == BlockState::kAllocated) {
          allocated += static_cast<std::int64_t>(b->size);
          requested += static_cast<std::int64_t>(b->requested);
          ++allocated_blocks;
        } else {
          ++pending;
        }
      }
    }
    if (expected != segment->base + segment->size) {
      return absl::InternalError(absl::StrFormat(
          "segment 0x%x: blocks cover %d of %d bytes", segment->base, expected - segment->base,
          segment->size));
    }
  }
  // The lookup caches name live indexes under their own keys.
  for (const IndexEntry& recent : recent_) {
    if (recent.index != nullptr && lookup_index(recent.key) != recent.index) {
      return absl::InternalError("a recently found free index is not its key's");
    }
  }
  for (std::size_t slot = 0; slot < std::size(seen_); ++slot) {
    const IndexEntry& seen = seen_[slot];
    if (seen.index != nullptr &&
        (seen_slot(seen.key) != slot || lookup_index(seen.key) != seen.index)) {
      return absl::InternalError(absl::StrFormat(
          "slot %d of the free indexes found before is not its key's index", slot));
    }
  }
  // Each index's byte counters (FreeIndex::scarce reads them).
  absl::flat_hash_map<const FreeIndex*, std::pair<std::size_t, std::size_t>> index_bytes;
  for (const auto& segment : segments_) {
    auto& [filed, segment_bytes] = index_bytes[segment->index];
    segment_bytes += segment->size;
    for (const Block* b = segment->first; b != nullptr; b = b->next) {
      if (b->in_free_index) filed += b->size;
    }
  }
  for (const auto& [key, index] : indexes_) {
    const auto [filed, segment_bytes] = index_bytes[index.get()];
    if (index->filed_bytes() != filed || index->segment_bytes() != segment_bytes) {
      return absl::InternalError(absl::StrFormat(
          "the free index of stream %#x, class %d counts %d filed bytes over %d segment bytes; "
          "its segments hold %d filed bytes over %d",
          key.stream, static_cast<int>(key.size_class), index->filed_bytes(),
          index->segment_bytes(), filed, segment_bytes));
    }
  }
  std::size_t indexed = 0;
  for (const auto& [key, index] : indexes_) indexed += index->count() + index->quick.count();
  if (indexed != static_cast<std::size_t>(free_blocks)) {
    return absl::InternalError(absl::StrFormat(
        "free indexes hold %d blocks, the segments have %d free blocks", indexed, free_blocks));
  }
  auto mismatch = [](const char* what, std::int64_t counted, std::int64_t recomputed) {
    return absl::InternalError(absl::StrFormat("stats: %s is %d, recomputed %d", what, counted,
                                               recomputed));
  };
  if (books_.stats.allocated_bytes.current != allocated)
    return mismatch("allocated_bytes", books_.stats.allocated_bytes.current, allocated);
  if (books_.stats.requested_bytes.current != requested)
    return mismatch("requested_bytes", books_.stats.requested_bytes.current, requested);
  if (books_.stats.reserved_bytes.current != reserved)
    return mismatch("reserved_bytes", books_.stats.reserved_bytes.current, reserved);
  if (books_.stats.segments.current != static_cast<std::int64_t>(segments_.size()))
    return mismatch("segments", books_.stats.segments.current, static_cast<std::int64_t>(segments_.size()));
  if (books_.stats.allocated_blocks.current != allocated_blocks)
    return mismatch("allocated_blocks", books_.stats.allocated_blocks.current, allocated_blocks);
  if (books_.stats.free_blocks != free_blocks) return mismatch("free_blocks", books_.stats.free_blocks, free_blocks);
  if (books_.stats.pending_free_blocks != pending)
    return mismatch("pending_free_blocks", books_.stats.pending_free_blocks, pending);
  if (books_.free_bytes != free_bytes) return mismatch("cached free bytes", books_.free_bytes, free_bytes);
  std::int64_t orphaned = 0;
  for (const auto& segment : segments_) {
    orphaned += segment->orphaned ? 1 : 0;
    if (segment->orphaned != (segment->stream == kOrphanKey)) {
      return absl::InternalError(absl::StrFormat(
          "segment %#x: %s, but its stream is %#x", segment->base,
          segment->orphaned ? "an orphan" : "not an orphan", segment->stream));
    }
  }
  if (orphaned != static_cast<std::int64_t>(orphans_.size()) ||
      !std::all_of(orphans_.begin(), orphans_.end(),
                   [](const Segment* s) { return s->orphaned; })) {
    return absl::InternalError(absl::StrFormat(
        "%d segments are marked orphaned, the orphan list holds %d", orphaned, orphans_.size()));
  }
  return absl::OkStatus();
}

}  // namespace capalloc::detail
