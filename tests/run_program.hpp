// tests/run_program.hpp: runs a built program (the CLI) as a child process
// and returns its exit status and output; shared by cli_test and
// errors_doc_test.
#ifndef CAPALLOC_TESTS_RUN_PROGRAM_HPP_
#define CAPALLOC_TESTS_RUN_PROGRAM_HPP_

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>

#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

extern char** environ;

namespace capalloc::testing {

struct ProgramRun {
  int exit_code = -1;  // -1 when it did not exit normally (a signal)
  std::string out;
  std::string err;
};

inline std::string read_whole_file(const std::string& path) {
  std::ifstream f(path);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

// Runs `program` with `args` in this process's environment minus every
// CAPALLOC_* variable (so the caller's shell cannot change what a test
// sees), plus `env`; waits for it and returns its status, stdout and stderr.
inline ProgramRun run_program(const std::string& program, const std::vector<std::string>& args,
                              const std::vector<std::pair<std::string, std::string>>& env = {}) {
  std::vector<std::string> env_strings;
  for (char** e = environ; *e != nullptr; ++e) {
    if (std::strncmp(*e, "CAPALLOC_", 9) != 0) env_strings.emplace_back(*e);
  }
  for (const auto& [name, value] : env) env_strings.push_back(name + "=" + value);
  std::vector<char*> envp;
  for (std::string& s : env_strings) envp.push_back(s.data());
  envp.push_back(nullptr);
  std::vector<std::string> argv_strings = {program};
  argv_strings.insert(argv_strings.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& s : argv_strings) argv.push_back(s.data());
  argv.push_back(nullptr);

  char out_path[] = "/tmp/capalloc_run_program_out_XXXXXX";
  char err_path[] = "/tmp/capalloc_run_program_err_XXXXXX";
  const int out_fd = ::mkstemp(out_path);
  const int err_fd = ::mkstemp(err_path);
  REQUIRE(out_fd >= 0);
  REQUIRE(err_fd >= 0);
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    ::dup2(out_fd, STDOUT_FILENO);
    ::dup2(err_fd, STDERR_FILENO);
    ::execve(argv[0], argv.data(), envp.data());
    ::_exit(127);
  }
  ::close(out_fd);
  ::close(err_fd);
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  ProgramRun r;
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.out = read_whole_file(out_path);
  r.err = read_whole_file(err_path);
  ::unlink(out_path);
  ::unlink(err_path);
  return r;
}

}  // namespace capalloc::testing

#endif  // CAPALLOC_TESTS_RUN_PROGRAM_HPP_
