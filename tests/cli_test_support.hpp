// tests/cli_test_support.hpp: what the cli_test suites share: the CLI run
// as a program (the built binary, CAPALLOC_CLI_PATH) and a check of its exit
// status that shows its output when it fails.
#ifndef CAPALLOC_TESTS_CLI_TEST_SUPPORT_HPP_
#define CAPALLOC_TESTS_CLI_TEST_SUPPORT_HPP_

#include <string>
#include <utility>
#include <vector>

#include "run_program.hpp"

namespace capalloc::testing {

using Run = ProgramRun;

// The CLI with `args`, in this environment minus CAPALLOC_* plus `env`.
inline Run capalloc_cli(const std::vector<std::string>& args,
                        const std::vector<std::pair<std::string, std::string>>& env = {}) {
  return run_program(CAPALLOC_CLI_PATH, args, env);
}

}  // namespace capalloc::testing

#define CHECK_RUN(run, code)                                      \
  do {                                                            \
    INFO("stdout:\n" << (run).out << "\nstderr:\n" << (run).err); \
    CHECK((run).exit_code == (code));                             \
  } while (0)

#endif  // CAPALLOC_TESTS_CLI_TEST_SUPPORT_HPP_
