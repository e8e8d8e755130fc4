// tools/cli.hpp: the `capalloc` CLI's sub-commands and what they share.
// Each command takes its arguments (after the command name) and returns the
// process exit status: 0 success (and, for scenarios, every observation
// matched), 1 a failure or a mismatch, 2 a usage error.
#ifndef CAPALLOC_TOOLS_CLI_HPP_
#define CAPALLOC_TOOLS_CLI_HPP_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "capalloc/runtime.hpp"

namespace capalloc::cli {

using Args = std::vector<std::string>;

int describe_command(const Args& args);
int arms_command(const Args& args);
int gemm_scenario_command(const Args& args);

// Prints "capalloc: <status>" to stderr and returns 1.
int fail(const absl::Status& status);
// Prints a usage error and returns 2.
int usage_error(const std::string& message);

}  // namespace capalloc::cli

#endif  // CAPALLOC_TOOLS_CLI_HPP_
