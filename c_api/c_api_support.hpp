// c_api/c_api_support.hpp: what the C ABI's source files share: the
// conversion of absl::Status into a capalloc_status with the thread-local
// last error, the thread-local string that JSON answers live in, and
// with_global(), which runs a body against the process-wide capalloc so
// that no C++ exception crosses into C.
#ifndef CAPALLOC_C_API_C_API_SUPPORT_HPP_
#define CAPALLOC_C_API_C_API_SUPPORT_HPP_

#include <string>

#include "absl/status/status.h"
#include "c_api/global.hpp"
#include "capalloc/capalloc.h"
#include "common/guarded.hpp"

namespace capalloc::detail {

// Keeps the status's message as the calling thread's last error ("" when
// ok) and returns its code.
capalloc_status report_c_status(const absl::Status& status);
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

// Called by capalloc_torch_malloc before each allocation (torch_pools.cpp):
// routes a capture on `stream` that a PyTorch pool's filter accepts to that
// pool's graph pool, the first time the capture allocates.
absl::Status route_torch_capture(const GlobalCapalloc& g, int device, void* stream);

}  // namespace capalloc::detail

#endif  // CAPALLOC_C_API_C_API_SUPPORT_HPP_
