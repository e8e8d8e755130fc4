// c_api/c_api_support.hpp: what the C ABI's source files share: the
// conversion of absl::Status into a capalloc_status with the thread-local
// last error, the thread-local string that JSON answers live in, and
// with_global(), which runs a body against the process-wide capalloc so
// that no C++ exception crosses into C.
#ifndef CAPALLOC_C_API_C_API_SUPPORT_HPP_
#define CAPALLOC_C_API_C_API_SUPPORT_HPP_

#include <atomic>
#include <string>

#include "absl/status/status.h"
#include "c_api/global.hpp"
#include "capalloc/capalloc.h"
#include "common/guarded.hpp"

namespace capalloc::detail {

// True while the calling thread's last error message is not empty. A plain
// flag, so that the success path of every call (which clears the message)
// reads one thread-local byte instead of touching the thread-local string:
// constinit, so no TLS wrapper guards it, and initial-exec, so it is one
// %fs-relative load rather than a __tls_get_addr call (one byte of the
// static TLS surplus that glibc keeps for libraries loaded with dlopen).
extern thread_local constinit bool c_error_set __attribute__((tls_model("initial-exec")));
// report_c_status's out-of-line halves.
capalloc_status report_c_error(const absl::Status& status);
void clear_c_error();

// Keeps the status's message as the calling thread's last error ("" when
// ok) and returns its code.
[[gnu::always_inline]] inline capalloc_status report_c_status(const absl::Status& status) {
  if (status.ok()) {
    if (c_error_set) clear_c_error();
    return CAPALLOC_OK;
  }
  return report_c_error(status);
}
// The calling thread's string for JSON answers (findings, snapshots).
std::string& c_json_slot();
// The calling thread's last error message.
const std::string& c_last_error();

// Runs `body` (GlobalCapalloc -> absl::Status) against the process-wide
// capalloc; anything thrown becomes a status (common/guarded.hpp).
template <typename Body>
capalloc_status with_global(Body&& body) noexcept {
  return report_c_status(guarded("capalloc", [&]() -> absl::Status {
    const auto& global = global_capalloc();
    if (!global.ok()) return global.status();
    return body(*global);
  }));
}

// PyTorch pool begins underway on any device (torch_pools.cpp); almost
// always 0, so that capalloc_torch_malloc's routing costs one load.
// Changed only under the torch pools' lock.
extern std::atomic<int> torch_begins_underway;
// The process-wide allocator, once capalloc_torch_malloc has found it
// usable for PyTorch's tensors (a GPU runtime, or host memory asked for on
// purpose); null before. It is never destroyed, so the torch entry points
// use it without going through global_capalloc() again.
extern CAPALLOC_INTERNAL std::atomic<Allocator*> torch_allocator;
// torch_allocator while no PyTorch pool begin is underway on any device;
// null while one is (there may be a capture to route). The torch entry
// point's steady-state path reads only this pointer: one load and one test.
// Published under the torch pools' lock, with torch_begins_underway
// (torch_pools.cpp). Both hidden: one PC-relative load, not one through
// the GOT, on the torch entry points.
extern CAPALLOC_INTERNAL std::atomic<Allocator*> torch_unrouted_allocator;
// Sets torch_allocator to `a`, and publishes it as torch_unrouted_allocator
// unless a begin is underway.
void note_torch_allocator(Allocator* a);
absl::Status route_torch_capture_underway(const GlobalCapalloc& g, int device, void* stream);

// Called by capalloc_torch_malloc before each allocation: routes a capture
// on `stream` that a PyTorch pool's filter accepts to that pool's graph
// pool, the first time the capture allocates.
inline absl::Status route_torch_capture(const GlobalCapalloc& g, int device, void* stream) {
  if (torch_begins_underway.load(std::memory_order_acquire) == 0) return absl::OkStatus();
  return route_torch_capture_underway(g, device, stream);
}

}  // namespace capalloc::detail

#endif  // CAPALLOC_C_API_C_API_SUPPORT_HPP_
