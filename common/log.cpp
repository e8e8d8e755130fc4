// common/log.cpp: the library's logger (see log.hpp).
#include "common/log.hpp"

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "capalloc/runtime.hpp"
#include "common/config.hpp"
#include "spdlog/sinks/stdout_color_sinks.h"

namespace capalloc {

namespace detail {

spdlog::logger& log() {
  // Never destroyed, like the process-wide allocator: exit handlers (the C
  // ABI's release-queue drain) and static destructors of the host
  // application log after this function's statics would have gone, and the
  // shared_ptr keeps the logger's sinks alive past spdlog's registry.
  static const std::shared_ptr<spdlog::logger>& logger = *new std::shared_ptr<spdlog::logger>(
      []() -> std::shared_ptr<spdlog::logger> {
    // One logger per process: a backend plugin (runtime/plugins.hpp) carries
    // its own copy of this file and finds, through spdlog's registry (in the
    // shared libspdlog), the logger libcapalloc made, level and all.
    if (auto existing = spdlog::get("capalloc")) return existing;
    auto l = spdlog::stderr_color_mt("capalloc");
    l->set_level(spdlog::level::warn);
    l->set_pattern("[capalloc %l] %v");
    // The one reading of CAPALLOC_LOG_LEVEL (config.hpp's policy). The
    // logger cannot fail, so an invalid value keeps "warn" and says so; the
    // C ABI and the CLI refuse to start on it (log_level_from_env).
    if (absl::StatusOr<std::string> level = log_level_from_env(); level.ok()) {
      l->set_level(spdlog::level::from_str(*level));
    } else {
      l->error("{}", std::string(level.status().message()));
    }
    return l;
  }());
  return *logger;
}

}  // namespace detail

absl::Status set_log_level(std::string_view level) {
  const config::Variable& v = config::variable(config::Var::kLogLevel);
  if (!config::problem(v, level).empty()) {
    return absl::InvalidArgumentError(absl::StrCat("log level '", std::string(level),
                                                   "' is not ", config::accepted(v)));
  }
  detail::log().set_level(spdlog::level::from_str(std::string(level)));
  return absl::OkStatus();
}

absl::StatusOr<std::string> log_level_from_env() {
  return config::get_choice(config::Var::kLogLevel);
}

}  // namespace capalloc
