// common/log.cpp: the library's logger (see log.hpp).
#include "common/log.hpp"

#include <cstdlib>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "capalloc/runtime.hpp"
#include "spdlog/sinks/stdout_color_sinks.h"

namespace capalloc {

namespace detail {

spdlog::logger& log() {
  static const std::shared_ptr<spdlog::logger> logger = []() -> std::shared_ptr<spdlog::logger> {
    // One logger per process: a backend plugin (runtime/plugins.hpp) carries
    // its own copy of this file and finds, through spdlog's registry (in the
    // shared libspdlog), the logger libcapalloc made, level and all.
    if (auto existing = spdlog::get("capalloc")) return existing;
    auto l = spdlog::stderr_color_mt("capalloc");
    l->set_level(spdlog::level::warn);
    if (const char* level = std::getenv("CAPALLOC_LOG_LEVEL"); level != nullptr && *level) {
      const auto parsed = spdlog::level::from_str(level);
      // from_str maps unknown names to "off"; only accept what was asked for.
      if (parsed != spdlog::level::off || std::string(level) == "off") {
        l->set_level(parsed);
      } else {
        l->warn("CAPALLOC_LOG_LEVEL='{}' is not one of trace|debug|info|warn|error|off", level);
      }
    }
    l->set_pattern("[capalloc %l] %v");
    return l;
  }();
  return *logger;
}

}  // namespace detail

absl::Status set_log_level(std::string_view level) {
  const std::string name(level);
  const auto parsed = spdlog::level::from_str(name);
  if (parsed == spdlog::level::off && name != "off") {
    return absl::InvalidArgumentError(
        absl::StrCat("log level '", name, "' is not one of trace|debug|info|warn|error|off"));
  }
  detail::log().set_level(parsed);
  return absl::OkStatus();
}

}  // namespace capalloc
