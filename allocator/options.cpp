// allocator/options.cpp: the environment overrides of AllocatorOptions, read
// through the configuration table (common/config.hpp): an unset or empty
// variable keeps the default, an invalid one is an error naming it.
#include <string>

#include "capalloc/allocator.hpp"
#include "common/config.hpp"

namespace capalloc {

absl::StatusOr<AllocatorOptions> AllocatorOptions::from_env() {
  AllocatorOptions options;
  const absl::StatusOr<std::uint64_t> granularity =
      config::get_number(config::Var::kRoundGranularity);
  if (!granularity.ok()) return granularity.status();
  options.round_granularity = static_cast<std::size_t>(*granularity);
  const absl::StatusOr<std::string> scope = config::get_choice(config::Var::kCaptureGuardScope);
  if (!scope.ok()) return scope.status();
  options.capture_guard_scope =
      *scope == "stream" ? CaptureGuardScope::kStream : CaptureGuardScope::kDevice;
  const absl::StatusOr<std::string> stacks = config::get_choice(config::Var::kStacks);
  if (!stacks.ok()) return stacks.status();
  options.record_stacks = *stacks == "1";
  options.trace_path = config::get_text(config::Var::kTrace);
  return options;
}

}  // namespace capalloc
