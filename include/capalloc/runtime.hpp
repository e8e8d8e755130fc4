// capalloc/runtime.hpp: the two seams between capalloc and a device.
//
// `MemoryRuntime` is everything the allocator needs of a device: segments of
// device memory, streams, events, and whether a stream is capturing (and when
// a capture's graph is gone). `DeviceRuntime` extends it with what the
// capture tracker, the GEMM and the scenarios need: kernel launches, copies,
// stream capture into graphs, replay, and the graph model (accesses and
// edges) the alias rule reads. An allocator works over any MemoryRuntime; a
// CaptureTracker needs its allocator's runtime to be a DeviceRuntime.
//
// Three DeviceRuntimes exist: `host` (always in libcapalloc; device memory is
// host memory and each stream is a worker thread, the reference model of
// CUDA graph semantics), `cuda` and `hip` (backend libraries loaded at run
// time, see make_runtime below).
//
// Example:
//
//   auto rt = capalloc::make_runtime("host").value();
//   auto s = rt->create_stream(0).value();
//   void* seg = rt->reserve(0, 2 << 20).value();
//   capalloc::KernelLaunch k{.name = "fill", .writes = {{seg, 64}},
//                            .host_body = [seg] { std::memset(seg, 1, 64); }};
//   rt->launch_kernel(s, k).IgnoreError();
//   rt->synchronize_stream(s).IgnoreError();
//
// Errors come back as absl::Status values; no implementation throws across
// these interfaces. Every method is thread-safe unless its comment says
// otherwise. Handles are plain integers so that a native handle handed in by
// a host application (a cudaStream_t) needs no registration step.
#ifndef CAPALLOC_RUNTIME_HPP_
#define CAPALLOC_RUNTIME_HPP_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "capalloc/export.h"

namespace capalloc {

// Which runtime a DeviceRuntime is. Device code is chosen by this, never by
// comparing names.
enum class RuntimeKind { kHost, kCuda, kHip };

// "host", "cuda" or "hip".
constexpr std::string_view runtime_kind_name(RuntimeKind kind) {
  switch (kind) {
    case RuntimeKind::kCuda:
      return "cuda";
    case RuntimeKind::kHip:
      return "hip";
    case RuntimeKind::kHost:
      break;
  }
  return "host";
}

// A stream. 0 is the default (legacy) stream; other values are opaque
// handles, for the cuda/hip runtimes the native cudaStream_t/hipStream_t.
using StreamHandle = std::uintptr_t;
inline constexpr StreamHandle kDefaultStream = 0;
// The stream the allocator reports for a block or segment whose stream was
// destroyed: the segment is an orphan, owned by no stream, until a stream
// that needs a new segment adopts it (docs/design.md, "Stream lifetimes").
// Never a real stream: CUDA and HIP hand a destroyed stream's handle to the
// next stream created, and that stream owns nothing of the old one's.
inline constexpr StreamHandle kNoStream = ~StreamHandle{0};

// An event (native cudaEvent_t/hipEvent_t on GPU runtimes).
using EventHandle = std::uintptr_t;

// An executable graph produced by end_capture.
using GraphHandle = std::uint64_t;

// Unique within the process, as CUDA's capture ids are. 0 means "none".
using CaptureId = std::uint64_t;

// A byte range of device memory.
struct MemorySpan {
  const void* ptr = nullptr;
  std::size_t bytes = 0;

  std::uintptr_t begin() const { return reinterpret_cast<std::uintptr_t>(ptr); }
  std::uintptr_t end() const { return begin() + bytes; }
  bool overlaps(const MemorySpan& o) const {
    return bytes != 0 && o.bytes != 0 && begin() < o.end() && o.begin() < end();
  }
};

enum class CaptureStatus { kNone, kActive, kInvalidated };

// CUDA's stream capture modes. In kGlobal mode an unsafe call (a plain device
// allocation) from any thread invalidates the capture; kThreadLocal only from
// the capturing thread; kRelaxed never. The allocator reserves segments with
// the calling thread switched to kRelaxed, as PyTorch does.
enum class CaptureMode { kGlobal, kThreadLocal, kRelaxed };

struct CaptureInfo {
  CaptureStatus status = CaptureStatus::kNone;
  CaptureId id = 0;
  // Number of operations (graph nodes) recorded into the capture so far: the
  // capture position of whatever the caller does next.
  std::size_t position = 0;
  // The graph the capture is building (CUDA's cudaGraph_t from
  // cudaStreamGetCaptureInfo), valid until that graph is destroyed, which for
  // a capture ended natively may be right after its end (PyTorch destroys it
  // once instantiated). 0 when not capturing.
  std::uintptr_t graph = 0;
};

// How a write in a graph is known.
enum class WriteEvidence {
  kDeclared,   // the kernel's launch named the span it writes; memset/memcpy
               // destinations are declared by construction
  kInspected,  // read back from a graph node's parameters (cuda runtime)
  kFootprint,  // inferred from what was allocated during the capture
};

// How a graph node uses a span of memory during one replay.
enum class AccessMode {
  kRead,       // reads it, never writes it
  kWrite,      // writes the whole span before anything in the same replay reads
               // it: outputs and scratch (the split-K workspace)
  kReadWrite,  // reads it, then writes it: an in-place update
  kState,      // reads it before writing it and expects what it wrote in one
               // replay to be there at the next (the split-K semaphore)
  kTouch,      // uses it in a way the evidence does not say (a pointer found in
               // a kernel's parameters): may read it, may write it
};

// One access of a graph: the span, the node that makes it and its position.
// Despite the name, kRead entries are listed too (graph_writes below); only
// kWrite, kReadWrite and kState entries change memory.
struct GraphWrite {
  MemorySpan span;
  std::size_t position = 0;  // node index in capture order
  std::string op;            // kernel name, "memset" or "memcpy"
  WriteEvidence evidence = WriteEvidence::kDeclared;
  AccessMode mode = AccessMode::kWrite;
};

// The order a graph's replays respect: node i (by position, the index
// GraphWrite::position uses) directly depends on the nodes of(i), each
// earlier in capture order. A replay runs a node after every node it
// depends on; two nodes that no path of these edges orders may run in either
// order, or at once. Edges that order nothing (CUDA's programmatic edges) are
// left out.
//
// The lists lie end to end in one array (compressed rows): listing a graph's
// edges costs two allocations, not one per node. Edges are not checked here
// (GraphOrder checks them where it builds an order from them).
class GraphDependencies {
 public:
  GraphDependencies() = default;
  // From one list per node: lists[i] are the nodes node i depends on.
  static GraphDependencies from_lists(const std::vector<std::vector<std::size_t>>& lists) {
    GraphDependencies out;
    out.ends_.reserve(lists.size());
    for (const auto& list : lists) out.add_node(list);
    return out;
  }
  // Appends the next node, depending on `nodes` (kept in the order given).
  void add_node(absl::Span<const std::size_t> nodes) {
    edges_.insert(edges_.end(), nodes.begin(), nodes.end());
    ends_.push_back(edges_.size());
  }
  void reserve(std::size_t nodes, std::size_t edges) {
    ends_.reserve(nodes);
    edges_.reserve(edges);
  }
  std::size_t size() const { return ends_.size(); }
  bool empty() const { return ends_.empty(); }
  std::size_t edge_count() const { return edges_.size(); }
  // The nodes `node` depends on; node < size().
  absl::Span<const std::size_t> of(std::size_t node) const {
    const std::size_t begin = node == 0 ? 0 : ends_[node - 1];
    return {edges_.data() + begin, ends_[node] - begin};
  }
  // One list per node (for tests and tools; queries use of()).
  std::vector<std::vector<std::size_t>> lists() const {
    std::vector<std::vector<std::size_t>> out;
    out.reserve(size());
    for (std::size_t i = 0; i < size(); ++i) out.emplace_back(of(i).begin(), of(i).end());
    return out;
  }
  friend bool operator==(const GraphDependencies& a, const GraphDependencies& b) {
    return a.ends_ == b.ends_ && a.edges_ == b.edges_;
  }

 private:
  std::vector<std::size_t> ends_;   // node i's edges end at ends_[i]
  std::vector<std::size_t> edges_;  // every node's list, end to end
};

// A kernel launch. The host runtime runs `host_body` on the stream's worker;
// GPU runtimes call `device_body` with the native stream so that the caller
// enqueues its own kernel there. `reads`, `writes`, `updates` and `state`
// declare the spans the kernel touches and how (AccessMode kRead, kWrite,
// kReadWrite, kState): the host runtime records them into graphs as declared
// accesses; GPU runtimes keep them as declared evidence too.
//
// The runtime keeps the KernelLaunch (by value) until the operation has run;
// a graph keeps it until the graph is destroyed, exactly as CUDA keeps
// kernel arguments by value.
struct KernelLaunch {
  std::string name{};
  // The kernel's parameter buffer, as CUDA keeps kernelParams: each parameter
  // by value at its natural alignment, pointers as 8-byte words, structs with
  // their fields. The host runtime inspects it as CUDA's parameters are
  // inspected (every 8-byte-aligned word that points into a block is a touch
  // of that block) for kernels that declare no access.
  std::vector<std::byte> params{};
  std::vector<MemorySpan> reads{};
  std::vector<MemorySpan> writes{};   // written whole before read: outputs, scratch
  std::vector<MemorySpan> updates{};  // read, then written in place
  std::vector<MemorySpan> state{};    // read first, and must persist between launches
  std::function<void()> host_body{};
  // Called with the runtime's kind (kCuda, kHip) and its native stream.
  std::function<absl::Status(RuntimeKind runtime, void* native_stream)> device_body{};
};

struct DeviceMemoryInfo {
  std::size_t free_bytes = 0;
  std::size_t total_bytes = 0;
};

// The memory and stream seam: what the allocator needs.
class CAPALLOC_API MemoryRuntime {
 public:
  virtual ~MemoryRuntime() = default;

  virtual RuntimeKind kind() const = 0;
  // "host", "cuda" or "hip": runtime_kind_name(kind()).
  std::string_view name() const { return runtime_kind_name(kind()); }
  virtual int device_count() const = 0;
  virtual absl::StatusOr<DeviceMemoryInfo> memory_info(int device) const = 0;

  // --- Segments -------------------------------------------------------------
  // Reserves `bytes` of device memory on `device`, aligned to at least 4 KiB.
  // Fails with kResourceExhausted when the device cannot supply it. During a
  // kGlobal-mode capture, a reservation from a thread not in kRelaxed mode
  // invalidates the capture (as cudaMalloc does).
  virtual absl::StatusOr<void*> reserve(int device, std::size_t bytes) = 0;
  // Returns a segment obtained from reserve(), with the same size.
  virtual absl::Status release(int device, void* ptr, std::size_t bytes) = 0;
  // Sets the calling thread's capture-interaction mode; returns the old one.
  virtual CaptureMode exchange_thread_capture_mode(CaptureMode mode) = 0;

  // --- Streams and events ---------------------------------------------------
  virtual absl::StatusOr<StreamHandle> create_stream(int device) = 0;
  // The device `stream` runs on: kNotFound for a stream the runtime does not
  // know, kUnimplemented where the runtime cannot tell (HIP before 6.0),
  // and the caller then assumes the device the call names. Not asked for
  // kDefaultStream, which every device has. The allocator asks once per
  // stream, the first time a call names it: an allocation for one device
  // on another device's stream is refused, and the event that holds a
  // block freed after record_stream back until a stream's work is done is
  // made on that stream's device, as PyTorch's allocator makes it.
  virtual absl::StatusOr<int> stream_device(StreamHandle stream) {
    (void)stream;
    return absl::UnimplementedError("stream_device: this runtime cannot tell a stream's device");
  }
  // Waits for the stream's work, then destroys it.
  virtual absl::Status destroy_stream(StreamHandle stream) = 0;
  // Calls `on_destroyed(stream)` for each stream that destroy_stream
  // destroys, once its work has run and before its handle can be handed to
  // another stream (on CUDA and HIP, before the native destroy, which frees
  // the handle for reuse), from the destroying thread and outside the
  // runtime's locks, until it returns false. The allocator forgets the
  // stream then (its record_stream uses; its segments become orphans). A
  // stream destroyed behind the runtime's back (cudaStreamDestroy on a
  // handle a host application made) is not seen.
  virtual void watch_stream_destruction(std::function<bool(StreamHandle)> on_destroyed) = 0;
  // Blocks until all work enqueued on the stream has run. Illegal while the
  // stream is capturing: invalidates the capture and returns an error.
  virtual absl::Status synchronize_stream(StreamHandle stream) = 0;

  virtual absl::StatusOr<EventHandle> create_event(int device) = 0;
  virtual absl::Status destroy_event(EventHandle event) = 0;
  // Marks the current end of `stream`'s queue. On a capturing stream the
  // event marks a point of the graph instead (used to fork and join streams).
  virtual absl::Status record_event(EventHandle event, StreamHandle stream) = 0;
  // True when the work marked by the event's latest record has run (true for
  // an event never recorded). Illegal for an event recorded during a capture
  // that is still active: invalidates it and returns an error.
  virtual absl::StatusOr<bool> query_event(EventHandle event) = 0;
  virtual absl::Status synchronize_event(EventHandle event) = 0;
  // Makes later work on `stream` wait for the event. If the event was recorded
  // on a capturing stream, `stream` joins that capture.
  virtual absl::Status stream_wait_event(StreamHandle stream, EventHandle event) = 0;

  // --- Capture state ----------------------------------------------------------
  virtual absl::StatusOr<CaptureInfo> capture_info(StreamHandle stream) = 0;
  // A cheap hint for the allocator's hot path: false only when no capture can
  // be active on any stream of `device`. The host runtime knows exactly; a GPU
  // runtime, which cannot see captures begun through the native API, may
  // answer true and leave the allocator to ask capture_info per stream.
  virtual bool any_capture_active(int device) const = 0;

  // Calls `on_gone` once, from any thread, when the graph being captured on
  // `stream` is gone: the capture failed (no graph was made), or the graph
  // and every executable graph made from it were destroyed. This is how
  // capalloc learns the lifetime of graphs it did not capture (PyTorch's).
  // `on_gone` must only note the fact: it may run inside the runtime (CUDA's
  // user-object destructor, the host runtime's lock), where no runtime or
  // capalloc call may be made. Errors: kFailedPrecondition when `stream` is
  // not in an active capture; kUnimplemented where the runtime cannot tell
  // (HIP 5.2 has no user objects).
  virtual absl::Status watch_capture_graph(StreamHandle stream, std::function<void()> on_gone) {
    (void)stream;
    (void)on_gone;
    return absl::UnimplementedError("watch_capture_graph: this runtime cannot tell when a graph is gone");
  }
};

// The graph and launch seam: what the capture tracker, the GEMM and the
// scenarios need on top of memory and streams.
class CAPALLOC_API DeviceRuntime : public MemoryRuntime {
 public:
  // --- Work -----------------------------------------------------------------
  virtual absl::Status launch_kernel(StreamHandle stream, KernelLaunch kernel) = 0;
  virtual absl::Status memset_async(void* dst, int value, std::size_t bytes,
                                    StreamHandle stream) = 0;
  // Copies between any two of device and host memory.
  virtual absl::Status memcpy_async(void* dst, const void* src, std::size_t bytes,
                                    StreamHandle stream) = 0;

  // --- Capture and graphs ---------------------------------------------------
  virtual absl::StatusOr<CaptureId> begin_capture(StreamHandle stream, CaptureMode mode) = 0;
  // Ends the capture begun on `stream` and returns an executable graph. Fails
  // (and returns no graph) if the capture was invalidated or a joined stream
  // did not join back to the origin stream.
  virtual absl::StatusOr<GraphHandle> end_capture(StreamHandle stream) = 0;
  // Enqueues one replay of the graph on `stream`: its operations in capture
  // order, against the addresses they were captured with.
  virtual absl::Status launch_graph(GraphHandle graph, StreamHandle stream) = 0;
  virtual absl::Status destroy_graph(GraphHandle graph) = 0;
  // The accesses the graph's replays make (writes, and the reads it knows
  // of), as far as this runtime can tell.
  virtual absl::StatusOr<std::vector<GraphWrite>> graph_writes(GraphHandle graph) = 0;

  // The accesses and edges of the graph a capture built, named by
  // CaptureInfo::graph: what inspection of a natively ended capture can see
  // before its graph is destroyed (PyTorch's capture-end hook). The caller
  // must know that graph still exists (CUDA cannot tell a destroyed one).
  // Errors: kNotFound where the runtime can tell; kUnimplemented where it
  // cannot inspect graphs it did not capture.
  virtual absl::StatusOr<std::vector<GraphWrite>> captured_graph_writes(std::uintptr_t graph) {
    (void)graph;
    return absl::UnimplementedError("captured_graph_writes: not available on this runtime");
  }
  virtual absl::StatusOr<GraphDependencies> captured_graph_dependencies(std::uintptr_t graph) {
    (void)graph;
    return absl::UnimplementedError("captured_graph_dependencies: not available on this runtime");
  }

  // The graph's nodes and the edges between them, as the runtime's graph has
  // them (not the order of capture). kUnimplemented where the runtime cannot
  // tell; the tracker then takes capture order as the only order.
  virtual absl::StatusOr<GraphDependencies> graph_dependencies(GraphHandle graph) {
    (void)graph;
    return absl::UnimplementedError("graph_dependencies: this runtime cannot list a graph's edges");
  }
};

// Options of the host runtime.
struct HostRuntimeOptions {
  int device_count = 1;
  // Bytes each emulated device can reserve in all; reservations beyond it fail
  // with kResourceExhausted. Memory is mapped lazily, so a large limit costs
  // nothing until it is used.
  std::size_t memory_limit_per_device = std::size_t{16} << 30;
  // The order in which a replay runs a graph's nodes. Given each node's
  // dependencies (GraphDependencies), it returns the node
  // positions in the order to run them, which must respect every edge. Unset:
  // capture order. It lets a test try every order a GPU may choose (the
  // differential oracle does); it is called under the runtime's lock, once
  // per launch_graph, and must not call the runtime. An order that is not a
  // permutation respecting the edges makes launch_graph fail with
  // kInvalidArgument and run nothing.
  std::function<std::vector<std::size_t>(const GraphDependencies& dependencies)> replay_order{};
};

CAPALLOC_API absl::StatusOr<std::shared_ptr<DeviceRuntime>> make_host_runtime(
    const HostRuntimeOptions& options = {});

// Creates a runtime by name: "host", "cuda", "hip" or "auto".
//
// The host runtime is part of libcapalloc. The cuda and hip runtimes (and the
// GEMM's device code) are backend libraries, libcapalloc_backend_cuda.so and
// libcapalloc_backend_hip.so, each linked against its own toolkit's runtime
// only, loaded on first use from the directories in CAPALLOC_BACKEND_PATH
// (colon-separated) when it is set, else from the directory that holds
// libcapalloc.so (where the install puts them).
//
// "cuda" or "hip": kUnavailable when the backend library is not found, fails
// to load (its toolkit runtime is missing), or finds no device; the message
// says which, and where it looked. "auto": cuda, then hip, the first whose
// backend loads and finds a device; otherwise host, with one info log line
// saying why each GPU runtime was passed over. Anything else:
// kInvalidArgument.
CAPALLOC_API absl::StatusOr<std::shared_ptr<DeviceRuntime>> make_runtime(std::string_view kind);

// capalloc's log level: trace, debug, info, warn (the default: findings and
// errors only), error or off. CAPALLOC_LOG_LEVEL sets it at start-up.
CAPALLOC_API absl::Status set_log_level(std::string_view level);

// The level CAPALLOC_LOG_LEVEL names ("warn" when unset or empty); an invalid
// value is kInvalidArgument naming the variable, the value and the levels,
// as for every CAPALLOC_* variable (README, configuration). The C ABI's
// process-wide allocator fails to start on it, as on an invalid
// AllocatorOptions::from_env(); the logger, which cannot fail, keeps "warn"
// and logs the same message as an error when it starts.
CAPALLOC_API absl::StatusOr<std::string> log_level_from_env();

}  // namespace capalloc

#endif  // CAPALLOC_RUNTIME_HPP_
