// hip_runtime.cpp: the `hip` DeviceRuntime (HipRuntime): the shared GPU
// implementation (gpu_runtime.inc, gpu_graph.inc) over the HIP runtime API,
// plus what HIP does its own way.
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

#define CAPALLOC_GPU(name) hip##name
#define CAPALLOC_GPU_PREFIX "hip"
#define CAPALLOC_GPU_RUNTIME HipRuntime
#define CAPALLOC_GPU_RUNTIME_NAME "hip"
#define CAPALLOC_GPU_KIND RuntimeKind::kHip
#define CAPALLOC_GPU_DISPLAY_NAME "HIP"
#define CAPALLOC_GPU_FACTORY make_hip_runtime

// The class and its first half, then capture and graphs: in this order.
#include "runtime/gpu_runtime.inc"
//
#include "runtime/gpu_graph.inc"
#include "runtime/plugins.hpp"

namespace capalloc::detail {
namespace {

NativeError query_native_capture(NativeStream stream, bool with_dependencies, NativeCapture& out) {
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

NativeError native_edges(NativeGraph graph,
                         std::vector<std::pair<NativeGraphNode, NativeGraphNode>>& out) {
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

NodeKind classify_node(NativeNodeType type) {
  switch (type) {
    case hipGraphNodeTypeKernel:
      return NodeKind::kKernel;
    case hipGraphNodeTypeMemset:
      return NodeKind::kMemset;
    case hipGraphNodeTypeMemcpy:
      return NodeKind::kMemcpy;
    case hipGraphNodeTypeGraph:
      return NodeKind::kChildGraph;
    case hipGraphNodeTypeMemcpy1D:
    case hipGraphNodeTypeMemcpyFromSymbol:
    case hipGraphNodeTypeMemcpyToSymbol:
      return NodeKind::kOpaqueWriter;
    default:
      return NodeKind::kNoDeviceWrite;
  }
}

absl::Status read_kernel_pointer_params(NativeGraphNode, std::vector<std::uintptr_t>&) {
  return absl::UnimplementedError(
      "kernel parameters cannot be inspected: HIP gives no kernel parameter layout");
}

}  // namespace
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
