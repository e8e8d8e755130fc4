// gpu_api.hpp: what GpuRuntime<Api> (gpu_runtime.hpp) asks of its API traits
// type, and the two small types the traits' backend hooks share with it.
//
// An API traits type (CudaApi in cuda_api.hpp, HipApi in hip_api.hpp) is a
// struct of static members, one per thing the runtime uses of a native API:
//   - types: Error, Stream, Event, Graph, GraphExec, GraphNode, NodeType,
//     CaptureStatus, CaptureMode, MemsetParams, Memcpy3DParms (and, where
//     kHasUserObjects, UserObject);
//   - constants: kKind (RuntimeKind), kName ("cuda" or "hip": the runtime's
//     name in messages and the prefix of its native calls), kDisplayName
//     ("CUDA" or "HIP"), kHasUserObjects, kSuccess, the error codes the
//     runtime maps (kErrorX), the capture statuses and modes, and the flags
//     it passes;
//   - one thin static function per native call, named as the native call
//     without its prefix (Api::Malloc is cudaMalloc or hipMalloc); the
//     user-object calls only where kHasUserObjects (the template reaches
//     them under `if constexpr`);
//   - the backend hooks, defined in the backend's .cpp, holding what the two
//     APIs do not share: query_capture, graph_edges, classify_node and
//     read_kernel_pointer_params (declared in each traits type, documented
//     here).
// Each traits header includes only its own native header and is included
// only by its backend's source, which instantiates GpuRuntime once.
#ifndef CAPALLOC_RUNTIME_GPU_API_HPP_
#define CAPALLOC_RUNTIME_GPU_API_HPP_

#include <vector>

namespace capalloc::detail {

// A stream's capture state as the native API reports it, filled by
// Api::query_capture(stream, with_dependencies, out).
template <class Api>
struct NativeCapture {
  typename Api::CaptureStatus status = Api::kCaptureStatusNone;
  unsigned long long id = 0;
  typename Api::Graph graph = nullptr;  // the graph under construction, if reported
  // The nodes the stream's next operation will depend on: the nodes its
  // latest operation made. Filled only when asked for.
  std::vector<typename Api::GraphNode> dependencies;
};

// What a graph node can write, for graph_writes: Api::classify_node(type).
enum class GpuNodeKind {
  kKernel,         // arguments by value: pointer parameters, if readable
  kMemset,         // exact destination from its parameters
  kMemcpy,         // exact destination from its 3D copy parameters
  kChildGraph,     // walk the embedded graph
  kOpaqueWriter,   // may write, and this runtime cannot read where
  kNoDeviceWrite,  // events, waits, empty nodes, host nodes (documented)
};

// The other hooks:
//   Error graph_edges(Graph, std::vector<std::pair<GraphNode, GraphNode>>& out):
//     the edges of a graph that order execution, as (from, to) pairs; edges
//     that order nothing (CUDA's programmatic edges) are left out.
//   absl::Status read_kernel_pointer_params(GraphNode, std::vector<std::uintptr_t>& out):
//     candidate pointers of a kernel node: every nonzero 8-byte-aligned word
//     of each parameter (for_each_pointer_word in declared_accesses.hpp), so
//     pointers inside structs count; kUnimplemented when the runtime or
//     driver cannot read a kernel's parameter layout.

}  // namespace capalloc::detail

#endif  // CAPALLOC_RUNTIME_GPU_API_HPP_
