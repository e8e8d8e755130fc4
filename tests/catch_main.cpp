// The one translation unit that holds Catch2's main(). capalloc's log is
// turned down to errors so that the findings tests provoke on purpose do not
// flood the output; CAPALLOC_LOG_LEVEL still wins when set.
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>

#include "capalloc/runtime.hpp"
#include "common/config.hpp"

namespace {
const bool quiet_log = [] {
  if (!capalloc::config::is_set(capalloc::config::Var::kLogLevel)) {
    capalloc::set_log_level("error").IgnoreError();
  }
  return true;
}();
}  // namespace
