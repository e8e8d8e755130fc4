// hip_api.hpp: HipApi, the API traits of GpuRuntime<HipApi>, the `hip`
// DeviceRuntime (gpu_api.hpp says what a traits type holds). Included only by
// hip_runtime.cpp, which defines the backend hooks declared here.
#ifndef CAPALLOC_RUNTIME_HIP_API_HPP_
#define CAPALLOC_RUNTIME_HIP_API_HPP_

#include <hip/hip_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "capalloc/runtime.hpp"
#include "runtime/gpu_api.hpp"

namespace capalloc::detail {

struct HipApi {
  using Error = hipError_t;
  using Stream = hipStream_t;
  using Event = hipEvent_t;
  using Graph = hipGraph_t;
  using GraphExec = hipGraphExec_t;
  using GraphNode = hipGraphNode_t;
  using NodeType = hipGraphNodeType;
  using CaptureStatus = hipStreamCaptureStatus;
  using CaptureMode = hipStreamCaptureMode;
  using MemsetParams = hipMemsetParams;
  using Memcpy3DParms = hipMemcpy3DParms;

  static constexpr RuntimeKind kKind = RuntimeKind::kHip;
  static constexpr const char* kName = "hip";
  static constexpr const char* kDisplayName = "HIP";
  // HIP 5.2 has no user objects: watch_capture_graph is kUnimplemented.
  static constexpr bool kHasUserObjects = false;

  static constexpr Error kSuccess = hipSuccess;
  static constexpr Error kErrorNotReady = hipErrorNotReady;
  static constexpr Error kErrorMemoryAllocation = hipErrorMemoryAllocation;
  static constexpr Error kErrorInvalidValue = hipErrorInvalidValue;
  static constexpr Error kErrorInvalidDevice = hipErrorInvalidDevice;
  static constexpr Error kErrorInvalidResourceHandle = hipErrorInvalidResourceHandle;
  static constexpr Error kErrorNoDevice = hipErrorNoDevice;
  static constexpr Error kErrorInsufficientDriver = hipErrorInsufficientDriver;
  static constexpr Error kErrorStreamCaptureUnsupported = hipErrorStreamCaptureUnsupported;
  static constexpr Error kErrorStreamCaptureInvalidated = hipErrorStreamCaptureInvalidated;
  static constexpr Error kErrorStreamCaptureMerge = hipErrorStreamCaptureMerge;
  static constexpr Error kErrorStreamCaptureUnmatched = hipErrorStreamCaptureUnmatched;
  static constexpr Error kErrorStreamCaptureUnjoined = hipErrorStreamCaptureUnjoined;
  static constexpr Error kErrorStreamCaptureIsolation = hipErrorStreamCaptureIsolation;
  static constexpr Error kErrorStreamCaptureImplicit = hipErrorStreamCaptureImplicit;
  static constexpr Error kErrorCapturedEvent = hipErrorCapturedEvent;
  static constexpr Error kErrorStreamCaptureWrongThread = hipErrorStreamCaptureWrongThread;
  static constexpr Error kErrorIllegalState = hipErrorIllegalState;

  static constexpr CaptureStatus kCaptureStatusNone = hipStreamCaptureStatusNone;
  static constexpr CaptureStatus kCaptureStatusActive = hipStreamCaptureStatusActive;
  static constexpr CaptureMode kCaptureModeGlobal = hipStreamCaptureModeGlobal;
  static constexpr CaptureMode kCaptureModeThreadLocal = hipStreamCaptureModeThreadLocal;
  static constexpr CaptureMode kCaptureModeRelaxed = hipStreamCaptureModeRelaxed;

  static constexpr unsigned int kStreamNonBlocking = hipStreamNonBlocking;
  static constexpr unsigned int kEventDisableTiming = hipEventDisableTiming;
  static constexpr hipMemcpyKind kMemcpyDefault = hipMemcpyDefault;

  // --- Native calls --------------------------------------------------------------

  static Error GetLastError() { return hipGetLastError(); }
  static const char* GetErrorName(Error e) { return hipGetErrorName(e); }
  static const char* GetErrorString(Error e) { return hipGetErrorString(e); }
  static Error GetDeviceCount(int* count) { return hipGetDeviceCount(count); }
  static Error GetDevice(int* device) { return hipGetDevice(device); }
  static Error SetDevice(int device) { return hipSetDevice(device); }
  static Error ThreadExchangeStreamCaptureMode(CaptureMode* mode) {
    return hipThreadExchangeStreamCaptureMode(mode);
  }
  static Error MemGetInfo(std::size_t* free, std::size_t* total) {
    return hipMemGetInfo(free, total);
  }
  static Error Malloc(void** ptr, std::size_t bytes) { return hipMalloc(ptr, bytes); }
  static Error Free(void* ptr) { return hipFree(ptr); }

  static Error StreamCreateWithFlags(Stream* stream, unsigned int flags) {
    return hipStreamCreateWithFlags(stream, flags);
  }
  static Error StreamDestroy(Stream stream) { return hipStreamDestroy(stream); }
  static Error StreamSynchronize(Stream stream) { return hipStreamSynchronize(stream); }
  static Error StreamWaitEvent(Stream stream, Event event, unsigned int flags) {
    return hipStreamWaitEvent(stream, event, flags);
  }
  static Error EventCreateWithFlags(Event* event, unsigned int flags) {
    return hipEventCreateWithFlags(event, flags);
  }
  static Error EventDestroy(Event event) { return hipEventDestroy(event); }
  static Error EventRecord(Event event, Stream stream) { return hipEventRecord(event, stream); }
  static Error EventQuery(Event event) { return hipEventQuery(event); }
  static Error EventSynchronize(Event event) { return hipEventSynchronize(event); }

  static Error MemsetAsync(void* dst, int value, std::size_t bytes, Stream stream) {
    return hipMemsetAsync(dst, value, bytes, stream);
  }
  static Error MemcpyAsync(void* dst, const void* src, std::size_t bytes, hipMemcpyKind kind,
                           Stream stream) {
    return hipMemcpyAsync(dst, src, bytes, kind, stream);
  }

  static Error StreamBeginCapture(Stream stream, CaptureMode mode) {
    return hipStreamBeginCapture(stream, mode);
  }
  static Error StreamEndCapture(Stream stream, Graph* graph) {
    return hipStreamEndCapture(stream, graph);
  }
  static Error GraphGetNodes(Graph graph, GraphNode* nodes, std::size_t* count) {
    return hipGraphGetNodes(graph, nodes, count);
  }
  static Error GraphNodeGetType(GraphNode node, NodeType* type) {
    return hipGraphNodeGetType(node, type);
  }
  static Error GraphMemsetNodeGetParams(GraphNode node, MemsetParams* params) {
    return hipGraphMemsetNodeGetParams(node, params);
  }
  static Error GraphMemcpyNodeGetParams(GraphNode node, Memcpy3DParms* params) {
    return hipGraphMemcpyNodeGetParams(node, params);
  }
  static Error GraphChildGraphNodeGetGraph(GraphNode node, Graph* child) {
    return hipGraphChildGraphNodeGetGraph(node, child);
  }
  static Error GraphInstantiateWithFlags(GraphExec* exec, Graph graph, unsigned long long flags) {
    return hipGraphInstantiateWithFlags(exec, graph, flags);
  }
  static Error GraphLaunch(GraphExec exec, Stream stream) { return hipGraphLaunch(exec, stream); }
  static Error GraphExecDestroy(GraphExec exec) { return hipGraphExecDestroy(exec); }
  static Error GraphDestroy(Graph graph) { return hipGraphDestroy(graph); }

  // --- Backend hooks (hip_runtime.cpp; gpu_api.hpp documents them) ---------------

  // hipStreamGetCaptureInfo_v2.
  static Error query_capture(Stream stream, bool with_dependencies, NativeCapture<HipApi>& out);
  static Error graph_edges(Graph graph, std::vector<std::pair<GraphNode, GraphNode>>& out);
  static GpuNodeKind classify_node(NodeType type);
  // Always kUnimplemented: HIP gives no kernel parameter layout.
  static absl::Status read_kernel_pointer_params(GraphNode node, std::vector<std::uintptr_t>& out);
};

}  // namespace capalloc::detail

#endif  // CAPALLOC_RUNTIME_HIP_API_HPP_
