// tools/cli_settings.cpp: the flags that stand for CAPALLOC_* variables, and
// their resolution (flag, else variable, else default). Each flag accepts
// exactly what its variable does: enums through CLI::IsMember over the
// configuration table's choices, numbers through the table's own check.
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/escaping.h"

#include "common/config.hpp"
#include "common/status_macros.hpp"
#include "tools/cli.hpp"

namespace capalloc::cli {

namespace {

using config::Var;

std::vector<std::string> choices(Var id) {
  std::vector<std::string> out;
  for (std::string_view c : config::variable(id).choices) out.emplace_back(c);
  return out;
}

// "...; default: $CAPALLOC_X, else <default>".
std::string described(const std::string& what, Var id, std::string_view fallback) {
  return what + " [env " + std::string(config::variable(id).name) + ", else " +
         std::string(fallback) + "]";
}

// A validator that applies the configuration table's check for `id`.
CLI::Validator table_check(Var id) {
  return CLI::Validator(
      [id](std::string& value) -> std::string {
        const config::Variable& v = config::variable(id);
        const std::string p = config::problem(v, value);
        return p.empty() ? std::string()
                         : "'" + absl::CHexEscape(value) + "' " + p +
                               "; accepted: " + config::accepted(v);
      },
      "");
}

}  // namespace

SettingsFlags::SettingsFlags(CLI::App& command, unsigned flags) : flags_(flags) {
  if (flags_ & kRuntimeFlag) {
    runtime_option_ =
        command
            .add_option("--runtime", runtime_,
                        described("the device runtime", Var::kRuntime, "auto"))
            ->check(CLI::IsMember(choices(Var::kRuntime)))
            ->type_name("RUNTIME");
  }
  if (flags_ & kGranularityFlag) {
    granularity_option_ =
        command
            .add_option("--round-granularity", granularity_,
                        described("bytes that sizes round up to: " +
                                      config::accepted(config::variable(Var::kRoundGranularity)),
                                  Var::kRoundGranularity, "512"))
            ->check(table_check(Var::kRoundGranularity))
            ->type_name("BYTES");
  }
  if (flags_ & kGuardScopeFlag) {
    guard_scope_option_ =
        command
            .add_option("--capture-guard-scope", guard_scope_,
                        described("where persistent requests are refused during captures",
                                  Var::kCaptureGuardScope, "device"))
            ->check(CLI::IsMember(choices(Var::kCaptureGuardScope)))
            ->type_name("SCOPE");
  }
  if (flags_ & kStrictFlag) {
    // A flag (`--strict` alone is `--strict=1`) that also takes the
    // variable's other values: `--strict=possible`, `--strict=0`.
    strict_option_ =
        command
            .add_flag("--strict{1}", strict_,
                      described("the replay guard refuses graphs with hazards (=1), also with "
                                "possible findings (=possible), or only logs them (=0)",
                                Var::kStrict, "0"))
            ->check(CLI::IsMember(choices(Var::kStrict)).description(""))
            ->multi_option_policy(CLI::MultiOptionPolicy::Throw)
            ->type_name("[=0|1|possible]");
  }
  if (flags_ & kLogLevelFlag) {
    log_level_option_ =
        command
            .add_option("--log-level", log_level_,
                        described("capalloc's log level", Var::kLogLevel, "error"))
            ->check(CLI::IsMember(choices(Var::kLogLevel)))
            ->type_name("LEVEL");
  }
}

absl::StatusOr<Settings> SettingsFlags::start() const {
  // The library's variables that this command has no flag for are checked
  // too: an invalid one fails every command the same way, whether or not the
  // command uses it. Those with a flag are resolved below (flag, else
  // variable), so a given flag overrides its variable, valid or not.
  const std::pair<Var, const CLI::Option*> library_variables[] = {
      {Var::kRuntime, runtime_option_},         {Var::kRoundGranularity, granularity_option_},
      {Var::kCaptureGuardScope, guard_scope_option_}, {Var::kStrict, strict_option_},
      {Var::kLogLevel, log_level_option_},      {Var::kBackendPath, nullptr},
      {Var::kStacks, nullptr},                  {Var::kTrace, nullptr},
  };
  for (const auto& [id, option] : library_variables) {
    if (option != nullptr) continue;
    const std::string text = config::raw(id);
    if (!text.empty()) CAPALLOC_RETURN_IF_ERROR(config::check(config::variable(id), text));
  }
  Settings s;
  // No flags: the retention audit's stacks and the event trace of every
  // allocator a command creates come from their variables.
  CAPALLOC_ASSIGN_OR_RETURN(const std::string stacks, config::get_choice(Var::kStacks));
  s.allocator.record_stacks = stacks == "1";
  s.allocator.trace_path = config::get_text(Var::kTrace);
  auto given = [](const CLI::Option* option) { return option != nullptr && option->count() > 0; };
  if (given(runtime_option_)) {
    s.runtime = runtime_;
  } else if (runtime_option_ != nullptr) {
    CAPALLOC_ASSIGN_OR_RETURN(s.runtime, config::get_choice(Var::kRuntime));
  }
  if (given(granularity_option_)) {
    CAPALLOC_ASSIGN_OR_RETURN(
        s.allocator.round_granularity,
        config::parse_number(config::variable(Var::kRoundGranularity), granularity_));
  } else if (granularity_option_ != nullptr) {
    CAPALLOC_ASSIGN_OR_RETURN(s.allocator.round_granularity,
                              config::get_number(Var::kRoundGranularity));
  }
  if (guard_scope_option_ != nullptr) {
    std::string scope = guard_scope_;
    if (!given(guard_scope_option_)) {
      CAPALLOC_ASSIGN_OR_RETURN(scope, config::get_choice(Var::kCaptureGuardScope));
    }
    s.allocator.capture_guard_scope =
        scope == "stream" ? CaptureGuardScope::kStream : CaptureGuardScope::kDevice;
  }
  if (strict_option_ != nullptr) {
    std::string strict = strict_;
    if (!given(strict_option_)) {
      CAPALLOC_ASSIGN_OR_RETURN(strict, config::get_choice(Var::kStrict));
    }
    s.tracker.strict = strict != "0";
    s.tracker.strict_possible = strict == "possible";
  }
  if (given(log_level_option_)) {
    s.log_level = log_level_;
  } else if (log_level_option_ != nullptr && config::is_set(Var::kLogLevel)) {
    CAPALLOC_ASSIGN_OR_RETURN(s.log_level, log_level_from_env());
  }
  CAPALLOC_RETURN_IF_ERROR(set_log_level(s.log_level));
  return s;
}

const char* strict_label(const TrackerOptions& tracker) {
  if (!tracker.strict) return "";
  return tracker.strict_possible ? " (strict mode, possible findings too)" : " (strict mode)";
}

int fail(const absl::Status& s) {
  std::fprintf(stderr, "capalloc: %s\n", s.ToString().c_str());
  return 1;
}

int usage_error(const absl::Status& s) {
  std::fprintf(stderr, "capalloc: %s\n", s.ToString().c_str());
  return 2;
}

}  // namespace capalloc::cli
