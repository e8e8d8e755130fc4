// tests/fault_injection/scenarios.cpp: the fixed scenarios the fault
// injection test sweeps (tests/fault_injection_test.cpp): seed 003's four
// arms and the fix, and the GEMM scenario's two arms.
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "fault_injection/harness.hpp"
#include "tools/scenarios/seed003_arms.hpp"
#include "tools/scenarios/seed003_gemm.hpp"

namespace capalloc::fault_test {

// Seed 003's four arms, then the fix, each with its own allocator and
// tracker over the one runtime, stopping at the first error.
absl::Status arms_scenario(Harness& h) {
  capalloc::scenarios::ArmsOptions options;
  options.observer = h.observer();
  for (char arm : {'A', 'B', 'C', 'D'}) {
    auto r = capalloc::scenarios::run_arm(arm, h.rt, options);
    if (!r.ok()) return r.status();
    if (!r->expected_match) {
      h.mismatches.push_back(absl::StrCat("arm ", std::string(1, arm), ": ",
                                          absl::StrJoin(r->mismatches, "; ")));
    }
  }
  auto fix = capalloc::scenarios::run_fix(h.rt, options);
  if (!fix.ok()) return fix.status();
  if (!fix->expected_match) {
    h.mismatches.push_back(absl::StrCat("fix: ", absl::StrJoin(fix->mismatches, "; ")));
  }
  return absl::OkStatus();
}

namespace {

// The GEMM scenario's two arms, swept apart: the status quo (stream-keyed
// buffers allocated in the capture) and capalloc's (SplitKGemm, persistent
// buffers preallocated during warmup).
absl::Status gemm_arm(Harness& h, bool status_quo) {
  capalloc::scenarios::GemmScenarioOptions options;
  options.observer = h.observer();
  auto r = capalloc::scenarios::run_gemm_arm(status_quo, h.rt, options);
  if (!r.ok()) return r.status();
  if (!r->expected_match) {
    h.mismatches.push_back(absl::StrCat(r->arm, ": ", absl::StrJoin(r->mismatches, "; ")));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status gemm_status_quo(Harness& h) { return gemm_arm(h, true); }
absl::Status gemm_capalloc(Harness& h) { return gemm_arm(h, false); }

}  // namespace capalloc::fault_test
