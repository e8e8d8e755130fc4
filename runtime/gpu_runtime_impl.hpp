// gpu_runtime_impl.hpp: GpuRuntime<Api>'s devices, segments, streams, events
// and work submission (gpu_runtime.hpp has the class and its invariants;
// gpu_graph_impl.hpp has capture and graphs). Included by the backend sources
// that instantiate GpuRuntime (cuda_runtime.cpp, hip_runtime.cpp).
#ifndef CAPALLOC_RUNTIME_GPU_RUNTIME_IMPL_HPP_
#define CAPALLOC_RUNTIME_GPU_RUNTIME_IMPL_HPP_

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "capalloc/runtime.hpp"
#include "common/log.hpp"
#include "common/status_macros.hpp"
#include "runtime/gpu_native.hpp"
#include "runtime/gpu_runtime.hpp"

namespace capalloc::detail {

namespace gpu {

// Reservations below this are rounded up to it. The native allocators carve
// small requests out of shared pages with 256-512 B alignment only; requests
// of whole 2 MiB pages come back page-aligned, which gives the 4 KiB
// alignment reserve() promises. The allocator never asks for less anyway.
inline constexpr std::size_t kSmallestNativeReservation = std::size_t{2} << 20;
inline constexpr std::size_t kSegmentAlignment = 4096;

}  // namespace gpu

// --- Devices and segments ----------------------------------------------------------

template <class Api>
absl::Status GpuRuntime<Api>::check_device(int device, std::string_view call) const {
  if (device >= 0 && device < device_count_) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrFormat("%s: device %d does not exist: the %s runtime has %d device(s)", call, device,
                      Api::kName, device_count_));
}

template <class Api>
absl::StatusOr<DeviceMemoryInfo> GpuRuntime<Api>::memory_info(int device) const {
  CAPALLOC_RETURN_IF_ERROR(check_device(device, "memory_info"));
  gpu::DeviceScope<Api> scope;
  CAPALLOC_RETURN_IF_ERROR(scope.enter(device));
  // A query must never invalidate someone's global-mode capture: the calling
  // thread asks in relaxed mode, as around a reservation.
  typename Api::CaptureMode mode = Api::kCaptureModeRelaxed;
  const bool relaxed = Api::ThreadExchangeStreamCaptureMode(&mode) == Api::kSuccess;
  DeviceMemoryInfo info;
  const typename Api::Error e = Api::MemGetInfo(&info.free_bytes, &info.total_bytes);
  if (relaxed) (void)Api::ThreadExchangeStreamCaptureMode(&mode);
  if (e != Api::kSuccess) {
    return gpu::native_error<Api>(e,
                                  absl::StrFormat("%sMemGetInfo(device %d)", Api::kName, device));
  }
  return info;
}

template <class Api>
absl::StatusOr<void*> GpuRuntime<Api>::reserve(int device, std::size_t bytes) {
  CAPALLOC_RETURN_IF_ERROR(check_device(device, "reserve"));
  if (bytes == 0) return absl::InvalidArgumentError("reserve: 0 bytes");
  const std::size_t request = std::max(bytes, gpu::kSmallestNativeReservation);
  gpu::DeviceScope<Api> scope;
  CAPALLOC_RETURN_IF_ERROR(scope.enter(device));
  void* ptr = nullptr;
  if (const typename Api::Error e = Api::Malloc(&ptr, request); e != Api::kSuccess) {
    return gpu::native_error<Api>(
        e, absl::StrFormat("%sMalloc(%d bytes%s, device %d)", Api::kName, request,
                           request == bytes ? "" : absl::StrFormat(" for a %d-byte reserve", bytes),
                           device));
  }
  if (reinterpret_cast<std::uintptr_t>(ptr) % gpu::kSegmentAlignment != 0) {
    (void)Api::Free(ptr);
    return absl::InternalError(
        absl::StrFormat("%sMalloc(%d bytes, device %d) returned %p, which is not aligned to "
                        "%d bytes as reserve() promises",
                        Api::kName, request, device, ptr, gpu::kSegmentAlignment));
  }
  return ptr;
}

template <class Api>
absl::Status GpuRuntime<Api>::release(int device, void* ptr, std::size_t bytes) {
  CAPALLOC_RETURN_IF_ERROR(check_device(device, "release"));
  if (ptr == nullptr) return absl::InvalidArgumentError("release: null segment");
  gpu::DeviceScope<Api> scope;
  CAPALLOC_RETURN_IF_ERROR(scope.enter(device));
  if (const typename Api::Error e = Api::Free(ptr); e != Api::kSuccess) {
    return gpu::native_error<Api>(
        e, absl::StrFormat("%sFree(%p: %d bytes, device %d)", Api::kName, ptr, bytes, device));
  }
  return absl::OkStatus();
}

template <class Api>
CaptureMode GpuRuntime<Api>::exchange_thread_capture_mode(CaptureMode mode) {
  typename Api::CaptureMode native = gpu::to_native<Api>(mode);
  if (const typename Api::Error e = Api::ThreadExchangeStreamCaptureMode(&native);
      e != Api::kSuccess) {
    // The mode is unchanged and the old one unknown: answer the native
    // default, so that the caller's restore leaves the thread in it.
    const absl::Status error =
        gpu::native_error<Api>(e, absl::StrCat(Api::kName, "ThreadExchangeStreamCaptureMode"));
    log().warn("{}", std::string(error.message()));
    return CaptureMode::kGlobal;
  }
  return gpu::from_native<Api>(native);
}

// --- Streams and events ------------------------------------------------------------

template <class Api>
absl::StatusOr<StreamHandle> GpuRuntime<Api>::create_stream(int device) {
  CAPALLOC_RETURN_IF_ERROR(check_device(device, "create_stream"));
  gpu::DeviceScope<Api> scope;
  CAPALLOC_RETURN_IF_ERROR(scope.enter(device));
  // Non-blocking: no implicit synchronization with the legacy stream, which
  // would make legacy-stream work illegal while this stream captures.
  NativeStream stream = nullptr;
  if (const typename Api::Error e = Api::StreamCreateWithFlags(&stream, Api::kStreamNonBlocking);
      e != Api::kSuccess) {
    return gpu::native_error<Api>(
        e, absl::StrFormat("%sStreamCreateWithFlags(device %d)", Api::kName, device));
  }
  return reinterpret_cast<StreamHandle>(stream);
}

template <class Api>
absl::StatusOr<int> GpuRuntime<Api>::stream_device(StreamHandle stream) {
  if constexpr (requires(NativeStream s, int* d) { Api::StreamGetDevice(s, d); }) {
    int device = -1;
    if (const typename Api::Error e =
            Api::StreamGetDevice(gpu::native_stream<Api>(stream), &device);
        e != Api::kSuccess) {
      return gpu::native_error<Api>(
          e, absl::StrFormat("%sStreamGetDevice(stream 0x%x)", Api::kName, stream));
    }
    return device;
  } else {
    return DeviceRuntime::stream_device(stream);
  }
}

template <class Api>
absl::Status GpuRuntime<Api>::destroy_stream(StreamHandle stream) {
  if (stream == kDefaultStream) {
    return absl::InvalidArgumentError("destroy_stream: the default stream cannot be destroyed");
  }
  // The contract waits for the stream's work; the native destroy would not.
  CAPALLOC_RETURN_IF_ERROR(synchronize_stream(stream));
  // The watchers hear of it before the native destroy: that destroy frees
  // the handle, which the next stream created (by any thread) may get, and
  // the allocator must have the report before that stream's first request,
  // or it would serve the new stream from the dead one's memory as its own
  // and later hand that memory out again under the new stream's kernels.
  // If the destroy then fails, the stream is still reported gone: the
  // allocator treats its next use as a new stream's (its work has run).
  stream_watchers_.destroyed(stream);
  if (const typename Api::Error e = Api::StreamDestroy(gpu::native_stream<Api>(stream));
      e != Api::kSuccess) {
    return gpu::native_error<Api>(
        e, absl::StrFormat("%sStreamDestroy(stream 0x%x)", Api::kName, stream));
  }
  return absl::OkStatus();
}

template <class Api>
absl::Status GpuRuntime<Api>::synchronize_stream(StreamHandle stream) {
  if (const typename Api::Error e = Api::StreamSynchronize(gpu::native_stream<Api>(stream));
      e != Api::kSuccess) {
    return gpu::native_error<Api>(
        e, absl::StrFormat("%sStreamSynchronize(stream 0x%x)", Api::kName, stream));
  }
  return absl::OkStatus();
}

template <class Api>
absl::StatusOr<EventHandle> GpuRuntime<Api>::create_event(int device) {
  CAPALLOC_RETURN_IF_ERROR(check_device(device, "create_event"));
  gpu::DeviceScope<Api> scope;
  CAPALLOC_RETURN_IF_ERROR(scope.enter(device));
  typename Api::Event event = nullptr;
  if (const typename Api::Error e = Api::EventCreateWithFlags(&event, Api::kEventDisableTiming);
      e != Api::kSuccess) {
    return gpu::native_error<Api>(
        e, absl::StrFormat("%sEventCreateWithFlags(device %d)", Api::kName, device));
  }
  return reinterpret_cast<EventHandle>(event);
}

template <class Api>
absl::Status GpuRuntime<Api>::destroy_event(EventHandle event) {
  if (const typename Api::Error e = Api::EventDestroy(gpu::native_event<Api>(event));
      e != Api::kSuccess) {
    return gpu::native_error<Api>(
        e, absl::StrFormat("%sEventDestroy(event 0x%x)", Api::kName, event));
  }
  return absl::OkStatus();
}

template <class Api>
absl::Status GpuRuntime<Api>::record_event(EventHandle event, StreamHandle stream) {
  if (const typename Api::Error e =
          Api::EventRecord(gpu::native_event<Api>(event), gpu::native_stream<Api>(stream));
      e != Api::kSuccess) {
    return gpu::native_error<Api>(
        e, absl::StrFormat("%sEventRecord(event 0x%x, stream 0x%x)", Api::kName, event, stream));
  }
  return absl::OkStatus();
}

template <class Api>
absl::StatusOr<bool> GpuRuntime<Api>::query_event(EventHandle event) {
  // An event query is an unsafe call during a global-mode capture, from any
  // thread: the allocator's pending-free scan must not invalidate someone's
  // capture (PyTorch's), so the calling thread asks in relaxed mode, as
  // memory_info does. Querying an event recorded inside an active capture
  // stays illegal in relaxed mode too, as the contract says.
  typename Api::CaptureMode mode = Api::kCaptureModeRelaxed;
  const bool relaxed = Api::ThreadExchangeStreamCaptureMode(&mode) == Api::kSuccess;
  const typename Api::Error e = Api::EventQuery(gpu::native_event<Api>(event));
  if (relaxed) (void)Api::ThreadExchangeStreamCaptureMode(&mode);
  if (e == Api::kSuccess) return true;
  if (e == Api::kErrorNotReady) {
    (void)Api::GetLastError();  // "not ready" is an answer, not an error
    return false;
  }
  return gpu::native_error<Api>(e,
                                absl::StrFormat("%sEventQuery(event 0x%x)", Api::kName, event));
}

template <class Api>
absl::Status GpuRuntime<Api>::synchronize_event(EventHandle event) {
  if (const typename Api::Error e = Api::EventSynchronize(gpu::native_event<Api>(event));
      e != Api::kSuccess) {
    return gpu::native_error<Api>(
        e, absl::StrFormat("%sEventSynchronize(event 0x%x)", Api::kName, event));
  }
  return absl::OkStatus();
}

template <class Api>
absl::Status GpuRuntime<Api>::stream_wait_event(StreamHandle stream, EventHandle event) {
  if (const typename Api::Error e =
          Api::StreamWaitEvent(gpu::native_stream<Api>(stream), gpu::native_event<Api>(event), 0);
      e != Api::kSuccess) {
    return gpu::native_error<Api>(
        e, absl::StrFormat("%sStreamWaitEvent(stream 0x%x, event 0x%x)", Api::kName, stream,
                           event));
  }
  return absl::OkStatus();
}

// --- Work ----------------------------------------------------------------------------

template <class Api>
absl::Status GpuRuntime<Api>::memset_async(void* dst, int value, std::size_t bytes,
                                           StreamHandle stream) {
  if (dst == nullptr && bytes != 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "memset_async: null destination for %d bytes on stream 0x%x", bytes, stream));
  }
  if (const typename Api::Error e =
          Api::MemsetAsync(dst, value, bytes, gpu::native_stream<Api>(stream));
      e != Api::kSuccess) {
    return gpu::native_error<Api>(e, absl::StrFormat("%sMemsetAsync(%p, %d, %d bytes, stream 0x%x)",
                                                     Api::kName, dst, value, bytes, stream));
  }
  return absl::OkStatus();
}

template <class Api>
absl::Status GpuRuntime<Api>::memcpy_async(void* dst, const void* src, std::size_t bytes,
                                           StreamHandle stream) {
  if ((dst == nullptr || src == nullptr) && bytes != 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("memcpy_async: null %s for %d bytes on stream 0x%x",
                        dst == nullptr ? "destination" : "source", bytes, stream));
  }
  // Default kind: the unified address space tells host from device memory.
  if (const typename Api::Error e = Api::MemcpyAsync(dst, src, bytes, Api::kMemcpyDefault,
                                                     gpu::native_stream<Api>(stream));
      e != Api::kSuccess) {
    return gpu::native_error<Api>(
        e, absl::StrFormat("%sMemcpyAsync(%p <- %p, %d bytes, stream 0x%x)", Api::kName, dst, src,
                           bytes, stream));
  }
  return absl::OkStatus();
}

}  // namespace capalloc::detail

#endif  // CAPALLOC_RUNTIME_GPU_RUNTIME_IMPL_HPP_
