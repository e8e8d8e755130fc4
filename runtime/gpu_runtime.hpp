// gpu_runtime.hpp: GpuRuntime<Api>, the GPU DeviceRuntime, written once for
// CUDA and HIP (DESIGN.md §3) over an API traits type (gpu_api.hpp: CudaApi in
// cuda_api.hpp, HipApi in hip_api.hpp). Its members are defined in
// gpu_runtime_impl.hpp (devices, segments, streams, events, work) and
// gpu_graph_impl.hpp (kernel launches, capture, graphs, write records, the
// factory; the graph walk in gpu_graph_scan.hpp); cuda_runtime.cpp and hip_runtime.cpp include both and instantiate
// the class once each. Nothing here names a native type: the traits do.
//
// Invariants:
//   - every handle is the native one cast to an integer; kDefaultStream (0)
//     is the legacy default stream of the calling thread's current device. A
//     stream or event handed in by the host application is used as is: the
//     runtime keeps no registry of streams or events, so it never refuses a
//     foreign handle and never leaks one;
//   - a call that takes a device makes it current for the call only and
//     restores the caller's current device (DeviceScope): a host application
//     (PyTorch) must not see its current device change under it;
//   - every native failure is reported with the call, its arguments and the
//     native error name, and the thread's last-error slot is cleared, so that
//     a later launch that checks GetLastError (the split-K kernel does) does
//     not inherit an error already reported here;
//   - `mu_` guards declared_ and graphs_ and is never held across a native
//     call that can block (synchronize, launch) or across a device body;
//   - no exception crosses the DeviceRuntime interface (guarded()).
#ifndef CAPALLOC_RUNTIME_GPU_RUNTIME_HPP_
#define CAPALLOC_RUNTIME_GPU_RUNTIME_HPP_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "capalloc/runtime.hpp"
#include "runtime/gpu_api.hpp"
#include "runtime/stream_watchers.hpp"

namespace capalloc::detail {

template <class Api>
class GpuRuntime final : public DeviceRuntime {
 public:
  explicit GpuRuntime(int device_count) : device_count_(device_count) {}
  // Destroys the graphs still held; streams and events belong to whoever
  // created them.
  ~GpuRuntime() override = default;

  GpuRuntime(const GpuRuntime&) = delete;
  GpuRuntime& operator=(const GpuRuntime&) = delete;

  RuntimeKind kind() const override { return Api::kKind; }
  int device_count() const override { return device_count_; }
  absl::StatusOr<DeviceMemoryInfo> memory_info(int device) const override;

  absl::StatusOr<void*> reserve(int device, std::size_t bytes) override;
  absl::Status release(int device, void* ptr, std::size_t bytes) override;
  CaptureMode exchange_thread_capture_mode(CaptureMode mode) override;

  absl::StatusOr<StreamHandle> create_stream(int device) override;
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
  absl::StatusOr<int> stream_device(StreamHandle stream) override;
  // Always true: captures begun through the native API (PyTorch's) are
  // invisible here, so the allocator must ask capture_info per allocation.
  bool any_capture_active(int) const override { return true; }
  absl::Status launch_graph(GraphHandle graph, StreamHandle stream) override;
  absl::Status destroy_graph(GraphHandle graph) override;
  absl::StatusOr<std::vector<GraphWrite>> graph_writes(GraphHandle graph) override;
  absl::StatusOr<GraphDependencies> graph_dependencies(GraphHandle graph) override;
  absl::StatusOr<std::vector<GraphWrite>> captured_graph_writes(std::uintptr_t graph) override;
  absl::StatusOr<GraphDependencies> captured_graph_dependencies(std::uintptr_t graph) override;
  absl::Status watch_capture_graph(StreamHandle stream, std::function<void()> on_gone) override;

 private:
  using NativeStream = typename Api::Stream;
  using NativeGraph = typename Api::Graph;
  using NativeGraphExec = typename Api::GraphExec;
  using NativeGraphNode = typename Api::GraphNode;

  // What the kernels launched through this runtime into one capture declared:
  // their writes, at the capture position of each launch, and the kernel
  // nodes those launches made, whose parameters need no inspection.
  struct DeclaredWrites {
    std::vector<GraphWrite> writes;
    absl::flat_hash_set<NativeGraphNode> covered;
  };

  // An executable graph and its declared writes. Shared with graph_writes
  // calls in flight; the last owner destroys the native objects.
  struct Graph {
    NativeGraph graph = nullptr;
    NativeGraphExec exec = nullptr;
    DeclaredWrites declared;

    Graph() = default;
    Graph(const Graph&) = delete;
    Graph& operator=(const Graph&) = delete;
    ~Graph() { destroy().IgnoreError(); }
    absl::Status destroy();  // idempotent
  };

  absl::Status check_device(int device, std::string_view call) const;
  std::shared_ptr<Graph> find_graph(GraphHandle graph) const;
  // After a device body ran on a capturing stream: files its declared writes
  // under the capture and notes the kernel nodes it made.
  void note_captured_launch(NativeStream stream, const NativeCapture<Api>& before,
                            std::size_t position, const KernelLaunch& kernel);

  const int device_count_;
  StreamWatchers stream_watchers_;
  mutable std::mutex mu_;
  // Captures that had kernels launched through this runtime and have not
  // been ended through end_capture, by capture id.
  absl::flat_hash_map<CaptureId, DeclaredWrites> declared_;
  absl::flat_hash_map<GraphHandle, std::shared_ptr<Graph>> graphs_;
  GraphHandle next_graph_ = 1;
};

}  // namespace capalloc::detail

#endif  // CAPALLOC_RUNTIME_GPU_RUNTIME_HPP_
