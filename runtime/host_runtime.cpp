// host_runtime.cpp: devices, segments and streams of the host runtime (events
// are in host_events.cpp; work submission, capture and graphs in
// host_capture.cpp).
//
// Segments are anonymous private mappings with MAP_NORESERVE, so a large
// emulated device costs nothing until it is touched; each device counts the
// page-rounded size of its live segments against its limit, and a segment is
// released only with exactly the base and size it was reserved with. A stream
// is a StreamWorker plus the capture it belongs to, if any; it is removed from
// the registry before its worker is stopped, so nothing can be enqueued on a
// worker that is being joined.
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <utility>

#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "runtime/host_runtime.hpp"

namespace capalloc::detail {
namespace {

// CUDA keeps the capture-interaction mode per thread, whatever the device or
// context; so does this model, whatever the runtime instance.
thread_local CaptureMode t_capture_mode = CaptureMode::kGlobal;

std::string_view mode_name(CaptureMode mode) {
  switch (mode) {
    case CaptureMode::kGlobal:
      return "kGlobal";
    case CaptureMode::kThreadLocal:
      return "kThreadLocal";
    case CaptureMode::kRelaxed:
      return "kRelaxed";
  }
  return "unknown";
}

std::size_t system_page_bytes() {
  const long page = sysconf(_SC_PAGESIZE);
  return page >= 4096 ? static_cast<std::size_t>(page) : std::size_t{4096};
}

// Precondition: bytes <= SIZE_MAX - page, which the limit check ensures.
std::size_t round_to_pages(std::size_t bytes, std::size_t page) {
  return (bytes + page - 1) / page * page;
}

// cudaStreamCaptureMode rules for an unsafe call (a plain allocation) made by
// the calling thread while `capture` is in progress: relaxed threads may;
// otherwise the thread's own non-relaxed capture forbids it, and a global-mode
// thread is also stopped by any other thread's global-mode capture.
bool reservation_is_unsafe_for(const CaptureState& capture, CaptureMode thread_mode) {
  if (thread_mode == CaptureMode::kRelaxed) return false;
  if (capture.capturing_thread == std::this_thread::get_id() &&
      capture.mode != CaptureMode::kRelaxed) {
    return true;
  }
  return thread_mode == CaptureMode::kGlobal && capture.mode == CaptureMode::kGlobal;
}

}  // namespace

absl::StatusOr<std::shared_ptr<HostRuntime>> HostRuntime::create(
    const HostRuntimeOptions& options) {
  if (options.device_count < 1) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "host runtime: device_count must be at least 1, got %d", options.device_count));
  }
  if (options.memory_limit_per_device == 0) {
    return absl::InvalidArgumentError(
        "host runtime: memory_limit_per_device must be positive, got 0");
  }
  return guarded("host runtime: create", [&]() -> absl::StatusOr<std::shared_ptr<HostRuntime>> {
    return std::make_shared<HostRuntime>(options);
  });
}

HostRuntime::HostRuntime(const HostRuntimeOptions& options)
    : options_(options),
      page_bytes_(system_page_bytes()),
      devices_(static_cast<std::size_t>(options.device_count)),
      active_captures_(new std::atomic<int>[static_cast<std::size_t>(options.device_count)]{}) {
  streams_.emplace(kDefaultStream, std::make_shared<StreamState>(0, "default stream"));
  published_.publish_created(kDefaultStream);
}

HostRuntime::~HostRuntime() {
  // Workers first: queued work may still touch segments.
  absl::flat_hash_map<StreamHandle, std::shared_ptr<StreamState>> streams;
  {
    std::lock_guard lock(mu_);
    streams.swap(streams_);
  }
  for (auto& [handle, stream] : streams) stream->worker.stop();
  streams.clear();
  for (DeviceSegments& device : devices_) {
    for (const auto& [base, requested] : device.requested_bytes) {
      munmap(base, round_to_pages(requested, page_bytes_));
    }
  }
}

int HostRuntime::device_count() const { return options_.device_count; }

absl::Status HostRuntime::check_device(int device, std::string_view call) const {
  if (device >= 0 && device < options_.device_count) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrFormat("%s: device %d does not exist (the host runtime has %d device(s))", call,
                      device, options_.device_count));
}

absl::StatusOr<DeviceMemoryInfo> HostRuntime::memory_info(int device) const {
  if (auto status = check_device(device, "memory_info"); !status.ok()) return status;
  std::lock_guard lock(mu_);
  const std::size_t limit = options_.memory_limit_per_device;
  return DeviceMemoryInfo{.free_bytes = limit - devices_[device].reserved_bytes,
                          .total_bytes = limit};
}

absl::StatusOr<void*> HostRuntime::reserve(int device, std::size_t bytes) {
  return guarded("host runtime: reserve", [&]() -> absl::StatusOr<void*> {
    if (auto status = check_device(device, "reserve"); !status.ok()) return status;
    if (bytes == 0) {
      return absl::InvalidArgumentError(
          absl::StrFormat("reserve: 0 bytes requested on device %d", device));
    }
    std::lock_guard lock(mu_);
    const CaptureMode thread_mode = t_capture_mode;
    std::vector<CaptureId> forbidding;
    for (auto& [id, capture] : captures_) {
      if (!reservation_is_unsafe_for(*capture, thread_mode)) continue;
      forbidding.push_back(id);
      invalidate(*capture, absl::StrFormat("reserve(device %d, %d bytes)", device, bytes),
                 "a plain device allocation is an unsafe call, as cudaMalloc is")
          .IgnoreError();  // the caller gets one error naming every capture below
    }
    if (!forbidding.empty()) {
      std::sort(forbidding.begin(), forbidding.end());
      return absl::FailedPreconditionError(absl::StrFormat(
          "reserve of %d bytes on device %d from a thread in capture mode %s during capture %s, "
          "which it invalidated: as cudaMalloc during a global-mode capture, a plain device "
          "allocation is unsafe while capturing; switch the thread to CaptureMode::kRelaxed "
          "(exchange_thread_capture_mode) to reserve during a capture",
          bytes, device, mode_name(thread_mode), absl::StrJoin(forbidding, ", ")));
    }

    DeviceSegments& segments = devices_[device];
    const std::size_t limit = options_.memory_limit_per_device;
    const std::size_t available = limit - segments.reserved_bytes;
    if (bytes > available || round_to_pages(bytes, page_bytes_) > available) {
      return absl::ResourceExhaustedError(absl::StrFormat(
          "reserve: device %d cannot supply %d bytes: %d bytes already reserved of its "
          "%d-byte limit",
          device, bytes, segments.reserved_bytes, limit));
    }
    const std::size_t mapped_bytes = round_to_pages(bytes, page_bytes_);
    void* base = mmap(nullptr, mapped_bytes, PROT_READ | PROT_WRITE,
                      MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (base == MAP_FAILED) {
      return absl::ResourceExhaustedError(
          absl::StrFormat("reserve: mapping %d bytes for device %d failed (errno %d)",
                          mapped_bytes, device, errno));
    }
    try {
      segments.requested_bytes.emplace(base, bytes);
    } catch (...) {
      munmap(base, mapped_bytes);  // keep the mapping and the table in step
      throw;
    }
    segments.reserved_bytes += mapped_bytes;
    return base;
  });
}

absl::Status HostRuntime::release(int device, void* ptr, std::size_t bytes) {
  if (auto status = check_device(device, "release"); !status.ok()) return status;
  // As cudaFree does, release waits for the work queued on the device (a
  // stream-ordered free may have handed the memory back while a kernel still
  // uses it), then unmaps. Checked first, so a bad call waits for nothing.
  std::vector<std::shared_ptr<StreamState>> queues;
  {
    std::lock_guard lock(mu_);
    const DeviceSegments& segments = devices_[device];
    const auto it = segments.requested_bytes.find(ptr);
    if (it == segments.requested_bytes.end()) {
      return absl::NotFoundError(absl::StrFormat(
          "release: %p is not the base of a segment reserved on device %d", ptr, device));
    }
    if (it->second != bytes) {
      return absl::InvalidArgumentError(
          absl::StrFormat("release: segment %p on device %d was reserved with %d bytes, not %d",
                          ptr, device, it->second, bytes));
    }
    for (const auto& [handle, stream] : streams_) {
      if (stream->device == device || handle == kDefaultStream) queues.push_back(stream);
    }
  }
  for (const auto& stream : queues) stream->worker.wait_idle();
  std::lock_guard lock(mu_);
  DeviceSegments& segments = devices_[device];
  const auto it = segments.requested_bytes.find(ptr);
  if (it == segments.requested_bytes.end()) {
    return absl::NotFoundError(absl::StrFormat(
        "release: segment %p on device %d was released by another call meanwhile", ptr, device));
  }
  const std::size_t mapped_bytes = round_to_pages(bytes, page_bytes_);
  munmap(ptr, mapped_bytes);
  segments.reserved_bytes -= mapped_bytes;
  segments.requested_bytes.erase(it);
  return absl::OkStatus();
}

CaptureMode HostRuntime::exchange_thread_capture_mode(CaptureMode mode) {
  return std::exchange(t_capture_mode, mode);
}

// --- Streams -----------------------------------------------------------------

absl::StatusOr<std::shared_ptr<StreamState>> HostRuntime::find_stream(
    StreamHandle stream, std::string_view call) const {
  const auto it = streams_.find(stream);
  if (it != streams_.end()) return it->second;
  return absl::NotFoundError(absl::StrFormat(
      "%s: stream %d not found (never created or already destroyed)", call, stream));
}

absl::StatusOr<StreamHandle> HostRuntime::create_stream(int device) {
  return guarded("host runtime: create_stream", [&]() -> absl::StatusOr<StreamHandle> {
    if (auto status = check_device(device, "create_stream"); !status.ok()) return status;
    std::lock_guard lock(mu_);
    const StreamHandle handle = next_stream_;
    streams_.emplace(handle,
                     std::make_shared<StreamState>(device, absl::StrFormat("stream %d", handle)));
    ++next_stream_;
    published_.publish_created(handle);
    return handle;
  });
}

absl::StatusOr<int> HostRuntime::stream_device(StreamHandle stream) {
  return guarded("host runtime: stream_device", [&]() -> absl::StatusOr<int> {
    std::lock_guard lock(mu_);
    auto found = find_stream(stream, "stream_device");
    if (!found.ok()) return found.status();
    return (*found)->device;
  });
}

absl::Status HostRuntime::destroy_stream(StreamHandle stream) {
  return guarded("host runtime: destroy_stream", [&]() -> absl::Status {
    if (stream == kDefaultStream) {
      return absl::InvalidArgumentError("destroy_stream: the default stream cannot be destroyed");
    }
    std::shared_ptr<StreamState> state;
    // Looked up (and checked) twice: once to drain the stream's work while it
    // is still known, so that a free racing this destroy can still record an
    // event on it; then to forget it. Once forgotten, its work has run, which
    // the allocator relies on when the stream is no longer found.
    auto lookup = [&]() -> absl::Status {
      auto found = find_stream(stream, "destroy_stream");
      if (!found.ok()) return found.status();
      state = *std::move(found);
      if (state->capture != nullptr) {
        return absl::FailedPreconditionError(
            absl::StrFormat("destroy_stream: stream %d is part of capture %d; end the capture "
                            "on its origin stream %d first",
                            stream, state->capture->id, state->capture->origin));
      }
      return absl::OkStatus();
    };
    {
      std::lock_guard lock(mu_);
      if (absl::Status s = lookup(); !s.ok()) return s;
    }
    // Outside mu_: the stream's work may wait on other streams' events.
    state->worker.wait_idle();
    {
      std::lock_guard lock(mu_);
      if (absl::Status s = lookup(); !s.ok()) return s;
      streams_.erase(stream);
      published_.forget(stream);
    }
    state->worker.stop();  // whatever a racing caller queued after the drain
    stream_watchers_.destroyed(stream);
    return absl::OkStatus();
  });
}

absl::Status HostRuntime::synchronize_stream(StreamHandle stream) {
  return guarded("host runtime: synchronize_stream", [&]() -> absl::Status {
    std::shared_ptr<StreamState> state;
    {
      std::lock_guard lock(mu_);
      auto found = find_stream(stream, "synchronize_stream");
      if (!found.ok()) return found.status();
      state = *std::move(found);
      if (state->capture != nullptr) {
        return invalidate(*state->capture,
                          absl::StrFormat("synchronize_stream(stream %d)", stream),
                          "a capturing stream's work is recorded into a graph, not run");
      }
    }
    return state->worker.drain();
  });
}

}  // namespace capalloc::detail
