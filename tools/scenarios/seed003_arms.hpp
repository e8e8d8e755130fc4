// tools/scenarios/seed003_arms.hpp: the four arms of seed 003, replayed with
// capalloc as the allocator, and the fix.
//
// Each arm follows the seed's pure-PyTorch script step by step: N = 262144
// float32 elements (1 MiB), src = 3.0, T = src * 2, a 4-byte sum, canary
// 1234.5, captures on a side stream into a graph pool, replays on the default
// stream. For every arm the result holds whether the addresses alias, the
// tracker's findings at capture end (before any replay), and what the
// replays did to WS; `expected_match` says whether all of it is what the seed
// (and DESIGN.md section 5) expects.
#ifndef CAPALLOC_TOOLS_SCENARIOS_SEED003_ARMS_HPP_
#define CAPALLOC_TOOLS_SCENARIOS_SEED003_ARMS_HPP_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "capalloc/capture.hpp"
#include "capalloc/runtime.hpp"
#include "tools/scenarios/world_options.hpp"

namespace capalloc::scenarios {

inline constexpr std::size_t kArmElements = std::size_t{1} << 18;
inline constexpr float kCanary = 1234.5f;

using ArmsOptions = WorldOptions;  // world_options.hpp

struct ReplayOutcome {
  int graph = 1;  // the seed's numbering: 1 or 2
  int times = 1;
  bool refused = false;  // strict mode refused the replay
  std::string refusal;
  std::uint64_t clobbered = 0;  // elements of WS no longer holding the canary
  std::uint64_t total = kArmElements;
  double value = 0;  // WS[0] after the replays
};

struct ArmResult {
  char arm = 'A';
  std::string title;
  std::string alias_question;  // e.g. "T.ptr == WS.ptr"
  bool alias = false;
  std::vector<Finding> findings_before_replay;
  std::vector<ReplayOutcome> replays;
  std::string expectation;  // what the seed expects, in words
  bool expected_match = false;
  std::vector<std::string> mismatches;
};

struct FixResult {
  bool persistent_refused = false;
  std::string refusal;  // the allocator's error for WS requested persistent in capture
  std::vector<Finding> preallocated_findings;
  ReplayOutcome preallocated;  // arm A with WS preallocated before the capture
  bool expected_match = false;
  std::vector<std::string> mismatches;
};

// Runs arm 'A', 'B', 'C' or 'D' with a fresh allocator and tracker over
// `runtime`. Errors are failures of the machinery, not of the expectation.
absl::StatusOr<ArmResult> run_arm(char arm, std::shared_ptr<DeviceRuntime> runtime,
                                  ArmsOptions options = {});
absl::StatusOr<FixResult> run_fix(std::shared_ptr<DeviceRuntime> runtime, ArmsOptions options = {});

}  // namespace capalloc::scenarios

#endif  // CAPALLOC_TOOLS_SCENARIOS_SEED003_ARMS_HPP_
