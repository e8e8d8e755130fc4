// common/guarded.hpp: the one place where an exception becomes a Status.
//
// capalloc's interfaces (DeviceRuntime, the allocator, the C ABI) return
// absl::Status and never let an exception cross them. Code below them uses
// the standard library, which throws (std::bad_alloc from a container,
// std::system_error from a thread start, whatever a caller's kernel body
// throws). `guarded(where, body)` runs `body` (returning absl::Status or
// absl::StatusOr<T>) and turns anything it throws into a status that names
// `where`: kResourceExhausted for std::bad_alloc, kInternal otherwise.
// `status_of_current_exception(where)` does the same inside a catch block,
// for code that must also run cleanup of its own.
#ifndef CAPALLOC_COMMON_GUARDED_HPP_
#define CAPALLOC_COMMON_GUARDED_HPP_

#include <exception>
#include <new>
#include <string>
#include <string_view>

#include "absl/status/status.h"

namespace capalloc::detail {

// Call only inside a catch block: the status of the exception being handled.
inline absl::Status status_of_current_exception(std::string_view where) {
  try {
    throw;
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError(std::string(where) + ": out of host memory");
  } catch (const std::exception& e) {
    return absl::InternalError(std::string(where) + " threw: " + e.what());
  } catch (...) {
    return absl::InternalError(std::string(where) + " threw a non-standard exception");
  }
}

template <typename Body>
auto guarded(std::string_view where, Body&& body) noexcept -> decltype(body()) {
  try {
    return body();
  } catch (...) {
    return status_of_current_exception(where);
  }
}

}  // namespace capalloc::detail

#endif  // CAPALLOC_COMMON_GUARDED_HPP_
