// Turns capalloc's log down to errors in test programs, so that the findings
// tests provoke on purpose do not flood the output; CAPALLOC_LOG_LEVEL still
// wins when set. Linked as an object beside Catch2's main()
// (catch_main.cpp) into every test program that links capalloc: its
// static initializer runs before main().
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
