// host_runtime.hpp: the host runtime, the reference model of CUDA stream,
// event and graph-capture semantics that runs without a GPU (DESIGN.md §3,
// §11).
//
// It owns the emulated devices' segments (anonymous mappings, counted against
// a per-device limit), one StreamWorker per stream (handle 0, the default
// stream, exists from construction), events, the captures in progress and the
// executable graphs. Invariants:
//   - every registry below is guarded by `mu_`; an event's generations by its
//     own mutex; a stream's queue by its worker. `published_` is written
//     under `mu_` and read without it (capture_info); Lock order: mu_, then an
//     event's or a worker's mutex. No caller blocks (drain, event wait) while
//     holding mu_, and workers never take mu_, so a kernel body may call back
//     into the runtime;
//   - a stream is either outside any capture (its work is enqueued and runs)
//     or a member of exactly one capture not yet ended (its work is appended
//     to that capture's node list and does not run);
//   - a stream published in `published_` is published as it is: every change
//     to its capture membership, or to its capture's status or node count,
//     is published before mu_ is released;
//   - a graph's node list is immutable once end_capture has built it, and is
//     shared with replays in flight, so destroy_graph never pulls it from
//     under a worker;
//   - an enqueued operation holds its arguments by value and is destroyed as
//     soon as it has run; only graphs keep recorded operations.
#ifndef CAPALLOC_RUNTIME_HOST_RUNTIME_HPP_
#define CAPALLOC_RUNTIME_HOST_RUNTIME_HPP_

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <variant>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_format.h"
#include "common/futex_mutex.hpp"
#include "common/guarded.hpp"
#include "runtime/published_capture_states.hpp"
#include "runtime/stream_watchers.hpp"
#include "runtime/stream_worker.hpp"
#include "capalloc/runtime.hpp"

namespace capalloc::detail {

// The operations a stream runs and a graph records. Kernels are kept whole
// (name, declared spans, body) because graph_writes reports their writes.
struct MemsetNode {
  void* dst = nullptr;
  int value = 0;
  std::size_t bytes = 0;
};
struct MemcpyNode {
  void* dst = nullptr;
  const void* src = nullptr;
  std::size_t bytes = 0;
};
using GraphNode = std::variant<KernelLaunch, MemsetNode, MemcpyNode>;
// A captured graph: its nodes in capture order (position = index) and, per
// node, the nodes it directly depends on (positions, each smaller than its
// own).
struct GraphNodes {
  std::vector<GraphNode> ops;
  GraphDependencies depends_on;
  std::size_t size() const { return ops.size(); }
};

// Runs one node on the calling (worker) thread. May throw whatever a kernel
// body throws; the worker reports it.
void run_graph_node(const GraphNode& node);
// "kernel <name>", "memset" or "memcpy": how failures and writes name a node.
std::string graph_node_label(const GraphNode& node);

// For each stream of a capture, how many of that stream's nodes are known to
// come before some point (a vector clock). It is how end_capture tells whether
// every joined stream's work was joined back into the origin stream, directly
// or through other joined streams.
using CaptureFrontier = absl::flat_hash_map<StreamHandle, std::size_t>;

struct CaptureMember {
  std::size_t own_nodes = 0;  // nodes this stream recorded into the capture
  CaptureFrontier depends_on;  // what its next node comes after
  // The nodes (positions) its next node will directly depend on: CUDA's
  // capture dependencies of the stream.
  std::vector<std::size_t> dependencies;
};

// Calls its function when destroyed: what watch_capture_graph attaches to a
// capture, handed to its graph, and released with the graph's node list
// (after the last replay in flight).
struct LifetimeToken {
  std::function<void()> on_gone;
  explicit LifetimeToken(std::function<void()> f) : on_gone(std::move(f)) {}
  LifetimeToken(const LifetimeToken&) = delete;
  LifetimeToken& operator=(const LifetimeToken&) = delete;
  ~LifetimeToken() {
    if (on_gone) on_gone();
  }
};

// What a graph holds besides its nodes: the tokens watching it, and the
// graphs launched into its capture (inlined, so it keeps theirs alive too).
struct GraphKeepAlive {
  std::vector<std::shared_ptr<LifetimeToken>> tokens;
  std::vector<std::shared_ptr<const GraphNodes>> children;
};

struct CaptureState {
  CaptureId id = 0;
  CaptureMode mode = CaptureMode::kGlobal;
  StreamHandle origin = kDefaultStream;
  std::thread::id capturing_thread;
  CaptureStatus status = CaptureStatus::kActive;
  std::string invalidated_by;  // the call that invalidated it
  std::string invalidation_reason;
  GraphNodes nodes;  // capture order; position of a node = its index, with its edges
  GraphKeepAlive keep_alive;  // handed to the graph, or released if none is made
  absl::flat_hash_map<StreamHandle, CaptureMember> members;  // origin included
  // The devices of its member streams, each counted once in
  // HostRuntime::active_captures_ until the capture ends: a stream of
  // another device that joins the capture (CUDA captures may span devices)
  // makes any_capture_active true for its device too.
  std::vector<int> devices;
};

struct EventState {
  explicit EventState(int dev) : device(dev) {}
  const int device;
  // Guarded by HostRuntime::mu_. Nonzero while the latest record was made on
  // a capturing stream: the event then marks a point of that capture's graph.
  CaptureId capture_id = 0;
  CaptureFrontier capture_point;
  std::vector<std::size_t> capture_dependencies;  // the recording stream's, then
  // Guarded by `mu`. A record on a running stream bumps `recorded`; the
  // marker it enqueues raises `completed` when the worker reaches it.
  std::mutex mu;
  std::condition_variable completed_cv;
  std::uint64_t recorded = 0;
  std::uint64_t completed = 0;
};

struct StreamState {
  StreamState(int dev, std::string label) : device(dev), worker(std::move(label)) {}
  const int device;
  StreamWorker worker;
  std::shared_ptr<CaptureState> capture;  // guarded by HostRuntime::mu_
};

class HostRuntime final : public DeviceRuntime {
 public:
  // Validates the options (device_count >= 1, a nonzero limit) and starts the
  // default stream's worker.
  static absl::StatusOr<std::shared_ptr<HostRuntime>> create(const HostRuntimeOptions& options);

  explicit HostRuntime(const HostRuntimeOptions& options);  // use create()
  // Runs all queued work, joins every worker, unmaps every segment.
  ~HostRuntime() override;

  HostRuntime(const HostRuntime&) = delete;
  HostRuntime& operator=(const HostRuntime&) = delete;

  RuntimeKind kind() const override { return RuntimeKind::kHost; }
  int device_count() const override;
  absl::StatusOr<DeviceMemoryInfo> memory_info(int device) const override;

  absl::StatusOr<void*> reserve(int device, std::size_t bytes) override;
  absl::Status release(int device, void* ptr, std::size_t bytes) override;
  CaptureMode exchange_thread_capture_mode(CaptureMode mode) override;

  absl::StatusOr<StreamHandle> create_stream(int device) override;
  absl::StatusOr<int> stream_device(StreamHandle stream) override;
  absl::Status destroy_stream(StreamHandle stream) override;
  void watch_stream_destruction(std::function<bool(StreamHandle)> on_destroyed) override {
    stream_watchers_.add(std::move(on_destroyed));
  }
  absl::Status synchronize_stream(StreamHandle stream) override;

  absl::StatusOr<EventHandle> create_event(int device) override;
  absl::Status destroy_event(EventHandle event) override;
  absl::Status record_event(EventHandle event, StreamHandle stream) override;
  absl::StatusOr<bool> query_event(EventHandle event) override;
  absl::Status synchronize_event(EventHandle event) override;
  absl::Status stream_wait_event(StreamHandle stream, EventHandle event) override;

  absl::Status launch_kernel(StreamHandle stream, KernelLaunch kernel) override;
  absl::Status memset_async(void* dst, int value, std::size_t bytes, StreamHandle stream) override;
  absl::Status memcpy_async(void* dst, const void* src, std::size_t bytes,
                            StreamHandle stream) override;

  absl::StatusOr<CaptureId> begin_capture(StreamHandle stream, CaptureMode mode) override;
  absl::StatusOr<GraphHandle> end_capture(StreamHandle stream) override;
  absl::StatusOr<CaptureInfo> capture_info(StreamHandle stream) override;
  bool any_capture_active(int device) const override;
  absl::Status launch_graph(GraphHandle graph, StreamHandle stream) override;
  absl::Status watch_capture_graph(StreamHandle stream, std::function<void()> on_gone) override;
  absl::Status destroy_graph(GraphHandle graph) override;
  absl::StatusOr<std::vector<GraphWrite>> graph_writes(GraphHandle graph) override;
  absl::StatusOr<GraphDependencies> graph_dependencies(GraphHandle graph) override;
  absl::StatusOr<std::vector<GraphWrite>> captured_graph_writes(std::uintptr_t graph) override;
  absl::StatusOr<GraphDependencies> captured_graph_dependencies(std::uintptr_t graph) override;

 private:
  struct DeviceSegments {
    std::size_t reserved_bytes = 0;  // page-rounded, what counts against the limit
    absl::flat_hash_map<void*, std::size_t> requested_bytes;  // by segment base
  };

  // check_device reads only constants, submit and capture_info_locked take
  // mu_ themselves; every other helper requires mu_ held.
  absl::Status check_device(int device, std::string_view call) const;
  absl::StatusOr<std::shared_ptr<StreamState>> find_stream(StreamHandle stream,
                                                          std::string_view call) const;
  absl::StatusOr<std::shared_ptr<EventState>> find_event(EventHandle event,
                                                         std::string_view call) const;
  // The capture an event marks a point of, if that capture has not ended.
  std::shared_ptr<CaptureState> live_capture_of(const EventState& event) const;
  // Marks the capture invalidated (keeping the first cause) and returns the
  // error to hand back to the caller of the illegal operation.
  absl::Status invalidate(CaptureState& capture, std::string by, std::string_view reason);
  // The error for work submitted to a stream whose capture is invalidated.
  static absl::Status invalidated_error(const CaptureState& capture, StreamHandle stream);
  // The graph's node order for one replay (options_.replay_order, or
  // capture order), checked against its edges.
  absl::StatusOr<std::vector<std::size_t>> replay_order(const GraphNodes& graph) const;
  // The node list a CaptureInfo::graph names (a capture id): a copy of the
  // capture's nodes so far, or the graph it made.
  absl::StatusOr<std::shared_ptr<const GraphNodes>> captured_graph(std::uintptr_t graph,
                                                                   std::string_view call) const;
  // Records the node into the stream's capture, or enqueues it to run.
  absl::Status submit(StreamHandle stream, GraphNode node);
  // capture_info for a stream not published in `published_`; takes mu_
  // itself.
  [[gnu::noinline]] absl::StatusOr<CaptureInfo> capture_info_locked(StreamHandle stream);
  // Counts `device` in active_captures_ for `capture`, once (its first member
  // stream there). Requires mu_.
  void count_capture_device(CaptureState& capture, int device);
  // Publishes what capture_info now answers for every member stream of the
  // capture (its status and next position): after any change to either,
  // and after a stream joins it.
  void publish(const CaptureState& capture);

  const HostRuntimeOptions options_;
  const std::size_t page_bytes_;

  // A futex mutex: pthread's lock and unlock cost some 50 instructions a
  // pair more than one atomic operation each. Never waited on with a
  // condition variable (no caller blocks holding it). capture_info, which the
  // allocator asks at every allocation and free during a capture, reads
  // `published_` instead and takes it only for streams not published there.
  mutable FutexMutex mu_;
  // Each stream's capture state as capture_info answers it, written under
  // mu_ by every call that changes it, read without mu_.
  PublishedCaptureStates published_;
  std::vector<DeviceSegments> devices_;
  absl::flat_hash_map<StreamHandle, std::shared_ptr<StreamState>> streams_;
  absl::flat_hash_map<EventHandle, std::shared_ptr<EventState>> events_;
  absl::flat_hash_map<CaptureId, std::shared_ptr<CaptureState>> captures_;  // not yet ended
  absl::flat_hash_map<GraphHandle, std::shared_ptr<const GraphNodes>> graphs_;
  // The graph each ended capture made, while it exists, both ways.
  absl::flat_hash_map<CaptureId, GraphHandle> graph_of_capture_;
  absl::flat_hash_map<GraphHandle, CaptureId> capture_of_graph_;
  // Captures begun and not yet ended, per device of their origin stream; read
  // without mu_ on the allocator's hot path.
  std::unique_ptr<std::atomic<int>[]> active_captures_;
  StreamHandle next_stream_ = 1;
  StreamWatchers stream_watchers_;
  EventHandle next_event_ = 1;
  GraphHandle next_graph_ = 1;
};

}  // namespace capalloc::detail

#endif  // CAPALLOC_RUNTIME_HOST_RUNTIME_HPP_
