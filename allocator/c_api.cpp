// allocator/c_api.cpp: the C ABI over the process-wide allocator.
//
// Every entry point converts absl::Status into a capalloc_status and keeps
// the message in a thread-local string; a try/catch at each entry makes sure
// no C++ exception (std::bad_alloc from a container, say) crosses into C.
#include <cstdlib>
#include <exception>
#include <mutex>
#include <string>

#include "absl/strings/str_cat.h"
#include "allocator/global.hpp"
#include "allocator/runtime/log.hpp"
#include "capalloc/allocator.hpp"
#include "capalloc/capalloc.h"

namespace capalloc::detail {

absl::StatusOr<Allocator*> global_allocator() {
  static std::once_flag once;
  static absl::StatusOr<std::unique_ptr<Allocator>>* instance = nullptr;
  std::call_once(once, [] {
    // Leaked on purpose: blocks may be freed from static destructors of the
    // host application after ours would have run.
    const char* kind = std::getenv("CAPALLOC_RUNTIME");
    auto make = [&]() -> absl::StatusOr<std::unique_ptr<Allocator>> {
      auto runtime = make_runtime(kind != nullptr && *kind ? kind : "auto");
      if (!runtime.ok()) return runtime.status();
      auto options = AllocatorOptions::from_env();
      if (!options.ok()) return options.status();
      return Allocator::create(*std::move(runtime), *options);
    };
    instance = new absl::StatusOr<std::unique_ptr<Allocator>>(make());
    if (!instance->ok()) {
      log().error("capalloc could not start: {}", instance->status().ToString());
    }
  });
  if (!instance->ok()) return instance->status();
  return instance->value().get();
}

}  // namespace capalloc::detail

namespace {

thread_local std::string last_error;

capalloc_status to_code(const absl::Status& status) {
  switch (status.code()) {
    case absl::StatusCode::kOk:
      return CAPALLOC_OK;
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kOutOfRange:
      return CAPALLOC_ERROR_INVALID_ARGUMENT;
    case absl::StatusCode::kResourceExhausted:
      return CAPALLOC_ERROR_OUT_OF_MEMORY;
    case absl::StatusCode::kNotFound:
      return CAPALLOC_ERROR_NOT_FOUND;
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kAlreadyExists:
      return CAPALLOC_ERROR_FAILED_PRECONDITION;
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kUnimplemented:
      return CAPALLOC_ERROR_UNAVAILABLE;
    default:
      return CAPALLOC_ERROR_INTERNAL;
  }
}

capalloc_status report(const absl::Status& status) {
  last_error = status.ok() ? std::string() : std::string(status.message());
  return to_code(status);
}

// Runs `body` (returning absl::Status) against the global allocator; turns
// exceptions into CAPALLOC_ERROR_INTERNAL.
template <typename Body>
capalloc_status with_allocator(Body&& body) noexcept {
  try {
    auto allocator = capalloc::detail::global_allocator();
    if (!allocator.ok()) return report(allocator.status());
    return report(body(**allocator));
  } catch (const std::exception& e) {
    last_error = absl::StrCat("internal error: ", e.what());
  } catch (...) {
    last_error = "internal error: unknown exception";
  }
  return CAPALLOC_ERROR_INTERNAL;
}

capalloc::StreamHandle as_stream(void* stream) { return reinterpret_cast<capalloc::StreamHandle>(stream); }

}  // namespace

extern "C" {

const char* capalloc_last_error(void) { return last_error.c_str(); }

const char* capalloc_runtime_name(void) {
  const char* name = nullptr;
  with_allocator([&](capalloc::Allocator& a) {
    name = a.runtime().name().data();  // names are string literals
    return absl::OkStatus();
  });
  return name;
}

capalloc_status capalloc_malloc(void** out, size_t size, int device, void* stream) {
  if (out == nullptr) return report(absl::InvalidArgumentError("capalloc_malloc: out is NULL"));
  return with_allocator([&](capalloc::Allocator& a) {
    auto p = a.allocate(size, device, as_stream(stream));
    if (!p.ok()) return p.status();
    *out = *p;
    return absl::OkStatus();
  });
}

capalloc_status capalloc_free(void* ptr) {
  return with_allocator([&](capalloc::Allocator& a) { return a.deallocate(ptr); });
}

capalloc_status capalloc_record_stream(void* ptr, void* stream) {
  return with_allocator(
      [&](capalloc::Allocator& a) { return a.record_stream(ptr, as_stream(stream)); });
}

capalloc_status capalloc_empty_cache(int device) {
  return with_allocator([&](capalloc::Allocator& a) { return a.empty_cache(device); });
}

capalloc_status capalloc_get_stats(int device, capalloc_stats* out) {
  if (out == nullptr) return report(absl::InvalidArgumentError("capalloc_get_stats: out is NULL"));
  return with_allocator([&](capalloc::Allocator& a) {
    auto s = a.stats(device);
    if (!s.ok()) return s.status();
    *out = capalloc_stats{
        s->allocated_bytes.current, s->allocated_bytes.peak, s->requested_bytes.current,
        s->requested_bytes.peak,    s->reserved_bytes.current, s->reserved_bytes.peak,
        s->segments.current,        s->allocated_blocks.current, s->free_blocks,
        s->pending_free_blocks,     s->allocations,            s->frees,
        s->retries,                 s->ooms};
    return absl::OkStatus();
  });
}

capalloc_status capalloc_check_invariants(void) {
  return with_allocator([](capalloc::Allocator& a) { return a.CheckInvariants(); });
}

capalloc_status capalloc_stream_create(int device, void** out) {
  if (out == nullptr) return report(absl::InvalidArgumentError("capalloc_stream_create: out is NULL"));
  return with_allocator([&](capalloc::Allocator& a) {
    auto s = a.runtime().create_stream(device);
    if (!s.ok()) return s.status();
    *out = reinterpret_cast<void*>(*s);
    return absl::OkStatus();
  });
}

capalloc_status capalloc_stream_destroy(void* stream) {
  return with_allocator(
      [&](capalloc::Allocator& a) { return a.runtime().destroy_stream(as_stream(stream)); });
}

capalloc_status capalloc_stream_synchronize(void* stream) {
  return with_allocator(
      [&](capalloc::Allocator& a) { return a.runtime().synchronize_stream(as_stream(stream)); });
}

void* capalloc_torch_malloc(size_t size, int device, void* stream) {
  if (size == 0) return nullptr;  // PyTorch's convention for empty tensors
  void* out = nullptr;
  if (capalloc_malloc(&out, size, device, stream) != CAPALLOC_OK) {
    capalloc::detail::log().error("capalloc_torch_malloc({}, device {}): {}", size, device,
                                  last_error);
    return nullptr;
  }
  return out;
}

void capalloc_torch_free(void* ptr, size_t size, int device, void* stream) {
  (void)size;
  (void)stream;  // the block remembers its stream; frees are ordered on it
  if (ptr == nullptr) return;
  const capalloc_status status = with_allocator(
      [&](capalloc::Allocator& a) { return a.deallocate(ptr, device); });
  if (status != CAPALLOC_OK) {
    capalloc::detail::log().error("capalloc_torch_free({}, device {}): {}", ptr, device,
                                  last_error);
  }
}

}  // extern "C"
