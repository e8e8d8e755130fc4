// hip_runtime.cpp: the `hip` DeviceRuntime, GpuRuntime<HipApi>: the shared GPU
// implementation (gpu_runtime.hpp, gpu_runtime_impl.hpp, gpu_graph_impl.hpp)
// over the HIP runtime API (hip_api.hpp), plus what HIP does its own way, as
// HipApi's backend hooks.
//
// Plain C++ compiled by the host compiler with __HIP_PLATFORM_AMD__ (the HIP
// runtime API header needs no hipcc), linked against libamdhip64. Written
// against HIP 5.2 (Debian's), whose graph API has what the shared code needs
// except a kernel's parameter layout: kernel nodes not launched through this
// runtime cannot be inspected, so a graph holding such nodes gets no inspected
// record and the tracker falls back to footprint writes. HIP 5.2 also gives
// no parameters of 1D and symbol copy nodes (what hipMemcpyAsync captures
// into); they count as unreadable writers.
#include <hip/hip_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "capalloc/runtime.hpp"
#include "runtime/gpu_graph_impl.hpp"
#include "runtime/gpu_runtime.hpp"
#include "runtime/gpu_runtime_impl.hpp"
#include "runtime/gpu_runtimes.hpp"
#include "runtime/hip_api.hpp"
#include "runtime/plugins.hpp"

namespace capalloc::detail {

// --- HipApi's backend hooks ---------------------------------------------------------

hipError_t HipApi::query_capture(hipStream_t stream, bool with_dependencies,
                                 NativeCapture<HipApi>& out) {
  const hipGraphNode_t* dependencies = nullptr;
  std::size_t count = 0;
  const hipError_t e = with_dependencies
                           ? hipStreamGetCaptureInfo_v2(stream, &out.status, &out.id, &out.graph,
                                                        &dependencies, &count)
                           : hipStreamGetCaptureInfo_v2(stream, &out.status, &out.id, &out.graph);
  if (e == hipSuccess && dependencies != nullptr) {
    // Valid only until the next call on the stream: copy now.
    out.dependencies.assign(dependencies, dependencies + count);
  }
  return e;
}

hipError_t HipApi::graph_edges(hipGraph_t graph,
                               std::vector<std::pair<hipGraphNode_t, hipGraphNode_t>>& out) {
  std::size_t count = 0;
  if (const hipError_t e = hipGraphGetEdges(graph, nullptr, nullptr, &count); e != hipSuccess) {
    return e;
  }
  std::vector<hipGraphNode_t> from(count), to(count);
  if (count != 0) {
    if (const hipError_t e = hipGraphGetEdges(graph, from.data(), to.data(), &count);
        e != hipSuccess) {
      return e;
    }
  }
  out.clear();
  for (std::size_t i = 0; i < count && i < from.size(); ++i) out.emplace_back(from[i], to[i]);
  return hipSuccess;
}

GpuNodeKind HipApi::classify_node(hipGraphNodeType type) {
  switch (type) {
    case hipGraphNodeTypeKernel:
      return GpuNodeKind::kKernel;
    case hipGraphNodeTypeMemset:
      return GpuNodeKind::kMemset;
    case hipGraphNodeTypeMemcpy:
      return GpuNodeKind::kMemcpy;
    case hipGraphNodeTypeGraph:
      return GpuNodeKind::kChildGraph;
    // Known to write no device memory: host functions, no-ops, events.
    case hipGraphNodeTypeHost:
    case hipGraphNodeTypeEmpty:
    case hipGraphNodeTypeWaitEvent:
    case hipGraphNodeTypeEventRecord:
      return GpuNodeKind::kNoDeviceWrite;
    // Copies this runtime does not read (1D, to and from symbols), and any
    // type a newer HIP adds: they may write, so the graph falls back to
    // footprint writes.
    default:
      return GpuNodeKind::kOpaqueWriter;
  }
}

absl::Status HipApi::read_kernel_pointer_params(hipGraphNode_t, std::vector<std::uintptr_t>&) {
  return absl::UnimplementedError(
      "kernel parameters cannot be inspected: HIP gives no kernel parameter layout");
}

// --- The runtime and its factory ---------------------------------------------------

template class GpuRuntime<HipApi>;

absl::StatusOr<std::shared_ptr<DeviceRuntime>> make_hip_runtime() {
  return make_gpu_runtime<HipApi>();
}

}  // namespace capalloc::detail

// The backend plugin's entry point (runtime/plugins.hpp): how libcapalloc
// finds this runtime.
extern "C" __attribute__((visibility("default"))) const capalloc::detail::BackendEntry*
CAPALLOC_BACKEND_ENTRY() {
  static const capalloc::detail::BackendEntry entry{
      capalloc::detail::kBackendAbiVersion, CAPALLOC_VERSION, capalloc::RuntimeKind::kHip,
      &capalloc::detail::make_hip_runtime};
  return &entry;
}
