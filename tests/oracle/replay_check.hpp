// tests/oracle/replay_check.hpp: runs a capture program and checks the
// tracker's verdict against what replay really does to memory.
//
// Harm is measured by difference, not by expectation. For each graph, and
// for each replay order tried (capture order, and for every writing node an
// order that runs it as late as the graph's edges allow), the oracle fills
// every live block with values of its own, replays the graph on the host
// runtime in that order, and compares memory with a de-aliased model run of
// the same nodes in the same order, in which every block, freed ones
// included, has memory of its own:
//   - a live block whose bytes differ was clobbered;
//   - a sink element that differs read wrong data; the live block that holds
//     the address it read is the victim if varying that block's fill alone
//     changes what was read (otherwise the read took data the replay wrote
//     there through another block: no live block's data, no victim).
// The verdict must agree: every harmed (graph, victim) has a finding naming
// them at some severity, a clobber's ranges cover every byte that differs,
// and (declared evidence) every finding names harm the oracle saw. Findings
// of footprint evidence the oracle does not see are counted, not failed.
#ifndef CAPALLOC_TESTS_ORACLE_REPLAY_CHECK_HPP_
#define CAPALLOC_TESTS_ORACLE_REPLAY_CHECK_HPP_

#include <cstdint>
#include <map>
#include <string>

#include "absl/status/statusor.h"
#include "oracle/program.hpp"

namespace capalloc::oracle {

struct OracleStats {
  std::uint64_t graphs = 0;
  std::uint64_t replays = 0;
  std::uint64_t harmed = 0;    // harmed (graph, block) pairs
  std::uint64_t findings = 0;
  // Harm in native captures that allocated nothing: capalloc never saw them.
  std::uint64_t unseen_harm = 0;
  // Findings the replays did not bear out, by evidence name: allowed only
  // where the evidence cannot say (footprint), and reported.
  std::map<std::string, std::uint64_t> unconfirmed;
  // Findings by evidence name, and by severity name.
  std::map<std::string, std::uint64_t> by_evidence;
  std::map<std::string, std::uint64_t> by_severity;
  // "severity: n, ..." of by_severity.
  std::string severities() const;

  void add(const OracleStats& o);
};

// What disagrees, one line each (empty: the verdict agrees with every
// replay); an error when the program could not run.
absl::StatusOr<std::string> check_program(const Program& p, OracleStats* stats = nullptr);

}  // namespace capalloc::oracle

#endif  // CAPALLOC_TESTS_ORACLE_REPLAY_CHECK_HPP_
