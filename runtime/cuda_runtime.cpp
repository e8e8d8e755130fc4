// cuda_runtime.cpp: the `cuda` DeviceRuntime, GpuRuntime<CudaApi>: the shared
// GPU implementation (gpu_runtime.hpp, gpu_runtime_impl.hpp, gpu_graph_impl.hpp)
// over the CUDA runtime API (cuda_api.hpp), plus what only CUDA has, as
// CudaApi's backend hooks: the CUDA 13 capture query and kernel parameter
// inspection through the driver.
//
// Plain C++ (no nvcc), linked against libcudart only. The driver functions
// it needs (cuGraphKernelNodeGetParams, cuFuncGetParamInfo and
// cuKernelGetParamInfo, CUDA >= 12.4) are looked up once through
// cudaGetDriverEntryPointByVersion at the version of the CUDA headers built
// against, so the prototypes in <cuda.h> are the ones the driver hands back
// and libcuda is never linked. A driver without them leaves kernel nodes
// uninspected (graph_writes then falls back as gpu_graph_impl.hpp describes).
#include <cuda.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_format.h"
#include "capalloc/runtime.hpp"
#include "runtime/cuda_api.hpp"
#include "runtime/declared_accesses.hpp"
#include "runtime/gpu_graph_impl.hpp"
#include "runtime/gpu_runtime.hpp"
#include "runtime/gpu_runtime_impl.hpp"
#include "runtime/gpu_runtimes.hpp"
#include "runtime/plugins.hpp"

namespace capalloc::detail {
namespace {

// The driver functions kernel inspection needs, resolved once.
struct DriverEntryPoints {
  decltype(&::cuGraphKernelNodeGetParams) kernel_node_params = nullptr;
  decltype(&::cuFuncGetParamInfo) func_param_info = nullptr;
  decltype(&::cuKernelGetParamInfo) kernel_param_info = nullptr;
  decltype(&::cuGetErrorName) error_name = nullptr;
  std::string missing;  // the symbols the driver did not give, for messages
};

template <typename Fn>
void resolve(const char* symbol, Fn& fn, std::string& missing) {
  void* address = nullptr;
  cudaDriverEntryPointQueryResult result = cudaDriverEntryPointSymbolNotFound;
  const cudaError_t e = cudaGetDriverEntryPointByVersion(symbol, &address, CUDART_VERSION,
                                                         cudaEnableDefault, &result);
  if (e != cudaSuccess || result != cudaDriverEntryPointSuccess || address == nullptr) {
    (void)cudaGetLastError();
    missing += missing.empty() ? symbol : std::string(", ") + symbol;
    return;
  }
  fn = reinterpret_cast<Fn>(address);
}

const DriverEntryPoints& driver() {
  static const DriverEntryPoints points = [] {
    DriverEntryPoints p;
    resolve("cuGraphKernelNodeGetParams", p.kernel_node_params, p.missing);
    resolve("cuFuncGetParamInfo", p.func_param_info, p.missing);
    resolve("cuKernelGetParamInfo", p.kernel_param_info, p.missing);
    resolve("cuGetErrorName", p.error_name, p.missing);
    return p;
  }();
  return points;
}

std::string driver_error(const DriverEntryPoints& d, CUresult r, std::string_view call) {
  const char* name = nullptr;
  if (d.error_name == nullptr || d.error_name(r, &name) != CUDA_SUCCESS || name == nullptr) {
    return absl::StrFormat("%s: CUresult %d", call, static_cast<int>(r));
  }
  return absl::StrFormat("%s: %s", call, name);
}

// More parameters than any kernel can take (the parameter space is 32 KiB):
// a bound on the walk should the driver never say "past the last one".
constexpr std::size_t kMaxKernelParams = 32768;

}  // namespace

// --- CudaApi's backend hooks ------------------------------------------------------

cudaError_t CudaApi::query_capture(cudaStream_t stream, bool with_dependencies,
                                   NativeCapture<CudaApi>& out) {
  const cudaGraphNode_t* dependencies = nullptr;
  // Asked for with the dependencies, so that edges carrying data (programmatic
  // launches) do not make the query fail as lossy.
  const cudaGraphEdgeData* edges = nullptr;
  std::size_t count = 0;
  const cudaError_t e = with_dependencies
                            ? cudaStreamGetCaptureInfo(stream, &out.status, &out.id, &out.graph,
                                                       &dependencies, &edges, &count)
                            : cudaStreamGetCaptureInfo(stream, &out.status, &out.id, &out.graph);
  if (e == cudaSuccess && dependencies != nullptr) {
    // Valid only until the next call on the stream: copy now.
    out.dependencies.assign(dependencies, dependencies + count);
  }
  return e;
}

cudaError_t CudaApi::graph_edges(cudaGraph_t graph,
                                 std::vector<std::pair<cudaGraphNode_t, cudaGraphNode_t>>& out) {
  std::size_t count = 0;
  if (const cudaError_t e = cudaGraphGetEdges(graph, nullptr, nullptr, nullptr, &count);
      e != cudaSuccess) {
    return e;
  }
  std::vector<cudaGraphNode_t> from(count), to(count);
  std::vector<cudaGraphEdgeData> data(count);
  if (count != 0) {
    if (const cudaError_t e = cudaGraphGetEdges(graph, from.data(), to.data(), data.data(), &count);
        e != cudaSuccess) {
      return e;
    }
  }
  out.clear();
  for (std::size_t i = 0; i < count && i < from.size(); ++i) {
    // A programmatic edge lets the dependent start before its source ends:
    // it orders nothing the alias rule may rely on.
    if (data[i].type != cudaGraphDependencyTypeDefault) continue;
    out.emplace_back(from[i], to[i]);
  }
  return cudaSuccess;
}

GpuNodeKind CudaApi::classify_node(cudaGraphNodeType type) {
  switch (type) {
    case cudaGraphNodeTypeKernel:
      return GpuNodeKind::kKernel;
    case cudaGraphNodeTypeMemset:
      return GpuNodeKind::kMemset;
    case cudaGraphNodeTypeMemcpy:
      return GpuNodeKind::kMemcpy;
    case cudaGraphNodeTypeGraph:
      return GpuNodeKind::kChildGraph;
    // Nodes known to write no device memory: host functions (they run on
    // the CPU), no-ops, event and external-semaphore nodes, and the graph's
    // own allocation and free nodes.
    case cudaGraphNodeTypeHost:
    case cudaGraphNodeTypeEmpty:
    case cudaGraphNodeTypeWaitEvent:
    case cudaGraphNodeTypeEventRecord:
    case cudaGraphNodeTypeExtSemaphoreSignal:
    case cudaGraphNodeTypeExtSemaphoreWait:
    case cudaGraphNodeTypeMemAlloc:
    case cudaGraphNodeTypeMemFree:
      return GpuNodeKind::kNoDeviceWrite;
    // Every other node may write where this runtime cannot read: conditional
    // nodes (their bodies hold nodes of their own), batched memory
    // operations (captured cuStreamWriteValue*, type 12 of the driver API),
    // and any type a newer driver adds. The graph then falls back to
    // footprint writes instead of being taken as writing nothing there.
    default:
      return GpuNodeKind::kOpaqueWriter;
  }
}

absl::Status CudaApi::read_kernel_pointer_params(cudaGraphNode_t node,
                                                 std::vector<std::uintptr_t>& out) {
  const DriverEntryPoints& d = driver();
  if (d.kernel_node_params == nullptr ||
      (d.func_param_info == nullptr && d.kernel_param_info == nullptr)) {
    return absl::UnimplementedError(absl::StrFormat(
        "kernel parameters cannot be inspected: the CUDA driver does not provide %s (CUDA >= "
        "12.4 needed)",
        d.missing));
  }
  CUDA_KERNEL_NODE_PARAMS params{};
  if (const CUresult r = d.kernel_node_params(node, &params); r != CUDA_SUCCESS) {
    return absl::InternalError(driver_error(d, r, "cuGraphKernelNodeGetParams"));
  }
  if (params.kernelParams == nullptr) {
    return absl::UnimplementedError(
        "kernel parameters cannot be inspected: the kernel node passes its arguments packed in "
        "`extra`");
  }
  auto param_info = [&](std::size_t index, std::size_t* offset, std::size_t* size) -> CUresult {
    if (params.func != nullptr && d.func_param_info != nullptr) {
      return d.func_param_info(params.func, index, offset, size);
    }
    if (params.kern != nullptr && d.kernel_param_info != nullptr) {
      return d.kernel_param_info(params.kern, index, offset, size);
    }
    return CUDA_ERROR_NOT_SUPPORTED;
  };
  for (std::size_t index = 0; index < kMaxKernelParams; ++index) {
    std::size_t offset = 0;
    std::size_t size = 0;
    const CUresult r = param_info(index, &offset, &size);
    // The query's answer past the last parameter (a kernel without
    // parameters answers it for index 0 and writes through none).
    if (r == CUDA_ERROR_INVALID_VALUE) break;
    if (r != CUDA_SUCCESS) {
      return absl::UnimplementedError(absl::StrFormat(
          "kernel parameters cannot be inspected: %s",
          driver_error(d, r,
                       params.func != nullptr ? "cuFuncGetParamInfo" : "cuKernelGetParamInfo")));
    }
    if (params.kernelParams[index] == nullptr) continue;
    // Every word of the parameter, not only 8-byte parameters: structs by
    // value carry pointers too (the first GPU run missed every clobber of
    // PyTorch's elementwise kernels, whose pointers travel in a struct).
    for_each_pointer_word(params.kernelParams[index], size,
                          [&](std::uintptr_t word) { out.push_back(word); });
  }
  return absl::OkStatus();
}

// --- The runtime and its factory ---------------------------------------------------

template class GpuRuntime<CudaApi>;

absl::StatusOr<std::shared_ptr<DeviceRuntime>> make_cuda_runtime() {
  return make_gpu_runtime<CudaApi>();
}

}  // namespace capalloc::detail

// The backend plugin's entry point (runtime/plugins.hpp): how libcapalloc
// finds this runtime.
extern "C" __attribute__((visibility("default"))) const capalloc::detail::BackendEntry*
CAPALLOC_BACKEND_ENTRY() {
  static const capalloc::detail::BackendEntry entry{
      capalloc::detail::kBackendAbiVersion, CAPALLOC_VERSION, capalloc::RuntimeKind::kCuda,
      &capalloc::detail::make_cuda_runtime};
  return &entry;
}
