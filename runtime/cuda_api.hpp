// cuda_api.hpp: CudaApi, the API traits of GpuRuntime<CudaApi>, the `cuda`
// DeviceRuntime (gpu_api.hpp says what a traits type holds). Included only by
// cuda_runtime.cpp, which defines the backend hooks declared here.
#ifndef CAPALLOC_RUNTIME_CUDA_API_HPP_
#define CAPALLOC_RUNTIME_CUDA_API_HPP_

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "capalloc/runtime.hpp"
#include "runtime/gpu_api.hpp"

namespace capalloc::detail {

struct CudaApi {
  using Error = cudaError_t;
  using Stream = cudaStream_t;
  using Event = cudaEvent_t;
  using Graph = cudaGraph_t;
  using GraphExec = cudaGraphExec_t;
  using GraphNode = cudaGraphNode_t;
  using NodeType = cudaGraphNodeType;
  using CaptureStatus = cudaStreamCaptureStatus;
  using CaptureMode = cudaStreamCaptureMode;
  using MemsetParams = cudaMemsetParams;
  using Memcpy3DParms = cudaMemcpy3DParms;
  using UserObject = cudaUserObject_t;

  static constexpr RuntimeKind kKind = RuntimeKind::kCuda;
  static constexpr const char* kName = "cuda";
  static constexpr const char* kDisplayName = "CUDA";
  static constexpr bool kHasUserObjects = true;

  static constexpr Error kSuccess = cudaSuccess;
  static constexpr Error kErrorNotReady = cudaErrorNotReady;
  static constexpr Error kErrorMemoryAllocation = cudaErrorMemoryAllocation;
  static constexpr Error kErrorInvalidValue = cudaErrorInvalidValue;
  static constexpr Error kErrorInvalidDevice = cudaErrorInvalidDevice;
  static constexpr Error kErrorInvalidResourceHandle = cudaErrorInvalidResourceHandle;
  static constexpr Error kErrorNoDevice = cudaErrorNoDevice;
  static constexpr Error kErrorInsufficientDriver = cudaErrorInsufficientDriver;
  static constexpr Error kErrorStreamCaptureUnsupported = cudaErrorStreamCaptureUnsupported;
  static constexpr Error kErrorStreamCaptureInvalidated = cudaErrorStreamCaptureInvalidated;
  static constexpr Error kErrorStreamCaptureMerge = cudaErrorStreamCaptureMerge;
  static constexpr Error kErrorStreamCaptureUnmatched = cudaErrorStreamCaptureUnmatched;
  static constexpr Error kErrorStreamCaptureUnjoined = cudaErrorStreamCaptureUnjoined;
  static constexpr Error kErrorStreamCaptureIsolation = cudaErrorStreamCaptureIsolation;
  static constexpr Error kErrorStreamCaptureImplicit = cudaErrorStreamCaptureImplicit;
  static constexpr Error kErrorCapturedEvent = cudaErrorCapturedEvent;
  static constexpr Error kErrorStreamCaptureWrongThread = cudaErrorStreamCaptureWrongThread;
  static constexpr Error kErrorIllegalState = cudaErrorIllegalState;

  static constexpr CaptureStatus kCaptureStatusNone = cudaStreamCaptureStatusNone;
  static constexpr CaptureStatus kCaptureStatusActive = cudaStreamCaptureStatusActive;
  static constexpr CaptureMode kCaptureModeGlobal = cudaStreamCaptureModeGlobal;
  static constexpr CaptureMode kCaptureModeThreadLocal = cudaStreamCaptureModeThreadLocal;
  static constexpr CaptureMode kCaptureModeRelaxed = cudaStreamCaptureModeRelaxed;

  static constexpr unsigned int kStreamNonBlocking = cudaStreamNonBlocking;
  static constexpr unsigned int kEventDisableTiming = cudaEventDisableTiming;
  static constexpr cudaMemcpyKind kMemcpyDefault = cudaMemcpyDefault;
  static constexpr unsigned int kUserObjectNoDestructorSync = cudaUserObjectNoDestructorSync;
  static constexpr unsigned int kGraphUserObjectMove = cudaGraphUserObjectMove;

  // --- Native calls --------------------------------------------------------------

  static Error GetLastError() { return cudaGetLastError(); }
  static const char* GetErrorName(Error e) { return cudaGetErrorName(e); }
  static const char* GetErrorString(Error e) { return cudaGetErrorString(e); }
  static Error GetDeviceCount(int* count) { return cudaGetDeviceCount(count); }
  static Error GetDevice(int* device) { return cudaGetDevice(device); }
  static Error SetDevice(int device) { return cudaSetDevice(device); }
  static Error ThreadExchangeStreamCaptureMode(CaptureMode* mode) {
    return cudaThreadExchangeStreamCaptureMode(mode);
  }
  static Error MemGetInfo(std::size_t* free, std::size_t* total) {
    return cudaMemGetInfo(free, total);
  }
  static Error Malloc(void** ptr, std::size_t bytes) { return cudaMalloc(ptr, bytes); }
  static Error Free(void* ptr) { return cudaFree(ptr); }

  static Error StreamCreateWithFlags(Stream* stream, unsigned int flags) {
    return cudaStreamCreateWithFlags(stream, flags);
  }
  static Error StreamDestroy(Stream stream) { return cudaStreamDestroy(stream); }
  // CUDA 12.8 and later. (HIP 5 has no hipStreamGetDevice: HipApi leaves it
  // out, and GpuRuntime::stream_device answers kUnimplemented there.)
  static Error StreamGetDevice(Stream stream, int* device) {
    return cudaStreamGetDevice(stream, device);
  }
  static Error StreamSynchronize(Stream stream) { return cudaStreamSynchronize(stream); }
  static Error StreamWaitEvent(Stream stream, Event event, unsigned int flags) {
    return cudaStreamWaitEvent(stream, event, flags);
  }
  static Error EventCreateWithFlags(Event* event, unsigned int flags) {
    return cudaEventCreateWithFlags(event, flags);
  }
  static Error EventDestroy(Event event) { return cudaEventDestroy(event); }
  static Error EventRecord(Event event, Stream stream) { return cudaEventRecord(event, stream); }
  static Error EventQuery(Event event) { return cudaEventQuery(event); }
  static Error EventSynchronize(Event event) { return cudaEventSynchronize(event); }

  static Error MemsetAsync(void* dst, int value, std::size_t bytes, Stream stream) {
    return cudaMemsetAsync(dst, value, bytes, stream);
  }
  static Error MemcpyAsync(void* dst, const void* src, std::size_t bytes, cudaMemcpyKind kind,
                           Stream stream) {
    return cudaMemcpyAsync(dst, src, bytes, kind, stream);
  }

  static Error StreamBeginCapture(Stream stream, CaptureMode mode) {
    return cudaStreamBeginCapture(stream, mode);
  }
  static Error StreamEndCapture(Stream stream, Graph* graph) {
    return cudaStreamEndCapture(stream, graph);
  }
  static Error GraphGetNodes(Graph graph, GraphNode* nodes, std::size_t* count) {
    return cudaGraphGetNodes(graph, nodes, count);
  }
  static Error GraphNodeGetType(GraphNode node, NodeType* type) {
    return cudaGraphNodeGetType(node, type);
  }
  static Error GraphMemsetNodeGetParams(GraphNode node, MemsetParams* params) {
    return cudaGraphMemsetNodeGetParams(node, params);
  }
  static Error GraphMemcpyNodeGetParams(GraphNode node, Memcpy3DParms* params) {
    return cudaGraphMemcpyNodeGetParams(node, params);
  }
  static Error GraphChildGraphNodeGetGraph(GraphNode node, Graph* child) {
    return cudaGraphChildGraphNodeGetGraph(node, child);
  }
  static Error GraphInstantiateWithFlags(GraphExec* exec, Graph graph, unsigned long long flags) {
    return cudaGraphInstantiateWithFlags(exec, graph, flags);
  }
  static Error GraphLaunch(GraphExec exec, Stream stream) { return cudaGraphLaunch(exec, stream); }
  static Error GraphExecDestroy(GraphExec exec) { return cudaGraphExecDestroy(exec); }
  static Error GraphDestroy(Graph graph) { return cudaGraphDestroy(graph); }

  static Error UserObjectCreate(UserObject* object, void* data, cudaHostFn_t destroy,
                                unsigned int refcount, unsigned int flags) {
    return cudaUserObjectCreate(object, data, destroy, refcount, flags);
  }
  static Error GraphRetainUserObject(Graph graph, UserObject object, unsigned int count,
                                     unsigned int flags) {
    return cudaGraphRetainUserObject(graph, object, count, flags);
  }
  static Error UserObjectRelease(UserObject object, unsigned int count) {
    return cudaUserObjectRelease(object, count);
  }

  // --- Backend hooks (cuda_runtime.cpp; gpu_api.hpp documents them) ---------------

  // CUDA 13's capture query, with the edge data of the dependencies.
  static Error query_capture(Stream stream, bool with_dependencies, NativeCapture<CudaApi>& out);
  static Error graph_edges(Graph graph, std::vector<std::pair<GraphNode, GraphNode>>& out);
  static GpuNodeKind classify_node(NodeType type);
  // Through the driver's cuFuncGetParamInfo / cuKernelGetParamInfo.
  static absl::Status read_kernel_pointer_params(GraphNode node, std::vector<std::uintptr_t>& out);
};

}  // namespace capalloc::detail

#endif  // CAPALLOC_RUNTIME_CUDA_API_HPP_
