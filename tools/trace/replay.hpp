// tools/trace/replay.hpp: one replay run of `capalloc bench`, as its child
// process performs it: a trace through one allocator, warm-up passes, then
// one measured pass, reported as one JSON object on stdout.
//
// A measured pass is either timed (ns per batch of up to kBatchOps
// alloc/free operations, a batch also ending at every capture event; the
// capture events timed one by one) or counted (no clock at all, each
// operation through a non-inlined function, for callgrind: the pass function
// is `counted_replay_pass`, the operations `counted_alloc` and
// `counted_free`, the names `capalloc bench --callgrind` collects).
#ifndef CAPALLOC_TOOLS_TRACE_REPLAY_HPP_
#define CAPALLOC_TOOLS_TRACE_REPLAY_HPP_

#include <string>

#include <nlohmann/json.hpp>

#include "absl/status/statusor.h"

namespace capalloc::trace {

inline constexpr unsigned kBatchOps = 256;

struct ReplayOptions {
  std::string trace_path;
  // capalloc, naive, or a malloc (glibc, jemalloc, mimalloc, tcmalloc: the
  // process runs whichever malloc it was started with).
  std::string allocator;
  bool counted = false;  // a callgrind pass instead of a timed one
  int warmups = 1;
};

// Replays and returns the result object (docs/performance.md lists its
// members); an error when the trace cannot be read or an operation failed.
absl::StatusOr<nlohmann::ordered_json> run_replay(const ReplayOptions& options);

}  // namespace capalloc::trace

#endif  // CAPALLOC_TOOLS_TRACE_REPLAY_HPP_
