// tools/trace/child_process.hpp: runs a program to completion and returns its
// exit status and what it wrote. `capalloc bench` runs each replay in a child
// so that each allocator is the process's malloc (LD_PRELOAD) and capalloc's
// process-wide allocator starts fresh for every run.
//
// Output goes to anonymous memory files (memfd), not pipes, so a child that
// writes a lot never blocks on a parent that is waiting for it to exit.
#ifndef CAPALLOC_TOOLS_TRACE_CHILD_PROCESS_HPP_
#define CAPALLOC_TOOLS_TRACE_CHILD_PROCESS_HPP_

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace capalloc::trace {

struct ChildResult {
  int exit_code = 0;  // the exit status, or 128 + the signal that ended it
  std::string out;
  std::string err;
};

// Runs argv[0] (looked up in PATH when it has no '/') with argv, in this
// process's environment changed by `env`: a name mapped to a value sets it,
// to nullopt removes it. An error only when the program could not be started.
absl::StatusOr<ChildResult> run_child(const std::vector<std::string>& argv,
                                      const std::map<std::string, std::optional<std::string>>& env);

// The path of the running executable (/proc/self/exe).
std::string self_executable();

}  // namespace capalloc::trace

#endif  // CAPALLOC_TOOLS_TRACE_CHILD_PROCESS_HPP_
