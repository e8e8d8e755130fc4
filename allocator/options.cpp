// allocator/options.cpp: the environment overrides of AllocatorOptions.
//
// Every option has one CAPALLOC_* variable; an unparsable value is an error
// that names the variable rather than a silent fallback to the default.
#include <bit>
#include <cstdlib>
#include <memory>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "capalloc/allocator.hpp"

namespace capalloc {


absl::StatusOr<AllocatorOptions> AllocatorOptions::from_env() {
  AllocatorOptions options;
  if (const char* value = std::getenv("CAPALLOC_ROUND_GRANULARITY"); value != nullptr && *value) {
    std::uint64_t granularity = 0;
    if (!absl::SimpleAtoi(value, &granularity) || granularity < 256 ||
        !std::has_single_bit(granularity)) {
      return absl::InvalidArgumentError(
          absl::StrCat("CAPALLOC_ROUND_GRANULARITY='", value,
                       "' must be a power of two of at least 256 (bytes)"));
    }
    options.round_granularity = static_cast<std::size_t>(granularity);
  }
  if (const char* value = std::getenv("CAPALLOC_CAPTURE_GUARD_SCOPE"); value != nullptr && *value) {
    const std::string scope(value);
    if (scope == "device") {
      options.capture_guard_scope = CaptureGuardScope::kDevice;
    } else if (scope == "stream") {
      options.capture_guard_scope = CaptureGuardScope::kStream;
    } else {
      return absl::InvalidArgumentError(absl::StrCat(
          "CAPALLOC_CAPTURE_GUARD_SCOPE='", scope, "' must be 'device' or 'stream'"));
    }
  }
  return options;
}

}  // namespace capalloc
