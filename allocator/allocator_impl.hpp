// allocator/allocator_impl.hpp: the Allocator's state, shared by its four
// source files (allocator.cpp: allocate/free and the public calls;
// pending_frees.cpp: frees that wait on other streams' events;
// graph_pools.cpp: graph pools and capture routes;
// allocator_checks.cpp: diagnosis, invariants and description).
//
// One mutex guards everything (as PyTorch's allocator does per device);
// runtime calls made under it never call back into the allocator.
//
// What the Impl owns:
//  - the pointer table: every allocated block by address. Pending-free
//    blocks are not in it, so a second free of them is a double free;
//  - per device, the default pool, the graph pools, and a map of segments by
//    address to diagnose pointers capalloc did not hand out;
//  - capture routes: which pool each capture allocates into;
//  - pending frees: a block used on other streams is freed once events
//    recorded on those streams at free time have completed. They are polled,
//    never waited for, on allocation. While a capture is routed on the
//    device, or while one of the block's streams is capturing, events are
//    neither recorded nor queried (either would join or break the capture):
//    such frees wait in `deferred` until the captures are over.
#ifndef CAPALLOC_ALLOCATOR_ALLOCATOR_IMPL_HPP_
#define CAPALLOC_ALLOCATOR_ALLOCATOR_IMPL_HPP_

#include <atomic>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/btree_map.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "allocator/block.hpp"
#include "allocator/block_table.hpp"
#include "allocator/observation.hpp"
#include "common/fibonacci_hash.hpp"
#include "common/futex_mutex.hpp"
#include "common/interned_strings.hpp"
#include "allocator/pool.hpp"
#include "allocator/stream_shards.hpp"
#include "capalloc/allocator.hpp"

namespace capalloc {

namespace detail {

struct PendingEvent {
  Block* block;
  EventHandle event;
  int device;
};

// Which pool a capture allocates into.
struct CaptureRoute {
  int device = 0;
  Pool* pool = nullptr;
  StreamHandle stream = kDefaultStream;  // a stream seen in the capture
  bool announced = false;                // begin_allocate_to_pool, not discovered
  bool watched = false;                  // its graph's lifetime is watched
};

// A graph whose end the runtime will report, and whether the allocator holds
// a reference on its pool for it (a discovered capture's graph does; an
// announced one's pool is its announcer's to release).
struct WatchedGraph {
  PoolHandle pool = kDefaultPool;
  bool holds_pool_ref = false;
};

// Captures whose graphs the runtime reported gone, from any thread
// (DeviceRuntime::watch_capture_graph); applied under Allocator::Impl::mu.
struct GoneGraphs {
  std::mutex mu;
  std::vector<CaptureId> captures;
  std::atomic<bool> any{false};
};

// Streams the runtime reported destroyed (MemoryRuntime::
// watch_stream_destruction), from any thread; applied under
// Allocator::Impl::mu.
struct GoneStreams {
  std::mutex mu;
  std::vector<StreamHandle> streams;
  std::atomic<bool> any{false};
};

struct DeviceState {
  std::unique_ptr<Pool> default_pool;
  absl::flat_hash_map<PoolHandle, std::unique_ptr<Pool>> graph_pools;
  absl::btree_map<std::uintptr_t, Segment*> segments;  // by base address
  std::vector<EventHandle> spare_events;
  int routes = 0;  // captures routed to a pool on this device
  // The cumulative counters (allocations, frees, retries, ooms, peaks) of
  // graph pools already destroyed, so that the device's counters never go
  // back when a pool goes.
  AllocatorStats retired_pools;
};

// What allocate() learned about the requesting stream before taking the lock.
struct CaptureContext {
  bool device_may_capture = false;  // DeviceRuntime::any_capture_active
  CaptureId capture = 0;            // the stream's capture, 0 if none
  std::size_t position = 0;
  std::uintptr_t graph = 0;         // CaptureInfo::graph
};

}  // namespace detail

struct CAPALLOC_INTERNAL Allocator::Impl {
  std::shared_ptr<MemoryRuntime> runtime;
  DeviceRuntime* device_runtime = nullptr;  // `runtime`, when it has the graph seam
  AllocatorOptions options;
  detail::SizePolicy policy;

  // The allocator's lock: its own futex, then every stream shard's lock,
  // with the shards' deltas folded into their pools on the way in and fresh
  // allowances dealt on the way out (stream_shards.hpp). Whatever runs
  // under it sees and may change the whole state.
  class GeneralLock {
   public:
    explicit GeneralLock(Impl& impl) : impl_(impl) {}
    void lock() {
      // Contention says a second thread uses the allocator: shards may pay.
      if (!futex_.try_lock()) [[unlikely]] {
        futex_.lock();
        impl_.threads_seen = true;
      }
      if (sharded_) impl_.fold_shards();
    }
    void unlock() {
      if (sharded_) impl_.deal_shards();
      futex_.unlock();
    }
    // A shard was made (maybe_make_shard, under the lock): from now on the
    // lock folds and deals.
    void note_sharded() { sharded_ = true; }

   private:
    detail::FutexMutex futex_;
    bool sharded_ = false;
    Impl& impl_;
  };
  // The lock on a cache line of its own, apart from what allocate() reads
  // before taking it (the runtime, the options, the size policy): with two
  // threads, each acquisition takes the lock's line from the other core,
  // and must not take those with it.
  alignas(64) mutable GeneralLock mu{*this};
  // This allocator among every one the process made (the thread's shard
  // hint names it: detail::shard_hint).
  const std::uint64_t allocator_id = next_id();
  static std::uint64_t next_id() {
    static std::atomic<std::uint64_t> ids{0};
    return ids.fetch_add(1, std::memory_order_relaxed) + 1;
  }
  alignas(64) detail::BlockArena arena;
  // Every stream shard made, in lock order (at most kMaxShards; one not in
  // use is reused), and the slots threads find them by. Changed under mu.
  static constexpr std::size_t kMaxShards = detail::ShardSlots::kMaxShards;
  std::vector<std::unique_ptr<detail::StreamShard>> shards;
  detail::ShardSlots shard_slots;
  // Per device, the room the deal keeps back (made with the first shard).
  std::vector<std::unique_ptr<detail::RoomReserve>> room_reserves;
  // Shards are made only once a second thread has allocated through the
  // general path (maybe_make_shard) or found the lock taken (GeneralLock):
  // the first thread that came to the general path, and whether another
  // thread has shown itself. Under mu.
  const void* general_thread = nullptr;
  bool threads_seen = false;
  std::vector<detail::DeviceState> devices;
  detail::BlockTable live;
  std::vector<detail::PendingEvent> pending;
  std::vector<detail::Block*> deferred;  // pending-free, events not yet recorded
  absl::flat_hash_map<CaptureId, detail::CaptureRoute> routes;
  // The number of routes, on every device (the sum of DeviceState::routes),
  // readable without mu: a hint for the torch entry points, whose frees
  // during a routed capture mostly take the general path (capture blocks, a
  // listener to tell), so that they go there at once and take the lock
  // once. Changed with mu held; a stale read costs only the second lock.
  std::atomic<int> routed_captures{0};
  // The route route_for found last (a watched one), so that the allocations
  // of one capture skip the hash lookup; drop_route clears it.
  CaptureId last_route_capture = 0;
  detail::Pool* last_route_pool = nullptr;
  absl::flat_hash_map<PoolHandle, int> pool_devices;  // graph pool -> device
  PoolHandle next_pool = 1;
  std::uint64_t next_sequence = 1;
  CaptureListener* listener = nullptr;
  // Captures whose graph's end the runtime will report (discovered ones,
  // whose graph holds a reference to their pool, and announced ones from
  // their first allocation), and the reports of those graphs' end (shared
  // with the runtime's watchers, which may outlive the allocator).
  absl::flat_hash_map<CaptureId, detail::WatchedGraph> watched_graphs;
  // Asks the runtime to report when the graph of `capture` (being captured
  // on `stream`) is gone; returns whether it will.
  bool watch_graph(CaptureId capture, StreamHandle stream, PoolHandle pool, bool holds_pool_ref);
  std::shared_ptr<detail::GoneGraphs> gone_graphs = std::make_shared<detail::GoneGraphs>();
  // Streams seen valid (checked the first time each is used, then
  // remembered until the runtime reports it destroyed), each with its device
  // (kAnyDevice where the runtime cannot tell: MemoryRuntime::stream_device),
  // the last one used, and the runtime's reports of destroyed streams.
  absl::flat_hash_map<StreamHandle, int> known_streams;
  StreamHandle last_known_stream = kDefaultStream;
  int last_known_device = kAnyDevice;
  // The stream checked before the last one: two streams taking turns (a
  // compute and a copy stream, or two threads) stay on the quick paths.
  StreamHandle previous_known_stream = kDefaultStream;
  int previous_known_device = kAnyDevice;
  // The default stream or one of the last two checked: known without a
  // lookup.
  bool recent_stream(StreamHandle stream) const {
    return stream == kDefaultStream || stream == last_known_stream ||
           stream == previous_known_stream;
  }
  // recent_stream, and usable for an allocation on `device` (its device is
  // that one, or unknown): the steady-state allocation's test.
  bool recent_stream_on(StreamHandle stream, int device) const {
    return stream == kDefaultStream ||
           (stream == last_known_stream &&
            (last_known_device == device || last_known_device == kAnyDevice)) ||
           (stream == previous_known_stream &&
            (previous_known_device == device || previous_known_device == kAnyDevice));
  }
  // Makes a known stream the last one checked.
  void note_recent(StreamHandle stream, int stream_device) {
    if (stream == last_known_stream) return;
    previous_known_stream = last_known_stream;
    previous_known_device = last_known_device;
    last_known_stream = stream;
    last_known_device = stream_device;
  }
  // The device a known stream runs on, kAnyDevice when the runtime could not
  // tell or the stream is not known (the default stream runs on every one).
  int device_of_stream(StreamHandle stream) const {
    if (stream == kDefaultStream) return kAnyDevice;
    auto it = known_streams.find(stream);
    return it == known_streams.end() ? kAnyDevice : it->second;
  }
  // OK when an allocation for `device` may use `stream` (a known stream, or
  // the default one): the default stream, or a stream of that device, or of
  // a device the runtime cannot tell. Else kInvalidArgument: such a block's
  // segment would be owned by a stream that cannot order its reuse, and the
  // event of a later free could not be recorded on it.
  absl::Status check_stream_device(StreamHandle stream, int device, std::string_view call) const;
  std::shared_ptr<detail::GoneStreams> gone_streams = std::make_shared<detail::GoneStreams>();
  bool unwatchable_logged = false;
  // The retention audit and the event trace (allocator/observation.hpp,
  // audit.cpp): `observer` is null until one is first turned on, then
  // `observation` for the allocator's life. Last, so that the trace is
  // closed before the rest goes.
  std::uint64_t latest_checkpoint = 0;
  bool has_checkpoint = false;
  detail::AllocatorObserver* observer = nullptr;
  std::unique_ptr<detail::Observation> observation;
  // The observation, made and installed on first use. Requires mu.
  detail::Observation& observe();
  // Applies AllocatorOptions::record_stacks and trace_path (audit.cpp).
  absl::Status start_observing(const AllocatorOptions& options);

  ~Impl();

  // allocator.cpp
  // Allocator::allocate; `cache_tried`: the caller tried allocate_cached
  // already (the torch entry points), so the steady-state path is skipped.
  absl::StatusOr<void*> allocate(std::size_t bytes, int device, StreamHandle stream,
                                 const AllocOptions& request, bool cache_tried);
  // steady_state.hpp (inline; include it where these are called).
  // The free of a block of a device's default pool (into its quick cache,
  // or merged into its free index when the cache holds its share or the
  // block is too large for it), when none of the conditions the general
  // path handles holds (capture blocks, blocks used on other streams, owned
  // blocks, a listener that must hear of the free, reports from other
  // threads).
  // False: nothing changed; Impl::deallocate decides everything anew.
  // free_cached takes the lock (the torch entry points' way in);
  // free_cached_locked requires mu and the block's slot in the pointer
  // table, with no runtime report waiting (Impl::deallocate's).
  bool free_cached(void* ptr, int device, StreamHandle stream);
  bool free_cached_locked(std::size_t slot, int device);
  // The steady-state allocation: a transient, untagged, ownerless request
  // on the default stream or the last stream used, outside captures, with
  // nothing pending, that the device's default pool serves from what it
  // holds (its quick cache, else its free index). nullptr: nothing changed
  // (a new segment is needed, or a condition fails); take the general path.
  // allocate_cached asks the runtime about captures and takes the lock (the
  // torch entry points' way in); allocate_cached_locked requires mu and a
  // request known to be outside captures (allocate()'s).
  void* allocate_cached(std::size_t bytes, int device, StreamHandle stream);
  void* allocate_cached_locked(std::size_t bytes, std::size_t rounded, int device,
                               StreamHandle stream);
  // Tells the observer of `block`, just taken from `pool` and entered in the
  // pointer table (`peaks`: the pool's before the take). If the observer
  // throws, the block goes back as if never handed out and the exception
  // propagates. Out of line: the steady-state path calls it only when an
  // observer is set.
  [[gnu::noinline]] void observe_allocation(detail::Pool& pool, detail::Block* block,
                                            const detail::Pool::AllocationPeaks& peaks);
  // Returns a block the caller never saw: out of the pointer table, back
  // into `pool` with its counters and peaks as before the take; `observed`:
  // the observer heard of it and now hears of the free.
  void undo_allocation(detail::Pool& pool, detail::Block* block,
                       const detail::Pool::AllocationPeaks& peaks, bool observed) noexcept;
  absl::Status check_device(int device) const;
  absl::StatusOr<void*> reserve_relaxed(int device, std::size_t bytes);
  // True when `stream` is capturing (or its state cannot be read).
  bool runtime_capturing(int device, StreamHandle stream) const;
  absl::StatusOr<detail::Block*> take_new_segment(detail::Pool& pool, int device,
                                                  StreamHandle stream, std::size_t rounded,
                                                  std::size_t requested);
  absl::Status refuse_persistent(int device, StreamHandle stream, std::size_t bytes,
                                 std::string_view tag, const detail::CaptureContext& ctx);
  // `slot`: the block's slot in the pointer table (unchanged since it was
  // found), or BlockTable::kNoSlot to look it up again.
  absl::Status free_block(detail::Block* block, std::size_t slot);
  // OK when `stream` is a stream of the runtime (checked the first time, then
  // remembered) and, for an allocation on `device` (not kAnyDevice), runs on
  // that device (check_stream_device); else kInvalidArgument naming `call`,
  // the last streams checked left as they were. Requires mu. Inline: the
  // default stream and the last streams used cost a comparison or two.
  absl::Status check_stream(StreamHandle stream, std::string_view call,
                            int device = kAnyDevice) {
    // Reports first, for the default stream as well: its requests are the
    // ones to adopt a destroyed stream's segments.
    if (gone_streams->any.load(std::memory_order_acquire)) apply_gone_streams();
    if (stream == kDefaultStream) return absl::OkStatus();
    if (device == kAnyDevice ? stream == last_known_stream || stream == previous_known_stream
                             : recent_stream_on(stream, device)) {
      return absl::OkStatus();
    }
    return remember_stream(stream, call, device);
  }
  // check_stream past the last streams checked.
  absl::Status remember_stream(StreamHandle stream, std::string_view call, int device);
  // The steady-state allocation's check of a stream that is not
  // recent_stream_on(stream, device): whether it is known and usable on
  // `device` (then it becomes the last one checked, as check_stream would
  // make it). Out of line, off the one- and two-stream
  // path. Without it a workload cycling through three or more streams
  // (compute, copy, communication) took the general path at every
  // allocation (small-block churn over four streams: 802 instructions a
  // pair, 598 with this, 455 on one stream). Requires mu. A
  // destruction reported but not yet applied may leave the stream the last
  // one checked for a moment: the caller then declines (gone_streams), and
  // apply_gone_streams forgets it there too.
  // A hit in seen_streams skips known_streams (every entry of the table is
  // one of the set's, with its device: forget_known_stream).
  [[gnu::noinline]] bool recall_known_stream(StreamHandle stream, int device) {
    SeenStream& seen = seen_streams[seen_stream_slot(stream)];
    if (seen.stream != stream) {
      auto it = known_streams.find(stream);
      if (it == known_streams.end()) return false;
      seen = {stream, it->second};
    }
    if (seen.device != device && seen.device != kAnyDevice) return false;
    note_recent(stream, seen.device);
    return true;
  }
  // Known streams found before, by a hash of the handle: a small table in
  // front of known_streams, so that streams beyond the last two checked
  // (three or more taking turns) mostly skip the hash-table lookup. An
  // empty slot holds the default stream, which is never looked up here (it
  // is always known) and never entered. forget_known_stream clears a slot.
  struct SeenStream {
    StreamHandle stream = kDefaultStream;
    int device = kAnyDevice;
  };
  static constexpr int kSeenStreamBits = 3;
  static std::size_t seen_stream_slot(StreamHandle stream) {
    return detail::fibonacci_slot(static_cast<std::uint64_t>(stream), 64 - kSeenStreamBits);
  }
  SeenStream seen_streams[std::size_t{1} << kSeenStreamBits];
  // Whether `stream` is known: the default stream always is; any other
  // through the table, then known_streams.
  bool is_known_stream(StreamHandle stream) const {
    return stream == kDefaultStream || seen_streams[seen_stream_slot(stream)].stream == stream ||
           known_streams.contains(stream);
  }
  // The one way out of known_streams (the table holds only what it holds).
  // The stream's shards are retired first.
  void forget_known_stream(StreamHandle stream) {
    if (!shards.empty()) retire_shards_of(stream);
    known_streams.erase(stream);
    if (SeenStream& seen = seen_streams[seen_stream_slot(stream)]; seen.stream == stream) {
      seen = SeenStream{};
    }
  }
  // What the runtime reported from other threads (graphs gone, streams
  // destroyed), applied; one atomic load each when there is nothing.
  // Requires mu.
  void apply_runtime_reports() {
    if (gone_graphs->any.load(std::memory_order_acquire)) apply_gone_graphs();
    if (gone_streams->any.load(std::memory_order_acquire)) apply_gone_streams();
  }
  // Forgets the streams the runtime reported destroyed: their record_stream
  // uses (their work has run); their segments become orphans, and an
  // unreferenced graph pool's fully free ones are given back. Requires mu.
  void apply_gone_streams();
  // deallocate() (`as_owner` null) and deallocate_owned() (the owner's
  // name; a pointer, not a std::optional passed by value, whose copy read
  // eight bytes just after its one-byte flag was stored: a stalled
  // store-to-load forward on every free); `try_cache`: the steady-state
  // free first (deallocate(); not the torch entry points, which tried
  // free_cached already).
  absl::Status deallocate(void* ptr, int device, const std::string_view* as_owner,
                          bool try_cache);
  absl::StatusOr<EventHandle> acquire_event(int device);
  // Records an event on each stream in the block's used_on, dropping the
  // streams destroyed meanwhile (pending_events counts those recorded).
  absl::Status record_free_events(detail::Block* block);
  // A pending free whose streams are done: back to its pool (a graph pool
  // now unused goes).
  void finish_free(detail::Block* block);
  void process_pending();
  void notify(BlockEvent::Kind kind, const detail::Block& block, CaptureId capture,
              std::size_t position, std::uintptr_t graph);
  BlockInfo info_of(const detail::Block& b) const {
    const detail::Segment& segment = *b.segment;
    return BlockInfo{.ptr = b.ptr(),
                     .size = b.size,
                     .requested = b.requested,
                     .device = segment.device,
                     .stream = segment.stream,
                     .state = b.state,
                     .lifetime = b.lifetime,
                     .tag = detail::interned(b.tag_id),
                     .sequence = b.sequence,
                     .pool = segment.pool->handle(),
                     .capture = b.capture,
                     .capture_position = b.capture_position};
  }
  // The event the listener hears of `block` (allocator.cpp: every member
  // named once, see there).
  BlockEvent event_of(BlockEvent::Kind kind, const detail::Block& block, CaptureId capture,
                      std::size_t position, std::uintptr_t graph) const;
  AllocatorStats device_stats(int device) const;

  // graph_pools.cpp
  absl::StatusOr<detail::Pool*> find_graph_pool(PoolHandle handle) const;
  // The pool, if the caller still holds a handle to it (else an error that
  // names `call`): a pool whose handles are all released takes no new user.
  absl::StatusOr<detail::Pool*> find_handle_pool(PoolHandle handle, std::string_view call) const;
  // The pool a capture's allocations go to. Inline for the allocations of
  // one capture, which find the route found last; route_for_slow looks it
  // up, or makes a private pool for a capture nobody announced. nullptr,
  // changing nothing, when the capture's route goes to another device's
  // pool: an allocation for device 0 in a capture routed to a pool of
  // device 1 would reserve on one device and count on the other.
  detail::Pool* route_for(int device, CaptureId capture, StreamHandle stream) {
    if (capture == last_route_capture) {
      return last_route_pool->device() == device ? last_route_pool : nullptr;
    }
    return route_for_slow(device, capture, stream);
  }
  detail::Pool* route_for_slow(int device, CaptureId capture, StreamHandle stream);
  // The id of an active capture on `device` other than through `stream`'s
  // own, or 0; ends routes of discovered captures that are over.
  CaptureId active_capture_on(int device);
  void drop_route(CaptureId capture);
  // Releases the pool references of graphs reported gone. Requires mu.
  void apply_gone_graphs();
  // Destroys a graph pool that has no reference and no block in use left
  // (its segments released), or marks it kept_for_segments. The test is
  // inline: free_block asks at every free into a graph pool, which mostly
  // leaves blocks in use.
  void maybe_destroy_pool(detail::Pool* pool) {
    if (pool->blocks_in_use() == 0 && pool->is_graph_pool() && !pool->referenced()) {
      destroy_unused_pool(pool);
    }
  }
  // maybe_destroy_pool past its test.
  void destroy_unused_pool(detail::Pool* pool);
  // Returns fully free segments of the pools that may give memory back (the
  // default pool, graph pools without references).
  absl::Status release_free_segments(int device);
  // With `only_stream`, just the segments that stream owns; with
  // `only_class`, just those of that size class.
  absl::Status release_segments(int device, detail::Pool& pool,
                                std::optional<StreamHandle> only_stream = std::nullopt,
                                std::optional<detail::SizeClass> only_class = std::nullopt);
  bool events_allowed(int device) const { return devices[device].routes == 0; }

  // stream_shards.cpp
  // GeneralLock's halves. fold_shards takes every shard's lock and folds
  // its deltas into its pool. deal_shards decides which shards may serve,
  // deals out the room below each pool's peaks among those that may, fresh
  // sequence numbers where a batch ran out or a checkpoint passed it, and
  // spare blocks, then releases the shards' locks.
  void fold_shards() noexcept;
  void deal_shards() noexcept;
  // Gives (device, stream) a shard of the device's default pool when the
  // key's slot is free and a shard can be had (else the stream keeps the
  // one-lock path). Requires mu and a stream known usable on `device`.
  void maybe_make_shard(int device, StreamHandle stream) noexcept;
  // The shards of `stream` (on any device) stop serving it: their blocks'
  // entries move to the pointer table, and the shards become free for
  // reuse. Requires mu.
  void retire_shards_of(StreamHandle stream);
  // The allocated block at `addr`, from the pointer table or a shard's, or
  // null. Requires mu.
  detail::Block* find_live(std::uintptr_t addr) const;
  // The slot in the pointer table of the allocated block at `addr`, its
  // entry moved there from a shard's table if that is where it was;
  // BlockTable::kNoSlot when neither holds it. Requires mu.
  std::size_t live_slot(std::uintptr_t addr) {
    const std::size_t slot = live.find_slot(addr);
    return slot != detail::BlockTable::kNoSlot || shards.empty() ? slot : adopt_from_shard(addr);
  }
  // live_slot past the pointer table.
  std::size_t adopt_from_shard(std::uintptr_t addr);
  // The shards' invariants (CheckInvariants; requires mu, so that every
  // shard is folded): no delta left; a shard in use is found through its
  // key's slot, serves its device's default pool, and its table holds only
  // allocated blocks of its stream's segments there, none also in the
  // pointer table; a shard not in use holds no block.
  absl::Status check_shards() const;
  // How many blocks are allocated, and each of them (the pointer table's
  // and the shards'). Require mu.
  std::size_t live_count() const;
  template <typename F>
  void for_each_live(F&& visit) const {
    live.for_each(visit);
    for (const auto& shard : shards) shard->live.for_each(visit);
  }
  // steady_state.hpp (inline). The shard of (device, stream), or null; its
  // key is checked again under its lock (it may have been reused).
  detail::StreamShard* shard_for(int device, StreamHandle stream) const {
    return shard_slots.find(device, stream);
  }
  // The steady-state allocation and free in a shard, under its lock:
  // nullptr or false, nothing changed, when the shard cannot serve (the
  // general path then decides).
  void* allocate_in_shard(detail::StreamShard& shard, int device, StreamHandle stream,
                          std::size_t bytes, std::size_t rounded);
  bool free_in_shard(detail::StreamShard& shard, std::uintptr_t addr, int device);
  // free_in_shard in `first` (when not null), then in every other shard
  // made: a free that names no stream (Allocator::deallocate)
  // of a block another stream's shard handed out (two streams taking turns
  // on one thread, a block freed by another thread than its allocator's).
  bool free_in_any_shard(std::uintptr_t addr, int device, detail::StreamShard* first);

  // allocator_checks.cpp
  detail::Block* find_block_containing(std::uintptr_t addr) const;
  absl::Status diagnose_unknown(const void* ptr, std::string_view call) const;
};

}  // namespace capalloc

#endif  // CAPALLOC_ALLOCATOR_ALLOCATOR_IMPL_HPP_
