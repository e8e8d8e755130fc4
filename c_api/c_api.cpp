// c_api/c_api.cpp: the C ABI over the process-wide capalloc (global.hpp).
//
// Every entry point converts absl::Status into a capalloc_status and keeps
// the message in a thread-local string; guarded() at each entry makes sure
// no C++ exception (std::bad_alloc from a container, say) crosses into C.
// Strings handed back (findings as JSON) live in another thread-local string,
// valid until the thread's next call that returns one.
#include <atomic>
#include <cstdlib>
#include <exception>
#include <mutex>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "allocator/allocator_impl.hpp"
#include "allocator/steady_state.hpp"
#include "allocator/trace_hooks.hpp"
#include "c_api/c_api_support.hpp"
#include "c_api/global.hpp"
#include "common/guarded.hpp"
#include "common/log.hpp"
#include "capalloc/allocator.hpp"
#include "capalloc/capalloc.h"
#include "capalloc/capture.hpp"
#include "capalloc/persistent_cache.hpp"


namespace {

thread_local std::string last_error;
thread_local std::string last_json;

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

}  // namespace

namespace capalloc::detail {

thread_local constinit bool c_error_set = false;

capalloc_status report_c_error(const absl::Status& status) {
  last_error.assign(status.message().data(), status.message().size());
  c_error_set = !last_error.empty();
  return to_code(status);
}

void clear_c_error() {
  last_error.clear();  // keeps the buffer: no allocation on later successes
  c_error_set = false;
}

std::string& c_json_slot() { return last_json; }

const std::string& c_last_error() { return last_error; }

}  // namespace capalloc::detail

namespace {

using capalloc::detail::with_global;

[[gnu::always_inline]] inline capalloc_status report(const absl::Status& status) {
  return capalloc::detail::report_c_status(status);
}

template <typename Body>
capalloc_status with_allocator(Body&& body) noexcept {
  return with_global(
      [&](const capalloc::detail::GlobalCapalloc& g) { return body(*g.allocator); });
}

using capalloc::detail::torch_allocator;

capalloc::StreamHandle as_stream(void* stream) {
  return reinterpret_cast<capalloc::StreamHandle>(stream);
}

// capalloc_torch_malloc's general path: the first call (which finds the
// allocator), PyTorch pool routes, and whatever the steady-state path
// declined, with errors reported and logged. `known`: torch_allocator as
// the caller read it. Out of line, so that the steady-state entry stays
// small.
[[gnu::noinline]] void* torch_malloc_general(size_t size, int device, void* stream,
                                             capalloc::Allocator* known) {
  // PyTorch's convention for empty tensors (the steady-state path declines
  // size 0 without a test of its own).
  if (size == 0) return nullptr;
  void* out = nullptr;
  capalloc_status status;
  if (known != nullptr &&
      capalloc::detail::torch_begins_underway.load(std::memory_order_acquire) == 0) {
    // allocate_cached declined: the general path, without trying it again.
    status = report(capalloc::detail::guarded("capalloc", [&]() -> absl::Status {
      auto p = capalloc::detail::AllocatorAccess::impl(*known).allocate(
          size, device, as_stream(stream), {}, /*cache_tried=*/true);
      if (!p.ok()) return p.status();
      out = *p;
      return absl::OkStatus();
    }));
  } else {
    status = with_global([&](const capalloc::detail::GlobalCapalloc& g) {
      if (!g.host_fallback_reason.empty()) {
        // Never host memory for PyTorch's device tensors: a clear error now,
        // not a crash in a kernel later.
        return absl::FailedPreconditionError(absl::StrCat(
            "the PyTorch entry points need a GPU runtime, and none could be had (",
            g.host_fallback_reason,
            "); set CAPALLOC_RUNTIME=cuda or hip to see the error, or =host to use host memory "
            "on purpose"));
      }
      // Once: note_torch_allocator takes the torch pools' lock, and this
      // path runs for every allocation while a pool begin is underway.
      if (torch_allocator.load(std::memory_order_acquire) == nullptr) {
        capalloc::detail::note_torch_allocator(g.allocator);
      }
      // A capture that a PyTorch pool's filter accepts allocates into that
      // pool (capalloc_torch_begin_allocate_to_pool).
      if (absl::Status s = capalloc::detail::route_torch_capture(g, device, stream); !s.ok()) {
        return s;
      }
      auto p = g.allocator->allocate(size, device, as_stream(stream));
      if (!p.ok()) return p.status();
      out = *p;
      return absl::OkStatus();
    });
  }
  if (status != CAPALLOC_OK) {
    capalloc::detail::log().error("capalloc_torch_malloc({}, device {}): {}", size, device,
                                  last_error);
    return nullptr;
  }
  return out;
}

// capalloc_torch_free's general path (free_cached declined, or the first
// call), with errors reported and logged.
// `try_cache`: free_cached was not tried (a capture is routed, so the free
// most likely needs the general path), and Impl::deallocate tries it under
// its own lock.
[[gnu::noinline]] void torch_free_general(void* ptr, int device, capalloc::Allocator* known,
                                          bool try_cache) {
  // Nothing to free (the steady-state path declines null without a test of
  // its own).
  if (ptr == nullptr) return;
  const capalloc_status status =
      known != nullptr
          ? report(capalloc::detail::guarded("capalloc", [&] {
              return capalloc::detail::AllocatorAccess::impl(*known).deallocate(
                  ptr, device, /*as_owner=*/nullptr, try_cache);
            }))
          : with_allocator([&](capalloc::Allocator& a) { return a.deallocate(ptr, device); });
  if (status != CAPALLOC_OK) {
    capalloc::detail::log().error("capalloc_torch_free({}, device {}): {}", ptr, device,
                                  last_error);
  }
}

capalloc_status null_argument(const char* call, const char* what) {
  return report(absl::InvalidArgumentError(absl::StrCat(call, ": ", what, " is NULL")));
}

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
  if (out == nullptr) return null_argument("capalloc_malloc", "out");
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
  if (out == nullptr) return null_argument("capalloc_get_stats", "out");
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
  if (out == nullptr) return null_argument("capalloc_stream_create", "out");
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
  return with_allocator([&](capalloc::Allocator& a) -> absl::Status {
    // Synchronizing a capturing stream would invalidate its capture (as
    // cudaStreamSynchronize does): refuse instead, leaving the capture intact.
    auto info = a.runtime().capture_info(as_stream(stream));
    if (!info.ok()) return info.status();
    if (info->status == capalloc::CaptureStatus::kActive) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "capalloc_stream_synchronize(%p): the stream is capturing (capture %d), and "
          "synchronizing it would invalidate the capture; end the capture first",
          stream, info->id));
    }
    return a.runtime().synchronize_stream(as_stream(stream));
  });
}

capalloc_status capalloc_malloc_tagged(void** out, size_t size, int device, void* stream,
                                       const char* tag, int persistent) {
  if (out == nullptr) return null_argument("capalloc_malloc_tagged", "out");
  return with_allocator([&](capalloc::Allocator& a) {
    capalloc::AllocOptions options;
    options.tag = tag == nullptr ? "" : tag;
    options.lifetime = persistent ? capalloc::Lifetime::kPersistent : capalloc::Lifetime::kTransient;
    auto p = a.allocate(size, device, as_stream(stream), options);
    if (!p.ok()) return p.status();
    *out = *p;
    return absl::OkStatus();
  });
}

}  // extern "C"

namespace {

// The handles C callers hold, by pool: what capalloc_pool_create gave them.
// The PyTorch hooks hold their own handles to the pools they make
// (torch_pools.cpp); capalloc_pool_release may give up only the C callers'.
struct CHandles {
  std::mutex mu;
  absl::flat_hash_map<std::uint64_t, int> held;
};
CHandles& c_handles() {
  static CHandles* handles = new CHandles();  // never destroyed: used at exit
  return *handles;
}

}  // namespace

extern "C" {

capalloc_status capalloc_pool_create(int device, uint64_t* out) {
  if (out == nullptr) return null_argument("capalloc_pool_create", "out");
  return with_allocator([&](capalloc::Allocator& a) {
    auto pool = a.create_graph_pool(device);
    if (!pool.ok()) return pool.status();
    std::lock_guard lock(c_handles().mu);
    ++c_handles().held[*pool];
    *out = *pool;
    return absl::OkStatus();
  });
}

capalloc_status capalloc_pool_release(uint64_t pool) {
  return with_allocator([&](capalloc::Allocator& a) -> absl::Status {
    std::lock_guard lock(c_handles().mu);
    auto it = c_handles().held.find(pool);
    if (it == c_handles().held.end()) {
      if (!a.pool_stats(pool).ok()) return a.release_graph_pool(pool);  // its own error
      return absl::FailedPreconditionError(absl::StrFormat(
          "capalloc_pool_release(%d): no handle from capalloc_pool_create is left to give up "
          "(a pool that PyTorch's hooks made is released with capalloc_torch_release_pool)",
          pool));
    }
    if (absl::Status s = a.release_graph_pool(pool); !s.ok()) return s;
    if (--it->second == 0) c_handles().held.erase(it);
    return absl::OkStatus();
  });
}

capalloc_status capalloc_capture_begin(int device, void* stream, uint64_t pool, const char* label) {
  return with_global([&](const capalloc::detail::GlobalCapalloc& g) {
    capalloc::CaptureOptions options;
    options.pool = pool;
    if (label != nullptr) options.label = label;
    return g.tracker->begin_capture(device, as_stream(stream), options).status();
  });
}

capalloc_status capalloc_capture_end(void* stream, uint64_t* graph, const char** findings_json) {
  if (graph == nullptr) return null_argument("capalloc_capture_end", "graph");
  return with_global([&](const capalloc::detail::GlobalCapalloc& g) {
    auto result = g.tracker->end_capture(as_stream(stream));
    if (!result.ok()) return result.status();
    *graph = result->graph;
    if (findings_json != nullptr) {
      last_json = capalloc::findings_to_json(result->new_findings);
      *findings_json = last_json.c_str();
    }
    return absl::OkStatus();
  });
}

capalloc_status capalloc_graph_replay(uint64_t graph, void* stream) {
  return with_global([&](const capalloc::detail::GlobalCapalloc& g) {
    return g.tracker->replay(graph, as_stream(stream));
  });
}

capalloc_status capalloc_graph_destroy(uint64_t graph) {
  return with_global(
      [&](const capalloc::detail::GlobalCapalloc& g) { return g.tracker->destroy_graph(graph); });
}

capalloc_status capalloc_check(const char** findings_json) {
  if (findings_json == nullptr) return null_argument("capalloc_check", "findings_json");
  return with_global([&](const capalloc::detail::GlobalCapalloc& g) {
    last_json = capalloc::findings_to_json(g.tracker->check());
    *findings_json = last_json.c_str();
    return absl::OkStatus();
  });
}

capalloc_status capalloc_waive(uint64_t graph, const void* victim, const char* tag,
                               const char* reason) {
  if (reason == nullptr) return null_argument("capalloc_waive", "reason");
  return with_global([&](const capalloc::detail::GlobalCapalloc& g) {
    return g.tracker->waive(graph, victim, tag == nullptr ? "" : tag, reason);
  });
}

capalloc_status capalloc_snapshot(const char** json) {
  if (json == nullptr) return null_argument("capalloc_snapshot", "json");
  return with_global([&](const capalloc::detail::GlobalCapalloc& g) {
    last_json = g.tracker->snapshot_json();
    *json = last_json.c_str();
    return absl::OkStatus();
  });
}

capalloc_status capalloc_set_strict(int strict) {
  return with_global([&](const capalloc::detail::GlobalCapalloc& g) {
    if (strict < 0 || strict > 2) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "capalloc_set_strict(%d): 0 (off), 1 (refuse hazards) or 2 (refuse hazards and "
          "possible findings)",
          strict));
    }
    g.tracker->set_strict(strict != 0);
    g.tracker->set_strict_possible(strict == 2);
    return absl::OkStatus();
  });
}

capalloc_status capalloc_preallocate(int device, const char* key, size_t bytes, void** out) {
  if (key == nullptr) return null_argument("capalloc_preallocate", "key");
  return with_global([&](const capalloc::detail::GlobalCapalloc& g) {
    auto p = g.cache->preallocate(device, key, bytes);
    if (!p.ok()) return p.status();
    if (out != nullptr) *out = *p;
    return absl::OkStatus();
  });
}

capalloc_status capalloc_get(int device, const char* key, void** out) {
  if (key == nullptr) return null_argument("capalloc_get", "key");
  if (out == nullptr) return null_argument("capalloc_get", "out");
  return with_global([&](const capalloc::detail::GlobalCapalloc& g) {
    auto p = g.cache->get(device, key);
    if (!p.ok()) return p.status();
    *out = *p;
    return absl::OkStatus();
  });
}

capalloc_status capalloc_release_persistent(int device, const char* key) {
  if (key == nullptr) return null_argument("capalloc_release_persistent", "key");
  return with_global([&](const capalloc::detail::GlobalCapalloc& g) {
    return g.cache->release(device, key);
  });
}

void* capalloc_torch_malloc(size_t size, int device, void* stream) {
  capalloc::Allocator* unrouted =
      capalloc::detail::torch_unrouted_allocator.load(std::memory_order_acquire);
  if (unrouted != nullptr) [[likely]] {
    // The allocator is known usable and no PyTorch pool begin is underway
    // (nothing to route; one pointer says both): the steady-state path, straight into the
    // allocator (no status to build), inlined from steady_state.hpp so that
    // this function and the path share one frame. This function is only
    // that; anything else is torch_malloc_general's.
    void* out = nullptr;
    try {
      out = capalloc::detail::AllocatorAccess::impl(*unrouted).allocate_cached(size, device,
                                                                               as_stream(stream));
    } catch (...) {
      out = nullptr;  // the general path says what went wrong
    }
    if (out != nullptr) [[likely]] {
      if (capalloc::detail::c_error_set) [[unlikely]] capalloc::detail::clear_c_error();
      return out;
    }
  }
  return torch_malloc_general(size, device, stream,
                              torch_allocator.load(std::memory_order_acquire));
}

void capalloc_torch_free(void* ptr, size_t size, int device, void* stream) {
  (void)size;
  capalloc::Allocator* known = torch_allocator.load(std::memory_order_acquire);
  if (known != nullptr) [[likely]] {
    auto& impl = capalloc::detail::AllocatorAccess::impl(*known);
    // During a routed capture, one lock in the general path rather than a
    // declined steady-state try and then the general path.
    if (impl.routed_captures.load(std::memory_order_relaxed) != 0) [[unlikely]] {
      return torch_free_general(ptr, device, known, /*try_cache=*/true);
    }
    bool freed = false;
    try {
      // The stream PyTorch names is the allocation's: its shard looks first.
      freed = impl.free_cached(ptr, device, as_stream(stream));
    } catch (...) {
      freed = false;  // the general path says what went wrong
    }
    if (freed) [[likely]] {
      if (capalloc::detail::c_error_set) [[unlikely]] capalloc::detail::clear_c_error();
      return;
    }
  }
  torch_free_general(ptr, device, known, /*try_cache=*/false);
}

}  // extern "C"
