// tools/cli_bench.hpp: what `capalloc bench`'s two modes share (timed
// replays, cli_bench.cpp; callgrind counts, cli_bench_callgrind.cpp): the
// allocators, how each one's child process is started, and the trace list.
#ifndef CAPALLOC_TOOLS_CLI_BENCH_HPP_
#define CAPALLOC_TOOLS_CLI_BENCH_HPP_

#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/status/statusor.h"
#include "tools/trace/child_process.hpp"
#include "tools/trace/trace_reader.hpp"

namespace capalloc::cli::bench {

// capalloc and the naive baseline first, then the host allocators, then
// the GPU ones (skipped, with the reason, on a machine without a device):
// capalloc on its cuda runtime, the CUDA runtime's cudaMallocAsync, and
// PyTorch's caching allocator (tools/trace/torch_replay.py).
inline const std::vector<std::string> kAllocators = {
    "capalloc", "naive",         "glibc",           "jemalloc", "mimalloc",
    "tcmalloc", "capalloc-cuda", "cudaMallocAsync", "torch"};

// One allocator as this machine has it.
struct AllocatorSetup {
  std::string name;
  std::string preload;      // the library to LD_PRELOAD ("" for none)
  std::string unavailable;  // why it cannot run here ("" when it can)
  bool host_malloc = false; // glibc, jemalloc, mimalloc, tcmalloc: no captures
  bool gpu = false;         // capalloc-cuda, cudaMallocAsync, torch: device memory
  std::string runtime = "host";        // the child's CAPALLOC_RUNTIME
  std::vector<std::string> command;    // the child's program instead of bench-replay
};

AllocatorSetup setup_allocator(const std::string& name);

// A result as JSON text. Bytes that are not UTF-8 (a trace's file name can
// hold any) become U+FFFD rather than an exception.
inline std::string json_text(const nlohmann::json& j, int indent = -1) {
  return j.dump(indent, ' ', false, nlohmann::json::error_handler_t::replace);
}

// Runs `capalloc bench-replay` for one trace and allocator in a child (under
// `wrapper` first, e.g. valgrind's arguments, when not empty) and returns
// the child's JSON object; an error naming the allocator and the trace when
// it failed, or when its malloc was not the allocator's.
absl::StatusOr<std::string> run_replay_child(const AllocatorSetup& allocator,
                                             const std::string& trace_path, bool counted,
                                             const std::vector<std::string>& wrapper);

// `capalloc bench --callgrind`: instructions per operation for each
// allocator on each trace. Returns the exit status.
int callgrind_command(const std::vector<std::string>& trace_paths,
                      const std::vector<trace::Trace>& traces,
                      const std::vector<std::string>& allocators, bool json);

}  // namespace capalloc::cli::bench

#endif  // CAPALLOC_TOOLS_CLI_BENCH_HPP_
