// The configuration module (common/config.hpp): each CAPALLOC_* variable
// valid, invalid (kInvalidArgument naming the variable, the value and what is
// accepted) and unset, through the from_env functions that use it; the C
// ABI's start failing the same way on any of them; the README's table
// listing every variable; and no other CAPALLOC_* reading in the sources.
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <optional>
#include <regex>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "capalloc/allocator.hpp"
#include "capalloc/capalloc.h"
#include "capalloc/capture.hpp"
#include "capalloc/runtime.hpp"
#include "common/config.hpp"
#include "test_support.hpp"

using namespace capalloc;
using capalloc::config::Var;
using capalloc::testing::host_runtime;

namespace {

// Sets (or, with nullopt, unsets) a variable for the scope, then restores it.
class ScopedEnv {
 public:
  ScopedEnv(std::string name, std::optional<std::string> value) : name_(std::move(name)) {
    if (const char* old = std::getenv(name_.c_str()); old != nullptr) old_ = old;
    set(value);
  }
  ~ScopedEnv() { set(old_); }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  void set(const std::optional<std::string>& value) {
    if (value) {
      ::setenv(name_.c_str(), value->c_str(), 1);
    } else {
      ::unsetenv(name_.c_str());
    }
  }
  std::string name_;
  std::optional<std::string> old_;
};

std::string message_of(const absl::Status& s) { return std::string(s.message()); }

// The status must be kInvalidArgument and name the variable, the value and
// what is accepted.
void check_invalid(const absl::Status& s, const std::string& name, const std::string& value,
                   const std::string& accepted) {
  INFO(s.ToString());
  CHECK(s.code() == absl::StatusCode::kInvalidArgument);
  CHECK_THAT(message_of(s), Catch::Contains(name + "='" + value + "'"));
  CHECK_THAT(message_of(s), Catch::Contains("accepted: " + accepted));
}

const std::string kGranularityRange = "a power of two from 256 to 2097152 (bytes)";

}  // namespace

TEST_CASE("config: the table lists each variable once, in the order of Var", "[config]") {
  std::vector<std::string> names;
  for (std::size_t i = 0; i < config::variables().size(); ++i) {
    const config::Variable& v = config::variables()[i];
    CHECK(static_cast<std::size_t>(v.id) == i);
    CHECK(&config::variable(v.id) == &v);
    CHECK(v.name.starts_with("CAPALLOC_"));
    CHECK_FALSE(v.meaning.empty());
    CHECK_FALSE(v.read_by.empty());
    // A default, where there is one, is itself a valid value.
    if (!v.default_value.empty()) CHECK(config::problem(v, v.default_value).empty());
    names.emplace_back(v.name);
  }
  std::sort(names.begin(), names.end());
  CHECK(std::adjacent_find(names.begin(), names.end()) == names.end());
}

TEST_CASE("config: numbers are checked whole", "[config]") {
  const config::Variable& v = config::variable(Var::kRoundGranularity);
  CHECK(*config::parse_number(v, "256") == 256);
  CHECK(*config::parse_number(v, "2097152") == 2097152);
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"", "is empty"},
      {"-512", "is negative"},
      {"+512", "is not a whole decimal number"},
      {" 512", "is not a whole decimal number"},
      {"512 ", "is not a whole decimal number"},
      {"512x", "is not a whole decimal number"},
      {"0x200", "is not a whole decimal number"},
      {"5.12e2", "is not a whole decimal number"},
      {"99999999999999999999999", "is too large"},
      {"128", "is too small"},
      {"4194304", "is too large"},
      {"1000", "is not a power of two"},
  };
  for (const auto& [text, why] : bad) {
    INFO("'" << text << "'");
    CHECK(config::problem(v, text) == why);
    const auto n = config::parse_number(v, text);
    check_invalid(n.status(), "CAPALLOC_ROUND_GRANULARITY", text, kGranularityRange);
    CHECK_THAT(message_of(n.status()), Catch::Contains(why));
  }
  // A choice is not a number.
  CHECK(config::parse_number(config::variable(Var::kRuntime), "1").status().code() ==
        absl::StatusCode::kInvalidArgument);
}

TEST_CASE("config: CAPALLOC_RUNTIME", "[config]") {
  const std::string accepted = "one of auto, host, cuda, hip";
  CHECK(config::accepted(config::variable(Var::kRuntime)) == accepted);
  {
    ScopedEnv env("CAPALLOC_RUNTIME", std::nullopt);
    CHECK(*config::get_choice(Var::kRuntime) == "auto");
    CHECK_FALSE(config::is_set(Var::kRuntime));
  }
  {
    ScopedEnv env("CAPALLOC_RUNTIME", "");
    CHECK(*config::get_choice(Var::kRuntime) == "auto");
    CHECK_FALSE(config::is_set(Var::kRuntime));
  }
  for (const char* kind : {"auto", "host", "cuda", "hip"}) {
    ScopedEnv env("CAPALLOC_RUNTIME", kind);
    CHECK(*config::get_choice(Var::kRuntime) == kind);
    CHECK(config::is_set(Var::kRuntime));
  }
  for (const char* bad : {"gpu", "Host", "host "}) {
    ScopedEnv env("CAPALLOC_RUNTIME", bad);
    check_invalid(config::get_choice(Var::kRuntime).status(), "CAPALLOC_RUNTIME", bad, accepted);
  }
}

TEST_CASE("config: CAPALLOC_ROUND_GRANULARITY through AllocatorOptions::from_env",
          "[config]") {
  {
    ScopedEnv env("CAPALLOC_ROUND_GRANULARITY", std::nullopt);
    REQUIRE_OK(AllocatorOptions::from_env());
    CHECK(AllocatorOptions::from_env()->round_granularity == AllocatorOptions{}.round_granularity);
  }
  {
    ScopedEnv env("CAPALLOC_ROUND_GRANULARITY", "");
    CHECK(AllocatorOptions::from_env()->round_granularity == 512);
  }
  for (std::size_t ok : {std::size_t{256}, std::size_t{4096}, std::size_t{2} << 20}) {
    ScopedEnv env("CAPALLOC_ROUND_GRANULARITY", std::to_string(ok));
    auto options = AllocatorOptions::from_env();
    REQUIRE_OK(options);
    CHECK(options->round_granularity == ok);
    // Every value the variable accepts makes an allocator.
    CHECK_OK(Allocator::create(host_runtime(), *options));
  }
  for (const char* bad : {"4194304", "1000", "128", "-512", "512B", "18446744073709551616"}) {
    ScopedEnv env("CAPALLOC_ROUND_GRANULARITY", bad);
    check_invalid(AllocatorOptions::from_env().status(), "CAPALLOC_ROUND_GRANULARITY", bad,
                  kGranularityRange);
  }
  // The table's limit is the allocator's: the next power of two is refused
  // by Allocator::create too, with a message that says why.
  AllocatorOptions too_big;
  too_big.round_granularity = std::size_t{4} << 20;
  auto a = Allocator::create(host_runtime(), too_big);
  CHECK(a.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK_THAT(message_of(a.status()), Catch::Contains("must divide the segment sizes"));
  CHECK(config::variable(Var::kRoundGranularity).max == AllocatorOptions{}.small_segment_bytes);
}

TEST_CASE("config: CAPALLOC_CAPTURE_GUARD_SCOPE through AllocatorOptions::from_env",
          "[config]") {
  {
    ScopedEnv env("CAPALLOC_CAPTURE_GUARD_SCOPE", std::nullopt);
    CHECK(AllocatorOptions::from_env()->capture_guard_scope == CaptureGuardScope::kDevice);
  }
  {
    ScopedEnv env("CAPALLOC_CAPTURE_GUARD_SCOPE", "stream");
    CHECK(AllocatorOptions::from_env()->capture_guard_scope == CaptureGuardScope::kStream);
  }
  {
    ScopedEnv env("CAPALLOC_CAPTURE_GUARD_SCOPE", "device");
    CHECK(AllocatorOptions::from_env()->capture_guard_scope == CaptureGuardScope::kDevice);
  }
  ScopedEnv env("CAPALLOC_CAPTURE_GUARD_SCOPE", "process");
  check_invalid(AllocatorOptions::from_env().status(), "CAPALLOC_CAPTURE_GUARD_SCOPE", "process",
                "one of device, stream");
}

TEST_CASE("config: CAPALLOC_STRICT through TrackerOptions::from_env", "[config]") {
  {
    ScopedEnv env("CAPALLOC_STRICT", std::nullopt);
    auto o = TrackerOptions::from_env();
    REQUIRE_OK(o);
    CHECK_FALSE(o->strict);
    CHECK_FALSE(o->strict_possible);
  }
  const std::vector<std::tuple<std::string, bool, bool>> good = {
      {"0", false, false}, {"1", true, false}, {"possible", true, true}};
  for (const auto& [value, strict, possible] : good) {
    ScopedEnv env("CAPALLOC_STRICT", value);
    auto o = TrackerOptions::from_env();
    REQUIRE_OK(o);
    CHECK(o->strict == strict);
    CHECK(o->strict_possible == possible);
  }
  for (const char* bad : {"yes", "true", "2", "01"}) {
    ScopedEnv env("CAPALLOC_STRICT", bad);
    check_invalid(TrackerOptions::from_env().status(), "CAPALLOC_STRICT", bad,
                  "one of 0, 1, possible");
  }
}

TEST_CASE("config: CAPALLOC_LOG_LEVEL through log_level_from_env", "[config]") {
  {
    ScopedEnv env("CAPALLOC_LOG_LEVEL", std::nullopt);
    CHECK(*log_level_from_env() == "warn");
  }
  for (const char* level : {"trace", "debug", "info", "warn", "error", "off"}) {
    ScopedEnv env("CAPALLOC_LOG_LEVEL", level);
    CHECK(*log_level_from_env() == level);
    CHECK_OK(set_log_level(level));
  }
  const std::string accepted = "one of trace, debug, info, warn, error, off";
  for (const char* bad : {"verbose", "warning", "WARN"}) {
    ScopedEnv env("CAPALLOC_LOG_LEVEL", bad);
    check_invalid(log_level_from_env().status(), "CAPALLOC_LOG_LEVEL", bad, accepted);
    // set_log_level accepts the same names.
    CHECK(set_log_level(bad).code() == absl::StatusCode::kInvalidArgument);
    CHECK_THAT(message_of(set_log_level(bad)), Catch::Contains(accepted));
  }
  set_log_level("error").IgnoreError();
}

TEST_CASE("config: the tools' and tests' variables", "[config]") {
  {
    ScopedEnv env("CAPALLOC_CUBLAS_LIBRARY", std::nullopt);
    CHECK(config::get_text(Var::kCublasLibrary) == "libcublas.so.13");
  }
  {
    ScopedEnv env("CAPALLOC_CUBLAS_LIBRARY", "/opt/cuda/lib64/libcublas.so");
    CHECK(config::get_text(Var::kCublasLibrary) == "/opt/cuda/lib64/libcublas.so");
  }
  {
    ScopedEnv env("CAPALLOC_ORACLE_PROGRAMS", std::nullopt);
    CHECK(*config::get_number(Var::kOraclePrograms) == 10000);
    CHECK(*config::get_number(Var::kOracleSeed) == 1);
    CHECK(*config::get_number(Var::kOracleFirst) == 0);
  }
  {
    ScopedEnv env("CAPALLOC_ORACLE_PROGRAMS", "200000");
    CHECK(*config::get_number(Var::kOraclePrograms) == 200000);
  }
  for (const char* bad : {"0", "1e5", "-3", "10k"}) {
    ScopedEnv env("CAPALLOC_ORACLE_PROGRAMS", bad);
    check_invalid(config::get_number(Var::kOraclePrograms).status(), "CAPALLOC_ORACLE_PROGRAMS",
                  bad, "an integer from 1 to 1000000000000");
  }
  {
    ScopedEnv env("CAPALLOC_ORACLE_SEED", "18446744073709551615");
    CHECK(*config::get_number(Var::kOracleSeed) == 18446744073709551615u);
  }
}

// The C ABI's process-wide allocator starts once per process, so each case
// runs in a child process: the error of its first call, which every later
// call repeats.
namespace {

std::string c_abi_start_error(const std::vector<std::pair<std::string, std::string>>& env) {
  int fds[2];
  REQUIRE(::pipe(fds) == 0);
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    ::close(fds[0]);
    for (const auto& [name, value] : env) ::setenv(name.c_str(), value.c_str(), 1);
    void* p = nullptr;
    std::string out;
    if (capalloc_malloc(&p, 256, 0, nullptr) == CAPALLOC_OK) {
      out = "started";
    } else {
      out = capalloc_last_error();
      // The same error again: the process does not retry.
      if (capalloc_malloc(&p, 256, 0, nullptr) == CAPALLOC_OK ||
          out != capalloc_last_error()) {
        out = "not repeated: " + out;
      }
    }
    const ssize_t written = ::write(fds[1], out.data(), out.size());
    ::_exit(written == static_cast<ssize_t>(out.size()) ? 0 : 1);
  }
  ::close(fds[1]);
  std::string out;
  char buf[512];
  for (ssize_t n; (n = ::read(fds[0], buf, sizeof buf)) > 0;) out.append(buf, static_cast<std::size_t>(n));
  ::close(fds[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
  return out;
}

}  // namespace

TEST_CASE("config: the C ABI fails to start on any invalid variable, the same way",
          "[config][c_api]") {
  CHECK(c_abi_start_error({{"CAPALLOC_RUNTIME", "host"}}) == "started");
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"CAPALLOC_RUNTIME", "gpu"},
      {"CAPALLOC_ROUND_GRANULARITY", "4194304"},
      {"CAPALLOC_CAPTURE_GUARD_SCOPE", "process"},
      {"CAPALLOC_STRICT", "yes"},
      {"CAPALLOC_LOG_LEVEL", "verbose"},
      {"CAPALLOC_STACKS", "yes"},
  };
  for (const auto& [name, value] : bad) {
    INFO(name << "=" << value);
    std::vector<std::pair<std::string, std::string>> env = {{"CAPALLOC_RUNTIME", "host"}};
    env.emplace_back(name, value);
    const std::string error = c_abi_start_error(env);
    CHECK_FALSE(error.starts_with("not repeated"));
    CHECK(error != "started");
    CHECK_THAT(error, Catch::Contains(name + "='" + value + "'"));
    for (const config::Variable& v : config::variables()) {
      if (v.name == name) CHECK_THAT(error, Catch::Contains("accepted: " + config::accepted(v)));
    }
  }
}

// README.md's configuration table: one row per variable of the module's table
// (and no other), each with the variable's default and accepted values, so
// that the two cannot drift apart.
TEST_CASE("config: README.md's table lists every variable", "[config][docs]") {
  std::ifstream in(std::filesystem::path(CAPALLOC_SOURCE_DIR) / "README.md");
  REQUIRE(in.good());
  std::vector<std::string> rows;
  bool in_section = false;
  for (std::string line; std::getline(in, line);) {
    if (line.starts_with("## ")) in_section = line == "## Configuration";
    if (in_section && line.starts_with("| `CAPALLOC_")) rows.push_back(line);
  }
  REQUIRE_FALSE(rows.empty());
  for (const config::Variable& v : config::variables()) {
    INFO(v.name);
    const std::string start = "| `" + std::string(v.name) + "` |";
    const auto row = std::find_if(rows.begin(), rows.end(),
                                  [&](const std::string& r) { return r.starts_with(start); });
    REQUIRE(row != rows.end());
    if (!v.default_value.empty()) {
      CHECK_THAT(*row, Catch::Contains("`" + std::string(v.default_value) + "`"));
    }
    for (std::string_view choice : v.choices) {
      CHECK_THAT(*row, Catch::Contains("`" + std::string(choice) + "`"));
    }
    if (v.kind == config::Kind::kNumber) {
      CHECK_THAT(*row, Catch::Contains(std::to_string(v.min)));
      CHECK_THAT(*row, Catch::Contains(std::to_string(v.max)));
    }
  }
  for (const std::string& r : rows) {
    INFO(r);
    CHECK(std::any_of(config::variables().begin(), config::variables().end(),
                      [&](const config::Variable& v) {
                        return r.starts_with("| `" + std::string(v.name) + "` |");
                      }));
  }
}

// Only common/config.cpp reads CAPALLOC_* variables from the environment in
// capalloc's C++ sources (the Python module reads CAPALLOC_LIBRARY itself).
TEST_CASE("config: no other C++ source reads a CAPALLOC_* variable", "[config]") {
  const std::filesystem::path root(CAPALLOC_SOURCE_DIR);
  const std::regex read(R"(getenv\s*\(\s*"CAPALLOC_)");
  std::vector<std::string> readers;
  for (const char* dir : {"allocator", "c_api", "capture", "common", "gemm", "runtime", "tools",
                          "tests", "include"}) {
    for (const auto& entry : std::filesystem::recursive_directory_iterator(root / dir)) {
      const std::string ext = entry.path().extension().string();
      if (ext != ".cpp" && ext != ".hpp" && ext != ".h" && ext != ".cu") continue;
      std::ifstream f(entry.path());
      std::stringstream text;
      text << f.rdbuf();
      if (std::regex_search(text.str(), read)) {
        readers.push_back(std::filesystem::relative(entry.path(), root).string());
      }
    }
  }
  CHECK(readers == std::vector<std::string>{});
}

TEST_CASE("config: CAPALLOC_STACKS and CAPALLOC_TRACE through AllocatorOptions::from_env",
          "[config]") {
  const std::string path =
      (std::filesystem::temp_directory_path() /
       ("capalloc_config_trace_" + std::to_string(::getpid()) + ".jsonl"))
          .string();
  {
    ScopedEnv stacks("CAPALLOC_STACKS", "1");
    ScopedEnv trace("CAPALLOC_TRACE", path);
    auto options = AllocatorOptions::from_env();
    REQUIRE(options.ok());
    CHECK(options->record_stacks);
    CHECK(options->trace_path == path);
    auto a = Allocator::create(host_runtime(), *options);
    REQUIRE(a.ok());
    CHECK((*a)->record_stacks());
    CHECK((*a)->trace_path() == path);
    REQUIRE((*a)->stop_trace().ok());
  }
  {
    ScopedEnv stacks("CAPALLOC_STACKS", std::nullopt);
    ScopedEnv trace("CAPALLOC_TRACE", std::nullopt);
    auto options = AllocatorOptions::from_env();
    REQUIRE(options.ok());
    CHECK_FALSE(options->record_stacks);
    CHECK(options->trace_path.empty());
  }
  {
    ScopedEnv stacks("CAPALLOC_STACKS", "yes");
    check_invalid(AllocatorOptions::from_env().status(), "CAPALLOC_STACKS", "yes", "one of 0, 1");
  }
  std::filesystem::remove(path);
}
