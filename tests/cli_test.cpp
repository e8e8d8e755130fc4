// The `capalloc` CLI run as a program (the built binary, CAPALLOC_CLI_PATH):
// --help on the program and every command, missing, invalid and unknown
// arguments (exit 2 with CLI11's message), the CAPALLOC_* variables honoured
// and flags overriding them.
#include <filesystem>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "cli_test_support.hpp"
#include "test_support.hpp"

namespace {

using capalloc::testing::capalloc_cli;
using capalloc::testing::Run;
using Catch::Contains;

}  // namespace

TEST_CASE("cli: --help on the program lists the commands", "[cli]") {
  for (const char* help : {"--help", "-h"}) {
    const Run r = capalloc_cli({help});
    CHECK_RUN(r, 0);
    CHECK_THAT(r.out, Contains("arms"));
    CHECK_THAT(r.out, Contains("gemm-scenario"));
    CHECK_THAT(r.out, Contains("describe"));
    CHECK_THAT(r.out, Contains("bench"));
    CHECK_THAT(r.out, !Contains("bench-replay"));  // the bench's child, not for users
  }
}

TEST_CASE("cli: --help on every command lists its flags and their variables", "[cli]") {
  const std::vector<std::pair<std::string, std::vector<std::string>>> commands = {
      {"arms",
       {"--arm", "--json", "--runtime", "--round-granularity", "--capture-guard-scope", "--strict",
        "--log-level", "CAPALLOC_RUNTIME", "CAPALLOC_ROUND_GRANULARITY",
        "CAPALLOC_CAPTURE_GUARD_SCOPE", "CAPALLOC_STRICT", "CAPALLOC_LOG_LEVEL"}},
      {"gemm-scenario",
       {"--json", "--runtime", "--round-granularity", "--capture-guard-scope", "--strict",
        "--log-level", "CAPALLOC_STRICT"}},
      {"describe", {"--runtime", "--round-granularity", "--log-level", "CAPALLOC_RUNTIME"}},
      {"stress", {"--ops", "--seed", "--threads", "--json", "--log-level"}},
      {"bench", {"--json", "--repetitions", "--allocators", "--callgrind"}},
  };
  for (const auto& [command, flags] : commands) {
    INFO(command);
    const Run r = capalloc_cli({command, "--help"});
    CHECK_RUN(r, 0);
    for (const std::string& flag : flags) CHECK_THAT(r.out, Contains(flag));
  }
}

TEST_CASE("cli: usage errors exit 2 with CLI11's message", "[cli]") {
  SECTION("no command") {
    const Run r = capalloc_cli({});
    CHECK_RUN(r, 2);
    CHECK_THAT(r.err, Contains("A command (arms, gemm-scenario, describe, stress, report, bench or audit) is required"));
  }
  SECTION("stress with no thread") {
    const Run r = capalloc_cli({"stress", "--ops", "10", "--threads", "0"});
    CHECK_RUN(r, 2);
    CHECK_THAT(r.err, Contains("--threads"));
  }
  SECTION("unknown command") {
    const Run r = capalloc_cli({"frobnicate"});
    CHECK_RUN(r, 2);
    CHECK_THAT(r.err, Contains("frobnicate"));
  }
  SECTION("unknown flag") {
    const Run r = capalloc_cli({"arms", "--frobnicate"});
    CHECK_RUN(r, 2);
    CHECK_THAT(r.err, Contains("--frobnicate"));
  }
  SECTION("a missing value names the option and says it needs one") {
    for (const char* option : {"--arm", "--runtime", "--round-granularity", "--log-level"}) {
      INFO(option);
      const Run r = capalloc_cli({"arms", option});
      CHECK_RUN(r, 2);
      CHECK_THAT(r.err, Contains(option));
      CHECK_THAT(r.err, Contains("required"));
      CHECK_THAT(r.err, !Contains("unknown argument"));
    }
  }
  SECTION("invalid values") {
    const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
        {{"arms", "--arm", "E"}, "--arm"},
        {{"arms", "--runtime", "gpu"}, "--runtime"},
        {{"arms", "--strict=yes"}, "--strict"},
        {{"gemm-scenario", "--capture-guard-scope", "process"}, "--capture-guard-scope"},
        {{"describe", "--log-level", "loud"}, "--log-level"},
        {{"describe", "--round-granularity", "3000"}, "is not a power of two"},
        {{"describe", "--round-granularity", "4194304"}, "is too large"},
        {{"describe", "--round-granularity", "512x"}, "is not a whole decimal number"},
        {{"describe", "--round-granularity=-512"}, "is negative"},
        {{"describe", "--round-granularity", "99999999999999999999999"}, "is too large"},
    };
    for (const auto& [args, message] : cases) {
      INFO(args.back());
      const Run r = capalloc_cli(args);
      CHECK_RUN(r, 2);
      CHECK_THAT(r.err, Contains(message));
    }
    const Run r = capalloc_cli({"describe", "--round-granularity", "3000"});
    CHECK_THAT(r.err, Contains("a power of two from 256 to 2097152"));
  }
  // Break test 13, item 4: CLI11 wrapped -1 to a huge size_t and clamped an
  // overflowing number, silently; an empty --report wrote nothing, exit 0.
  SECTION("numbers that are negative or too large, and an empty directory") {
    const std::string file = CAPALLOC_CLI_PATH;  // any existing file: refused before it is read
    const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
        {{"report", file, "--max-blocks", "-1"}, "'-1' is not an unsigned decimal number"},
        {{"report", file, "--max-blocks=-1"}, "'-1' is not an unsigned decimal number"},
        {{"report", file, "--max-blocks", "99999999999999999999"}, "is not an unsigned decimal"},
        {{"report", file, "--max-blocks", "1099511627777"}, "is above the largest value"},
        {{"audit", "--trace", file, "--since", "99999999999999999999"},
         "is not an unsigned decimal number of at most 18446744073709551615"},
        {{"audit", "--trace", file, "--since", "-3"}, "is not an unsigned decimal"},
        {{"arms", "--report", ""}, "--report: the directory is empty"},
        {{"gemm-scenario", "--report", ""}, "--report: the directory is empty"},
    };
    for (const auto& [args, message] : cases) {
      INFO(args[0] << " " << args[args.size() - 2] << " " << args.back());
      const Run r = capalloc_cli(args);
      CHECK_RUN(r, 2);
      CHECK_THAT(r.err, Contains(message));
    }
  }
  SECTION("report --help says it takes one or two inputs") {
    const Run r = capalloc_cli({"report", "--help"});
    CHECK_RUN(r, 0);
    CHECK_THAT(r.out, Contains("inputs(1-2x)"));
  }
}

TEST_CASE("cli: the CAPALLOC_* variables are honoured, and flags override them", "[cli]") {
  SECTION("CAPALLOC_ROUND_GRANULARITY and --round-granularity") {
    const Run from_env =
        capalloc_cli({"describe", "--runtime", "host"}, {{"CAPALLOC_ROUND_GRANULARITY", "4096"}});
    CHECK_RUN(from_env, 0);
    CHECK_THAT(from_env.out, Contains("sizes round to 4.00 KiB"));
    const Run flag = capalloc_cli({"describe", "--runtime", "host", "--round-granularity", "1024"},
                                  {{"CAPALLOC_ROUND_GRANULARITY", "4096"}});
    CHECK_RUN(flag, 0);
    CHECK_THAT(flag.out, Contains("sizes round to 1.00 KiB"));
    const Run neither = capalloc_cli({"describe", "--runtime", "host"});
    CHECK_THAT(neither.out, Contains("sizes round to 512 B"));
  }
  SECTION("CAPALLOC_RUNTIME and --runtime") {
    const Run from_env = capalloc_cli({"describe"}, {{"CAPALLOC_RUNTIME", "host"}});
    CHECK_RUN(from_env, 0);
    CHECK_THAT(from_env.out, Contains("capalloc on the host runtime"));
    const Run bad = capalloc_cli({"describe"}, {{"CAPALLOC_RUNTIME", "gpu"}});
    CHECK_RUN(bad, 2);
    CHECK_THAT(bad.err, Contains("CAPALLOC_RUNTIME='gpu'"));
    CHECK_THAT(bad.err, Contains("one of auto, host, cuda, hip"));
    const Run flag = capalloc_cli({"describe", "--runtime", "host"}, {{"CAPALLOC_RUNTIME", "gpu"}});
    CHECK_RUN(flag, 0);
  }
  SECTION("CAPALLOC_STRICT and --strict") {
    const Run from_env = capalloc_cli({"arms", "--arm", "A", "--runtime", "host", "--json"},
                                      {{"CAPALLOC_STRICT", "1"}});
    CHECK_RUN(from_env, 0);
    CHECK_THAT(from_env.out, Contains("\"strict\":true"));
    const Run flag_off =
        capalloc_cli({"arms", "--arm", "A", "--runtime", "host", "--json", "--strict=0"},
                     {{"CAPALLOC_STRICT", "1"}});
    CHECK_RUN(flag_off, 0);
    CHECK_THAT(flag_off.out, Contains("\"strict\":false"));
    const Run flag_on = capalloc_cli({"arms", "--arm", "A", "--runtime", "host", "--strict"});
    CHECK_RUN(flag_on, 0);
    CHECK_THAT(flag_on.out, Contains("(strict mode)"));
    const Run possible =
        capalloc_cli({"arms", "--arm", "A", "--runtime", "host"}, {{"CAPALLOC_STRICT", "possible"}});
    CHECK_RUN(possible, 0);
    CHECK_THAT(possible.out, Contains("(strict mode, possible findings too)"));
    const Run bad = capalloc_cli({"arms", "--arm", "A", "--runtime", "host"},
                                 {{"CAPALLOC_STRICT", "yes"}});
    CHECK_RUN(bad, 2);
    CHECK_THAT(bad.err, Contains("CAPALLOC_STRICT='yes'"));
    CHECK_THAT(bad.err, Contains("one of 0, 1, possible"));
  }
  SECTION("CAPALLOC_LOG_LEVEL and --log-level") {
    const Run bad = capalloc_cli({"describe", "--runtime", "host"}, {{"CAPALLOC_LOG_LEVEL", "loud"}});
    CHECK_RUN(bad, 2);
    CHECK_THAT(bad.err, Contains("CAPALLOC_LOG_LEVEL='loud'"));
    const Run flag = capalloc_cli({"describe", "--runtime", "host", "--log-level", "off"},
                                  {{"CAPALLOC_LOG_LEVEL", "loud"}});
    CHECK_RUN(flag, 0);
    // A level from the variable reaches the logger: runtime 'auto' says at
    // info which runtime it chose; the flag wins; the CLI's default is quiet.
    const Run info = capalloc_cli({"describe"}, {{"CAPALLOC_LOG_LEVEL", "info"}});
    CHECK_RUN(info, 0);
    CHECK_THAT(info.err, Contains("runtime 'auto'"));
    const Run off = capalloc_cli({"describe", "--log-level", "off"}, {{"CAPALLOC_LOG_LEVEL", "info"}});
    CHECK_RUN(off, 0);
    CHECK(off.err.empty());
    const Run quiet = capalloc_cli({"describe"});
    CHECK_RUN(quiet, 0);
    CHECK(quiet.err.empty());
  }
  SECTION("an invalid variable fails a command that has no flag for it") {
    // describe takes neither --strict nor --capture-guard-scope; the library
    // reads both, so an invalid value fails it as it fails arms.
    const Run strict = capalloc_cli({"describe", "--runtime", "host"}, {{"CAPALLOC_STRICT", "bogus"}});
    CHECK_RUN(strict, 2);
    CHECK_THAT(strict.err, Contains("CAPALLOC_STRICT='bogus'"));
    const Run scope = capalloc_cli({"describe", "--runtime", "host"},
                                   {{"CAPALLOC_CAPTURE_GUARD_SCOPE", "bogus"}});
    CHECK_RUN(scope, 2);
    CHECK_THAT(scope.err, Contains("CAPALLOC_CAPTURE_GUARD_SCOPE='bogus'"));
  }
  SECTION("a value in an error is escaped") {
    const Run bad = capalloc_cli({"describe", "--runtime", "host"},
                                 {{"CAPALLOC_STRICT", "1\n\x1b[31mX\xff"}});
    CHECK_RUN(bad, 2);
    CHECK_THAT(bad.err, Contains("CAPALLOC_STRICT='1\\n\\x1b[31mX\\xff'"));
    CHECK(bad.err.find('\x1b') == std::string::npos);
  }
  SECTION("--strict given twice is a usage error") {
    const Run twice = capalloc_cli({"arms", "--arm", "A", "--runtime", "host", "--strict", "--strict=0"});
    CHECK_RUN(twice, 2);
  }
  SECTION("CAPALLOC_CAPTURE_GUARD_SCOPE") {
    const Run bad = capalloc_cli({"gemm-scenario", "--runtime", "host"},
                                 {{"CAPALLOC_CAPTURE_GUARD_SCOPE", "process"}});
    CHECK_RUN(bad, 2);
    CHECK_THAT(bad.err, Contains("CAPALLOC_CAPTURE_GUARD_SCOPE='process'"));
    const Run flag =
        capalloc_cli({"arms", "--arm", "B", "--runtime", "host", "--capture-guard-scope", "stream"},
                     {{"CAPALLOC_CAPTURE_GUARD_SCOPE", "process"}});
    CHECK_RUN(flag, 0);
  }
}

TEST_CASE("cli: audit --trace refuses a line that breaks the trace rules, naming it", "[cli]") {
  // Found by the break test of issue 13: a size of the wrong type aborted
  // the program, and a negative size or a double free passed silently.
  const std::string dir = std::filesystem::temp_directory_path().string();
  auto write = [&](const std::string& name, const std::string& body) {
    const std::string path = dir + "/capalloc_cli_audit_" + name + ".jsonl";
    std::ofstream(path) << body;
    return path;
  };
  const std::string header = "{\"format\": \"capalloc.trace/1\", \"source\": \"test\"}\n";
  struct Case {
    std::string name, body, message;
  };
  const std::vector<Case> cases = {
      {"size_type", header + "{\"op\":\"alloc\",\"id\":1,\"size\":\"abc\",\"stream\":0}\n",
       ":2: alloc without a \"size\" above 0"},
      {"size_negative", header + "{\"op\":\"alloc\",\"id\":1,\"size\":-5,\"stream\":0}\n",
       ":2: alloc without a \"size\" above 0"},
      {"double_free",
       header + "{\"op\":\"alloc\",\"id\":1,\"size\":8,\"stream\":0}\n{\"op\":\"free\",\"id\":1}\n" +
           "{\"op\":\"free\",\"id\":1}\n",
       ":4: free of id 1, which is not live"},
      {"no_header", "{\"op\":\"alloc\",\"id\":1,\"size\":8,\"stream\":0}\n",
       ":1: not a capalloc.trace/1 header"},
      {"empty", "", "no capalloc.trace/1 header"},
  };
  for (const Case& c : cases) {
    INFO(c.name);
    const Run r = capalloc_cli({"audit", "--trace", write(c.name, c.body)});
    CHECK_RUN(r, 1);
    CHECK_THAT(r.err, Contains(c.message));
  }
  const Run ok = capalloc_cli(
      {"audit", "--trace",
       write("ok", header + "{\"op\":\"alloc\",\"id\":1,\"size\":8,\"stream\":0,\"tag\":\"kept\"}\n")});
  CHECK_RUN(ok, 0);
  CHECK_THAT(ok.out, Contains("kept"));
}
