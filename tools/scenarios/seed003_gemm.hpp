// tools/scenarios/seed003_gemm.hpp: seed 003's aiter scenario, end to end,
// with capalloc's split-K GEMM: a wrong GEMM result from a semaphore dirtied
// by another graph's replay, and the same scenario done right.
//
// Both arms follow the seed's script: M=1, N=2048, K=2048, split_k=4, fp8
// e4m3 inputs with per-row and per-column scales, bf16 output; a warmup on
// the compute stream; a decoy graph that allocates a 16 MiB transient T and
// its 4-byte sum and frees both mid-capture; then GEMM graph g1 (cache miss)
// and g2 (cache hit), all captured on one side stream into one shared pool.
//   status_quo: a stream-keyed buffer cache, written here as the
//     counter-example, that allocates the workspace and semaphore as ordinary
//     transient allocations, inside g1's capture, and zeroes the semaphore
//     there (so g1 self-heals and g2 does not);
//   capalloc: SplitKGemm, device-keyed persistent buffers preallocated
//     during warmup.
// A trial zeroes the semaphore, replays the decoy once, counts dirty slots,
// poisons the output, replays the GEMM graph and counts wrong outputs.
#ifndef CAPALLOC_TOOLS_SCENARIOS_SEED003_GEMM_HPP_
#define CAPALLOC_TOOLS_SCENARIOS_SEED003_GEMM_HPP_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "capalloc/capture.hpp"
#include "capalloc/runtime.hpp"
#include "tools/scenarios/world_options.hpp"

namespace capalloc::scenarios {

struct GemmGraphOutcome {
  std::string graph;              // "g1" or "g2"
  bool workspace_aliases_decoy = false;
  int sem_slots_dirtied = 0;      // of all kSplitKMaxTiles slots, after one decoy replay
  int sem_slots_dirtied_in_use = 0;  // of the tiles this shape uses
  int wrong_outputs = 0;          // |out - ref| > 0.05
  int total_outputs = 0;
  double max_abs_err = 0;
  bool decoy_replay_refused = false;  // strict mode refused the decoy's replay before this graph's
};

struct GemmArmResult {
  std::string arm;  // "status_quo" or "capalloc"
  std::vector<GemmGraphOutcome> graphs;
  bool strict = false;
  std::vector<Finding> findings_before_replay;
  std::uint32_t dirty_slot_value = 0;  // slot 0 after the decoy replay, as the seed prints it
  bool expected_match = false;
  std::vector<std::string> mismatches;
};

inline constexpr int kGemmM = 1;
inline constexpr int kGemmN = 2048;
inline constexpr int kGemmK = 2048;
inline constexpr int kGemmSplitK = 4;
inline constexpr int kGemmTilesInUse = kGemmN / 64;  // tile_n = 64, M = 1: 32

using GemmScenarioOptions = WorldOptions;  // world_options.hpp

// One arm: the status quo (stream-keyed buffers allocated in the capture) or
// capalloc's (device-keyed, preallocated). `findings_before_replay` is the
// tracker's check() after the three captures. In strict mode the status
// quo's decoy replay (a hazard on the split-K semaphore) is refused, so no
// slot is dirtied and every output is right.
absl::StatusOr<GemmArmResult> run_gemm_arm(bool status_quo, std::shared_ptr<DeviceRuntime> runtime,
                                           GemmScenarioOptions options = {});

}  // namespace capalloc::scenarios

#endif  // CAPALLOC_TOOLS_SCENARIOS_SEED003_GEMM_HPP_
