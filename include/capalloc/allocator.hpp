// capalloc/allocator.hpp: the pooled, stream-ordered device allocator.
//
// An Allocator carves blocks out of segments it reserves from a
// DeviceRuntime. Each device has a default pool; a block belongs to the stream
// it was allocated on and is reusable on that stream as soon as it is freed.
// A block also used on other streams (record_stream) becomes reusable only
// after events recorded on those streams at free time have completed; the
// caller is never blocked for that.
//
// Example:
//
//   auto rt = capalloc::make_runtime("host").value();
//   auto alloc = capalloc::Allocator::create(rt).value();
//   void* p = alloc->allocate(1 << 20, /*device=*/0, stream).value();
//   alloc->record_stream(p, other_stream).IgnoreError();
//   alloc->deallocate(p).IgnoreError();
//
// Thread safety: every method may be called from any thread concurrently.
// Errors: fallible calls return absl::Status / absl::StatusOr; a call that
// fails changes no state. Nothing here throws.
#ifndef CAPALLOC_ALLOCATOR_HPP_
#define CAPALLOC_ALLOCATOR_HPP_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "capalloc/audit.hpp"
#include "capalloc/export.h"
#include "capalloc/runtime.hpp"

namespace capalloc {

namespace detail {
struct AllocatorAccess;  // the library's own way in (allocator/allocator_access.hpp)
}  // namespace detail

// How long a block must live. Persistent blocks must outlive every graph
// replay unchanged (workspaces, semaphores, caches).
enum class Lifetime { kTransient, kPersistent };

// A pool of device memory that receives the allocations of graph captures.
// Several captures may share one (as vLLM shares one across batch sizes).
// 0 names no graph pool: the device's default pool.
using PoolHandle = std::uint64_t;
inline constexpr PoolHandle kDefaultPool = 0;

// Where a persistent request is refused: while any capture is active on the
// device (the default: a capture on another stream may still allocate into
// the pool the block would come from), or only while the requesting stream
// itself is capturing.
enum class CaptureGuardScope { kDevice, kStream };

struct CAPALLOC_API AllocatorOptions {
  // Sizes round up to a multiple of this; a power of two, at least 256, that
  // divides both segment sizes (so at most 2 MiB with the defaults). Block
  // addresses are aligned to it as well.
  std::size_t round_granularity = 512;
  // Requests up to this size are served from small segments.
  std::size_t small_request_limit = std::size_t{1} << 20;
  std::size_t small_segment_bytes = std::size_t{2} << 20;
  // Requests up to this size share large segments of `large_segment_bytes`;
  // bigger ones ("oversize") get a segment of their own (rounded to 2 MiB).
  // When an oversize request finds no cached block and the pool's cached
  // free bytes exceed 1/10 of what it reserves, the stream's fully free
  // oversize segments are released before a new one is reserved (outside
  // captures). docs/performance.md has what these sizes and that rule give
  // against PyTorch's (10 MiB / 20 MiB, nothing released until out of
  // memory).
  std::size_t medium_request_limit = std::size_t{2} << 20;
  std::size_t large_segment_bytes = std::size_t{4} << 20;
  CaptureGuardScope capture_guard_scope = CaptureGuardScope::kDevice;
  // Record each allocation's call stack for the retention audit
  // (Allocator::set_record_stacks); CAPALLOC_STACKS=1.
  bool record_stacks = false;
  // The event trace (docs/trace.md) from the start; empty: none. CAPALLOC_TRACE. A file
  // that cannot be created: create() logs it once, the allocator runs untraced.
  std::string trace_path;

  // Reads CAPALLOC_ROUND_GRANULARITY (bytes: a power of two from 256 to 2 MiB)
  // CAPALLOC_CAPTURE_GUARD_SCOPE (device|stream), CAPALLOC_STACKS (0|1) and
  // CAPALLOC_TRACE (a file path) over the defaults. An
  // unset or empty variable keeps the default; an invalid value is
  // kInvalidArgument naming the variable, the value and what is accepted
  // (the policy of every CAPALLOC_* variable: README, configuration).
  static absl::StatusOr<AllocatorOptions> from_env();
};

// Per-call options of allocate().
struct AllocOptions {
  Lifetime lifetime = Lifetime::kTransient;
  // A short label shown in stats, snapshots and findings ("kv_cache",
  // "splitk.workspace"). Interned; empty costs nothing.
  std::string_view tag = {};
  // Who must free the block, as the call that does it (PersistentCache sets
  // "PersistentCache::release(0, \"ws\")"); empty: whoever holds the
  // pointer. deallocate() refuses an owned block with kFailedPrecondition,
  // naming this call; only deallocate_owned() with the same owner frees it.
  std::string_view owner = {};
};

// A current value and its high-water mark.
struct StatCounter {
  std::int64_t current = 0;
  std::int64_t peak = 0;
};

struct AllocatorStats {
  // The sizes of live blocks: each request rounded up to the granularity,
  // or up to 1/4 more when the request reused a cached free block that
  // much larger (allocator/quick_cache.hpp). Whole blocks, as PyTorch's
  // allocated_bytes counts them.
  StatCounter allocated_bytes;
  StatCounter requested_bytes;  // sizes callers asked for, of live blocks
  StatCounter reserved_bytes;   // bytes of segments held from the runtime
  StatCounter segments;
  StatCounter allocated_blocks;
  std::int64_t free_blocks = 0;          // cached free blocks
  std::int64_t pending_free_blocks = 0;  // freed, waiting on other streams' events
  std::uint64_t allocations = 0;         // successful allocate() calls
  std::uint64_t frees = 0;               // successful deallocate() calls
  std::uint64_t retries = 0;             // allocations retried after releasing cache
  std::uint64_t ooms = 0;                // allocations that failed out of memory
};

enum class BlockState { kAllocated, kFree, kPendingFree };

// A copy of what the allocator knows about one block.
struct BlockInfo {
  const void* ptr = nullptr;
  std::size_t size = 0;       // rounded size
  std::size_t requested = 0;  // size asked for
  int device = 0;
  StreamHandle stream = kDefaultStream;  // its segment's stream (kNoStream: an orphan's)
  BlockState state = BlockState::kAllocated;
  Lifetime lifetime = Lifetime::kTransient;
  // The block's tag, viewing capalloc's process-wide table of interned tags:
  // valid for the life of the process.
  std::string_view tag;
  std::uint64_t sequence = 0;  // allocation sequence number, 1-based, per allocator
  PoolHandle pool = kDefaultPool;
  CaptureId capture = 0;         // the capture it was allocated in (0: none)
  std::size_t capture_position = 0;  // capture position of the allocation

  MemorySpan span() const { return {ptr, size}; }
};

// A copy of one segment (one reservation from the runtime) and the blocks
// that tile it: allocated, free and pending-free, in address order.
struct SegmentInfo {
  const void* base = nullptr;
  std::size_t size = 0;
  int device = 0;
  StreamHandle stream = kDefaultStream;  // the stream owning the segment (kNoStream: none)
  PoolHandle pool = kDefaultPool;
  std::vector<BlockInfo> blocks;
};

// What the allocator tells a CaptureListener.
struct BlockEvent {
  enum class Kind { kAllocate, kFree };
  Kind kind = Kind::kAllocate;
  BlockInfo block;
  // The capture the block's stream is in at the event (0: none), and the
  // capture position at which the event happens.
  CaptureId capture = 0;
  std::size_t position = 0;
  // The graph that capture is building (CaptureInfo::graph; 0: none).
  std::uintptr_t capture_graph = 0;
};

// Observes allocations made on capturing streams, frees made while a capture
// is routed to a graph pool on the device, and every free of a block that was
// allocated during a capture (nothing else: outside captures, blocks
// allocated outside captures cost the listener nothing). Called with the
// allocator's lock held: it must not call the allocator.
class CAPALLOC_API CaptureListener {
 public:
  virtual ~CaptureListener() = default;
  virtual void on_block_event(const BlockEvent& event) = 0;
  // The graph of a capture the allocator found by itself (not announced with
  // begin_allocate_to_pool) is gone: the capture failed, or the graph and its
  // executable graphs were destroyed (DeviceRuntime::watch_capture_graph).
  virtual void on_capture_graph_gone(CaptureId capture) { (void)capture; }
  // end_allocate_to_pool(capture) ended the capture's route: the capture-end
  // hook of a host application that captures natively (PyTorch calls it
  // right after ending the capture, before it destroys the graph), when the
  // graph can still be inspected. Called without the allocator's lock: the
  // listener may call the allocator and the runtime.
  virtual void on_capture_pool_end(CaptureId capture) { (void)capture; }
  // True when a live graph's record reads or writes part of `span` on
  // `device`: empty_cache, the out-of-memory retry and the release of a graph
  // pool then keep that memory mapped until the graph is destroyed (a replay
  // would touch unmapped memory). Called with the allocator's lock held.
  virtual bool graph_uses(int device, MemorySpan span) const {
    (void)device;
    (void)span;
    return false;
  }
};

class CAPALLOC_API Allocator {
 public:
  // Creates an allocator over `runtime`: the memory and stream seam is all it
  // needs. Fails on invalid options.
  static absl::StatusOr<std::unique_ptr<Allocator>> create(
      std::shared_ptr<MemoryRuntime> runtime, AllocatorOptions options = {});

  ~Allocator();
  Allocator(const Allocator&) = delete;
  Allocator& operator=(const Allocator&) = delete;

  // Allocates at least `bytes` on `device` for use on `stream`. On a stream
  // that is capturing, the block comes from the capture's graph pool.
  // Errors: kInvalidArgument for size 0, a size that overflows rounding, or
  // an unknown device; kFailedPrecondition for a persistent request while a
  // capture is active (see CaptureGuardScope; the message names the tag, the
  // capture and the fix); kResourceExhausted when the device is out of memory
  // after the cache was released and the request retried once (the message
  // states the request, device, reserved and allocated bytes).
  // Cost: O(1) expected in steady state (a hash lookup, a bitmap search, at
  // most one split); no heap allocation once the pools are warm.
  absl::StatusOr<void*> allocate(std::size_t bytes, int device = 0,
                                 StreamHandle stream = kDefaultStream, AllocOptions options = {});

  // Frees a block returned by allocate(). `device` (if not kAnyDevice) must
  // be the block's device. Errors: kNotFound for a pointer capalloc never
  // returned, kFailedPrecondition for a double free, kInvalidArgument for a
  // pointer into the middle of a block or the wrong device.
  // kFailedPrecondition, changing nothing, for a block with an owner
  // (AllocOptions::owner): the message names the call that releases it.
  static constexpr int kAnyDevice = -1;
  absl::Status deallocate(void* ptr, int device = kAnyDevice);
  // Frees a block allocated with AllocOptions::owner == `owner`: the owner's
  // own release path. kPermissionDenied, changing nothing, when the block has
  // another owner or none.
  absl::Status deallocate_owned(void* ptr, std::string_view owner);

  // Notes that the block is used on `stream` too: when freed, it becomes
  // reusable only after the work enqueued on `stream` up to the free has run.
  absl::Status record_stream(void* ptr, StreamHandle stream);

  // Returns fully free, cached segments of `device` (or of every device for
  // kAnyDevice) to the runtime. Pending frees whose events have completed are
  // processed first; those still waiting stay, and their events are not
  // waited for. Giving memory back waits for the device where the runtime's
  // release does: cudaFree and hipFree wait for all work on the device, and
  // the host runtime models that, so empty_cache takes as long as the
  // device's queued work (PyTorch's empty_cache does the same). The segments
  // of a destroyed stream ("orphans") are kept: the default pool's for other
  // streams to reuse, until this call or an out-of-memory retry gives them
  // back. A graph pool's are never reused (a graph may still write there):
  // this call gives them back once no graph and no capture holds the pool
  // (a pool held by its handle alone included, when a CaptureTracker
  // listens: without one, a handle may stand for graphs that replay into
  // the pool, and its segments stay until it is released), and a pool that
  // nothing references at all gives them back as soon as the allocator
  // applies the stream's report (in its next call), unless a capture is
  // routed on the device. No other release happens inside an allocator
  // call.
  absl::Status empty_cache(int device = kAnyDevice);

  // --- Graph pools and capture routing ---------------------------------------
  // A graph pool's references have owners, counted apart: the caller's
  // handles, each capture route into the pool, and each graph that may
  // replay into it. Nobody can give up a reference someone else owns: a
  // release beyond the handles the caller holds is an error that changes
  // nothing, and a capture or graph keeps the pool alive after its handles
  // are gone. A pool with no reference left and no live block is destroyed
  // and its segments go back to the runtime.
  //
  // Creates an empty graph pool on `device`, with one handle reference for
  // the caller.
  absl::StatusOr<PoolHandle> create_graph_pool(int device);
  // Takes / gives up one handle reference. kNotFound for a pool that does not
  // exist; kFailedPrecondition, changing nothing, once every handle
  // reference was released (the pool may live on for its graphs, but takes
  // no new capture: create a new one).
  absl::Status retain_graph_pool(PoolHandle pool);
  absl::Status release_graph_pool(PoolHandle pool);
  // The reference of the graph captured as `capture`, which may replay into
  // `pool` (a CaptureTracker takes one per graph and drops it when the graph
  // is destroyed). One per capture: kAlreadyExists for a second; the pool
  // must still have a handle reference (kFailedPrecondition otherwise).
  // drop_graph_pool_hold gives it up: kNotFound, changing nothing, when the
  // capture holds none. Where the runtime watches the capture's graph
  // (DeviceRuntime::watch_capture_graph) and has not reported it gone, the
  // reference stays until it does: a graph launched into another capture
  // lives on in that capture's graph after its own handle is destroyed, and
  // its replays still write the pool.
  absl::Status hold_graph_pool(PoolHandle pool, CaptureId capture);
  absl::Status drop_graph_pool_hold(PoolHandle pool, CaptureId capture);
  // From now on, allocations on streams in capture `capture` (on `device`)
  // come from `pool`, which the route holds a reference on (PyTorch's
  // beginAllocateToPool); the caller must hold a handle to it. A capture
  // nobody announced gets a private pool on
  // its first allocation, kept for the life of the allocator since nobody will
  // say when its graph is gone. `stream`, when given, is a stream in the
  // capture, already under way: its graph is then watched from now
  // (DeviceRuntime::watch_capture_graph) rather than from its first
  // allocation, so that a graph hold on the pool lasts as long as the graph
  // even when the capture allocates nothing (drop_graph_pool_hold).
  absl::Status begin_allocate_to_pool(int device, CaptureId capture, PoolHandle pool,
                                      StreamHandle stream = kDefaultStream);
  // Ends the route and drops its reference: the capture-end hook, called
  // after the capture has ended (kFailedPrecondition, changing nothing, while
  // a stream seen allocating in it is still capturing it). When no capture
  // is left on the device, frees deferred during captures get their events
  // recorded.
  absl::Status end_allocate_to_pool(CaptureId capture);
  absl::StatusOr<AllocatorStats> pool_stats(PoolHandle pool) const;

  // The listener for allocations and frees during captures (nullptr: none).
  // The listener must outlive its registration. kAlreadyExists if another
  // listener is registered (one CaptureTracker per allocator).
  absl::Status set_capture_listener(CaptureListener* listener);
  // Applies the graph destructions the runtime has reported since the last
  // call, for captures this allocator found by itself: each such capture's
  // pool gives up the reference its graph held (the pool goes back to the
  // device once its blocks are freed), and the listener is told. allocate,
  // deallocate and empty_cache do this too; a CaptureTracker calls it before
  // each check. Where the runtime cannot watch graphs (HIP 5.2), such pools
  // are kept for the life of the allocator.
  void apply_graph_lifetimes();

  // --- Inspection ---------------------------------------------------------------
  // Sums over the device's default and graph pools.
  absl::StatusOr<AllocatorStats> stats(int device) const;
  // The block containing `ptr` (allocated, free or pending-free).
  absl::StatusOr<BlockInfo> block_info(const void* ptr) const;
  // Every allocated block of `device` overlapping one of `spans`, in address
  // order, each once. O(blocks of the segments the spans touch + spans).
  std::vector<BlockInfo> live_blocks(int device, std::vector<MemorySpan> spans) const;
  // Every segment of `device` (default and graph pools), in address order,
  // each with every block tiling it; empty for an unknown device. A copy
  // taken under the lock: O(blocks), for snapshots and reports, not the hot
  // path.
  std::vector<SegmentInfo> segments(int device) const;

  // Verifies the allocator's invariants on every device: live blocks never
  // overlap, blocks tile their segments exactly, no two free physical
  // neighbours are left unmerged, every free block is in the free index
  // exactly once, the pointer table holds exactly the live blocks, and the
  // stats equal the sums recomputed from the block table. O(blocks).
  absl::Status CheckInvariants() const;

  // One paragraph: the runtime, options and per-device stats.
  std::string describe() const;

  MemoryRuntime& runtime() const;
  // The same runtime's graph and launch seam, for the capture tracker, the
  // GEMM and callers that launch work; null when the runtime the allocator
  // was created over has only the memory seam.
  DeviceRuntime* device_runtime() const;
  const AllocatorOptions& options() const;

  // --- Retention audit (capalloc/audit.hpp) and event trace (docs/trace.md) ---
  // Records the call stack of each allocation from now on (off: no longer).
  // Cost with stacks: one unwind (absl::GetStackTrace) and one interning
  // lookup per allocation, under the allocator's lock; symbolized only when
  // reported. README, "Retention audit", gives the measured cost.
  void set_record_stacks(bool record);
  bool record_stacks() const;
  // The allocation order now; also remembered as the latest checkpoint (the
  // snapshot's audit section lists the live blocks allocated since it).
  AuditCheckpoint checkpoint();
  // The latest checkpoint(), if any was taken.
  bool latest_checkpoint(AuditCheckpoint* out) const;
  // The blocks allocated after `since` and still allocated (not freed, not
  // pending free), grouped by tag and site, most bytes first. O(live blocks).
  LiveSince live_since(AuditCheckpoint since) const;

  // Starts the event trace: every alloc, free and record_stream from now on,
  // the live blocks first (as allocs), and the capture events of a
  // CaptureTracker over this allocator, appended to `path` as JSON Lines.
  // Buffered: the hot path appends a fixed-size record, a writer thread
  // formats and writes. kFailedPrecondition when a trace is running;
  // kInvalidArgument when the file cannot be created (a path another trace
  // of this process writes gets a suffix: trace_path() says which).
  absl::Status start_trace(std::string_view path);
  // Writes what is buffered and closes the file. kFailedPrecondition when
  // no trace runs; kDataLoss when writing failed.
  absl::Status stop_trace();
  // The file the running trace writes ("" when none).
  std::string trace_path() const;

 private:
  friend struct detail::AllocatorAccess;
  struct Impl;
  explicit Allocator(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace capalloc

#endif  // CAPALLOC_ALLOCATOR_HPP_
