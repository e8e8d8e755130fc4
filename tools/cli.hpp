// tools/cli.hpp: the `capalloc` CLI's sub-commands and what they share.
//
// Arguments go through CLI11: every command has --help, every value is
// checked, and a usage error (unknown command or flag, missing or invalid
// value) exits with 2. A command returns the process exit status: 0 success
// (and, for scenarios, every observation matched), 1 a failure or a
// mismatch, 2 a usage error (an invalid CAPALLOC_* variable included).
#ifndef CAPALLOC_TOOLS_CLI_HPP_
#define CAPALLOC_TOOLS_CLI_HPP_

#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <string>

#include <CLI/CLI.hpp>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "capalloc/allocator.hpp"
#include "capalloc/capture.hpp"
#include "capalloc/runtime.hpp"
#include "tools/report/scenario_trace.hpp"
#include "tools/scenarios/world_options.hpp"

namespace capalloc::cli {

// What the commands take from the CAPALLOC_* variables. Each has a flag; a
// flag given on the command line wins over its variable (read through
// common/config.hpp, with its policy), the variable over the default.
struct Settings {
  std::string runtime = "auto";        // --runtime, CAPALLOC_RUNTIME
  AllocatorOptions allocator;          // --round-granularity, CAPALLOC_ROUND_GRANULARITY;
                                       // --capture-guard-scope, CAPALLOC_CAPTURE_GUARD_SCOPE
  TrackerOptions tracker;              // --strict, CAPALLOC_STRICT
  std::string log_level = "error";     // --log-level, CAPALLOC_LOG_LEVEL; the CLI prints
                                       // findings itself, so its default is quieter
};

// Which settings a command has flags for (and so reads).
enum SettingFlag : unsigned {
  kRuntimeFlag = 1u << 0,
  kGranularityFlag = 1u << 1,
  kGuardScopeFlag = 1u << 2,
  kStrictFlag = 1u << 3,
  kLogLevelFlag = 1u << 4,
  kAllSettingFlags = (1u << 5) - 1,
};

// The settings' flags on one command. Construct it before parsing; it must
// outlive the parse (CLI11 writes into it).
class SettingsFlags {
 public:
  SettingsFlags(CLI::App& command, unsigned flags);
  SettingsFlags(const SettingsFlags&) = delete;
  SettingsFlags& operator=(const SettingsFlags&) = delete;

  // After parsing: each setting from its flag, else its variable, else its
  // default, and the log level set. An invalid variable (one no flag
  // overrides) is kInvalidArgument naming it.
  absl::StatusOr<Settings> start() const;

 private:
  unsigned flags_;
  std::string runtime_, granularity_, guard_scope_, strict_, log_level_;
  CLI::Option* runtime_option_ = nullptr;
  CLI::Option* granularity_option_ = nullptr;
  CLI::Option* guard_scope_option_ = nullptr;
  CLI::Option* strict_option_ = nullptr;
  CLI::Option* log_level_option_ = nullptr;
};

// Each adds its command to `app`; once the command line has been parsed,
// `run` holds what runs the chosen command.
using Runner = std::function<int()>;
void add_describe_command(CLI::App& app, Runner& run);
void add_arms_command(CLI::App& app, Runner& run);
void add_gemm_scenario_command(CLI::App& app, Runner& run);
void add_stress_command(CLI::App& app, Runner& run);
void add_report_command(CLI::App& app, Runner& run);

// Writes DIR/NAME.trace.jsonl and DIR/NAME.snapshot.json (what `trace`
// recorded) and DIR/NAME.html, the report drawn from both (creating DIR);
// returns the HTML file's path. For `--report` of the scenario commands.
absl::StatusOr<std::string> write_scenario_report(const std::string& dir, const std::string& name,
                                                  const std::string& title,
                                                  const report::ScenarioTrace& trace);
// `capalloc bench` and its hidden child, `capalloc bench-replay` (cli_bench.cpp).
void add_bench_command(CLI::App& app, Runner& run);
void add_audit_command(CLI::App& app, Runner& run);

// What a scenario command (arms, gemm-scenario) starts from.
struct ScenarioStart {
  Settings settings;
  std::shared_ptr<DeviceRuntime> runtime;
  std::string runtime_label;         // the runtime's name, for headers and titles
  scenarios::WorldOptions options;   // from the settings; no observer, no recorder
};
// Reads the settings, makes the report directory (when `report_dir` is not
// empty: before any work, so that a path that cannot take the reports fails
// first) and the runtime. Returns 0, or the exit status after printing why:
// 2 for an invalid setting, 1 for the directory or the runtime.
int start_scenario(const SettingsFlags& flags, const std::string& report_dir, ScenarioStart& out);

// " (strict mode)", " (strict mode, possible findings too)" or "": for the
// scenarios' headers.
const char* strict_label(const TrackerOptions& tracker);

// A check for an unsigned number of at most `max` (decimal digits only): CLI11
// alone wraps "-1" to a huge size_t and clamps an overflowing number to the
// type's maximum, silently; this makes either a usage error (exit 2).
inline CLI::Validator unsigned_at_most(std::uint64_t max) {
  return CLI::Validator(
      [max](std::string& text) -> std::string {
        std::uint64_t value = 0;
        const bool digits = !text.empty() && text.find_first_not_of("0123456789") == std::string::npos;
        if (!digits || !absl::SimpleAtoi(text, &value)) {
          return absl::StrCat("'", text, "' is not an unsigned decimal number of at most ", max);
        }
        if (value > max) return absl::StrCat(text, " is above the largest value, ", max);
        return "";
      },
      absl::StrCat("UINT<=", max));
}

// A check that a path is not empty ("" would silently write nothing).
inline CLI::Validator non_empty_path() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        return text.empty() ? std::string("the directory is empty; name one") : std::string();
      },
      "DIR");
}

// Prints "capalloc: <status>" to stderr and returns 1.
int fail(const absl::Status& status);
// Prints "capalloc: <status>" to stderr and returns 2 (a usage error: an
// invalid setting).
int usage_error(const absl::Status& status);

}  // namespace capalloc::cli

#endif  // CAPALLOC_TOOLS_CLI_HPP_
