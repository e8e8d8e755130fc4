// c_api/c_api_release.cpp: the C ABI of stream-ordered release and DLPack
// import (capalloc_release_*, capalloc_dlpack_*).
//
// The process-wide ReleaseQueue and DlpackImports are made on the first of
// these calls, over the process-wide capture tracker (so that a live graph's
// record holds a release of memory it uses), and, like the allocator behind
// them, never destroyed: host applications free from static destructors.
// Instead, teardown is an exit handler registered when they are made, which
// drains the queue (every DLPack tensor still imported is released, and
// every pending release runs, after its stream's work);
// capalloc_release_drain does the same earlier, as the Python package does
// at interpreter exit, before a Python callback could no longer run.
#include <cstdlib>
#include <memory>
#include <mutex>

#include "absl/strings/str_cat.h"
#include "c_api/c_api_support.hpp"
#include "capalloc/capalloc.h"
#include "capalloc/dlpack.hpp"
#include "capalloc/release.hpp"
#include "common/log.hpp"

namespace {

using capalloc::detail::GlobalCapalloc;
using capalloc::detail::report_c_status;
using capalloc::detail::with_global;

struct GlobalRelease {
  capalloc::ReleaseQueue* queue = nullptr;
  capalloc::DlpackImports* imports = nullptr;
};

// Set once, when the pair is made; never freed (see the file comment).
GlobalRelease* made_release = nullptr;

void drain_at_exit() {
  if (made_release == nullptr) return;
  if (auto drained = made_release->queue->drain(); !drained.ok()) {
    capalloc::detail::log().error("capalloc exit: {}", drained.ToString());
  }
}

// The process-wide queue and imports, made on first use (thread-safe).
absl::StatusOr<GlobalRelease> global_release(const GlobalCapalloc& g) {
  static std::once_flag once;
  static absl::Status failure;
  std::call_once(once, [&] {
    auto queue = capalloc::ReleaseQueue::create(*g.tracker);
    if (!queue.ok()) {
      failure = queue.status();
      return;
    }
    auto* made = new GlobalRelease;
    made->queue = queue->release();
    made->imports = new capalloc::DlpackImports(*made->queue);
    made_release = made;
    std::atexit(drain_at_exit);
  });
  if (made_release == nullptr) return failure;
  return *made_release;
}

template <typename Body>
capalloc_status with_release(Body&& body) noexcept {
  return with_global([&](const GlobalCapalloc& g) -> absl::Status {
    auto r = global_release(g);
    if (!r.ok()) return r.status();
    return body(*r);
  });
}

capalloc::StreamHandle as_stream(void* stream) {
  return reinterpret_cast<capalloc::StreamHandle>(stream);
}

capalloc_status null_argument(const char* call, const char* what) {
  return report_c_status(absl::InvalidArgumentError(absl::StrCat(call, ": ", what, " is NULL")));
}

}  // namespace

extern "C" {

capalloc_status capalloc_release_on_stream(void* stream, int device, capalloc_release_fn fn,
                                           void* context, const void* ptr, size_t bytes) {
  if (fn == nullptr) return null_argument("capalloc_release_on_stream", "fn");
  if ((ptr == nullptr) != (bytes == 0)) {
    return report_c_status(absl::InvalidArgumentError(
        "capalloc_release_on_stream: name the memory with both ptr and bytes, or with neither"));
  }
  return with_release([&](const GlobalRelease& r) {
    std::vector<capalloc::MemorySpan> memory;
    if (ptr != nullptr) memory.push_back({ptr, bytes});
    return r.queue->release(
        device, as_stream(stream), [fn, context] { fn(context); }, std::move(memory));
  });
}

capalloc_status capalloc_release_pending(uint64_t* out) {
  if (out == nullptr) return null_argument("capalloc_release_pending", "out");
  return with_release([&](const GlobalRelease& r) {
    *out = r.queue->stats().pending;
    return absl::OkStatus();
  });
}

capalloc_status capalloc_release_drain(void) {
  return with_release([&](const GlobalRelease& r) { return r.queue->drain(); });
}

capalloc_status capalloc_dlpack_import(struct DLManagedTensor* tensor, void* stream, void** data,
                                       size_t* bytes) {
  return with_release([&](const GlobalRelease& r) -> absl::Status {
    auto imported = r.imports->import(tensor, as_stream(stream));
    if (!imported.ok()) return imported.status();
    if (data != nullptr) *data = imported->data;
    if (bytes != nullptr) *bytes = imported->bytes;
    return absl::OkStatus();
  });
}

capalloc_status capalloc_dlpack_release(struct DLManagedTensor* tensor) {
  return with_release([&](const GlobalRelease& r) { return r.imports->release(tensor); });
}

capalloc_status capalloc_dlpack_import_token(struct DLManagedTensor* tensor, void* stream,
                                             void** data, size_t* bytes, uint64_t* token) {
  return with_release([&](const GlobalRelease& r) -> absl::Status {
    auto imported = r.imports->import(tensor, as_stream(stream));
    if (!imported.ok()) return imported.status();
    if (data != nullptr) *data = imported->data;
    if (bytes != nullptr) *bytes = imported->bytes;
    if (token != nullptr) *token = imported->token;
    return absl::OkStatus();
  });
}

capalloc_status capalloc_dlpack_release_token(struct DLManagedTensor* tensor, uint64_t token) {
  return with_release([&](const GlobalRelease& r) { return r.imports->release(tensor, token); });
}

}  // extern "C"
