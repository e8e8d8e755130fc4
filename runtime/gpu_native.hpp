// gpu_native.hpp: the helpers GpuRuntime<Api> uses around its native API:
// native errors as Status, handle casts, capture modes, DeviceScope and the
// node count of a graph. Templates over an API traits type (gpu_api.hpp).
#ifndef CAPALLOC_RUNTIME_GPU_NATIVE_HPP_
#define CAPALLOC_RUNTIME_GPU_NATIVE_HPP_

#include <cstddef>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "capalloc/runtime.hpp"

namespace capalloc::detail::gpu {

template <class Api>
absl::StatusCode code_for(typename Api::Error error) {
  switch (error) {
    case Api::kErrorMemoryAllocation:
      return absl::StatusCode::kResourceExhausted;
    case Api::kErrorInvalidValue:
    case Api::kErrorInvalidDevice:
    case Api::kErrorInvalidResourceHandle:
      return absl::StatusCode::kInvalidArgument;
    case Api::kErrorNoDevice:
    case Api::kErrorInsufficientDriver:
      return absl::StatusCode::kUnavailable;
    // Illegal during capture, or a capture that cannot end: the caller's
    // sequence of calls is wrong, as with the host runtime.
    case Api::kErrorStreamCaptureUnsupported:
    case Api::kErrorStreamCaptureInvalidated:
    case Api::kErrorStreamCaptureMerge:
    case Api::kErrorStreamCaptureUnmatched:
    case Api::kErrorStreamCaptureUnjoined:
    case Api::kErrorStreamCaptureIsolation:
    case Api::kErrorStreamCaptureImplicit:
    case Api::kErrorCapturedEvent:
    case Api::kErrorStreamCaptureWrongThread:
    case Api::kErrorIllegalState:
      return absl::StatusCode::kFailedPrecondition;
    default:
      return absl::StatusCode::kInternal;
  }
}

// "<call>: <error name>: <error string>", e.g. "cudaMalloc(1048576 bytes,
// device 0): cudaErrorMemoryAllocation: out of memory".
template <class Api>
absl::Status native_error(typename Api::Error error, std::string_view call) {
  // The error is reported here; leave no stale copy for the next checker.
  // Sticky errors (a faulted context) survive this, as they must.
  (void)Api::GetLastError();
  return absl::Status(code_for<Api>(error),
                      absl::StrFormat("%s: %s: %s", call, Api::GetErrorName(error),
                                      Api::GetErrorString(error)));
}

// The message of native_error(), for notes that are not returned.
template <class Api>
std::string native_message(typename Api::Error error, std::string_view call) {
  return std::string(native_error<Api>(error, call).message());
}

template <class Api>
typename Api::Stream native_stream(StreamHandle stream) {
  return reinterpret_cast<typename Api::Stream>(stream);
}

template <class Api>
typename Api::Event native_event(EventHandle event) {
  return reinterpret_cast<typename Api::Event>(event);
}

template <class Api>
typename Api::CaptureMode to_native(CaptureMode mode) {
  switch (mode) {
    case CaptureMode::kGlobal:
      return Api::kCaptureModeGlobal;
    case CaptureMode::kThreadLocal:
      return Api::kCaptureModeThreadLocal;
    case CaptureMode::kRelaxed:
      return Api::kCaptureModeRelaxed;
  }
  return Api::kCaptureModeGlobal;
}

template <class Api>
CaptureMode from_native(typename Api::CaptureMode mode) {
  if (mode == Api::kCaptureModeThreadLocal) return CaptureMode::kThreadLocal;
  if (mode == Api::kCaptureModeRelaxed) return CaptureMode::kRelaxed;
  return CaptureMode::kGlobal;
}

// Makes a device current for the scope and restores the caller's afterwards.
template <class Api>
class DeviceScope {
 public:
  DeviceScope() = default;
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;
  ~DeviceScope() {
    if (previous_ >= 0) (void)Api::SetDevice(previous_);
  }

  absl::Status enter(int device) {
    int current = 0;
    if (const typename Api::Error e = Api::GetDevice(&current); e != Api::kSuccess) {
      return native_error<Api>(e, absl::StrCat(Api::kName, "GetDevice()"));
    }
    if (current == device) return absl::OkStatus();
    if (const typename Api::Error e = Api::SetDevice(device); e != Api::kSuccess) {
      return native_error<Api>(e, absl::StrFormat("%sSetDevice(%d)", Api::kName, device));
    }
    previous_ = current;
    return absl::OkStatus();
  }

 private:
  int previous_ = -1;
};

// The node count of a graph (0 for none, or when the query fails).
template <class Api>
std::size_t node_count(typename Api::Graph graph) {
  if (graph == nullptr) return 0;
  std::size_t count = 0;
  if (Api::GraphGetNodes(graph, nullptr, &count) != Api::kSuccess) {
    (void)Api::GetLastError();
    return 0;
  }
  return count;
}

}  // namespace capalloc::detail::gpu

#endif  // CAPALLOC_RUNTIME_GPU_NATIVE_HPP_
