// The one translation unit that holds Catch2's main(). capalloc's log is
// turned down to errors so that the findings tests provoke on purpose do not
// flood the output; CAPALLOC_LOG_LEVEL still wins when set.
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>

#include <cstdlib>

#include "capalloc/runtime.hpp"

namespace {
const bool quiet_log = [] {
  // Unset or empty is the default (common/config.hpp's policy). Read here
  // directly: the public-API suites link only libcapalloc.so, which does not
  // export the configuration module.
  const char* level = std::getenv("CAPALLOC_LOG_LEVEL");
  if (level == nullptr || *level == '\0') {
    capalloc::set_log_level("error").IgnoreError();
  }
  return true;
}();
}  // namespace
