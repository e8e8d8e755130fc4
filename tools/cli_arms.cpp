// tools/cli_arms.cpp: `capalloc arms`, seed 003's four arms and the fix, as
// text or as one JSON object.
#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "capture/findings.hpp"
#include "capture/json_writer.hpp"
#include "tools/cli.hpp"
#include "tools/scenarios/seed003_arms.hpp"

namespace capalloc::cli {

namespace {

using scenarios::ArmResult;
using scenarios::FixResult;
using scenarios::ReplayOutcome;

void print_replay(const ReplayOutcome& o) {
  if (o.refused) {
    std::printf("  replay graph %d: refused by the replay guard (strict mode); WS clobbered %llu/%llu\n",
                o.graph, static_cast<unsigned long long>(o.clobbered),
                static_cast<unsigned long long>(o.total));
    return;
  }
  std::printf("  replay graph %d x%d: WS clobbered %llu/%llu, WS[0] = %.1f\n", o.graph, o.times,
              static_cast<unsigned long long>(o.clobbered),
              static_cast<unsigned long long>(o.total), o.value);
}

void print_arm(const ArmResult& r) {
  std::printf("\narm %c: %s\n", r.arm, r.title.c_str());
  std::printf("  %s: %s\n", r.alias_question.c_str(), r.alias ? "true" : "false");
  std::printf("  tracker at capture end, before any replay: %zu finding(s)\n",
              r.findings_before_replay.size());
  for (const Finding& f : r.findings_before_replay) std::printf("    %s\n", f.summary().c_str());
  for (const ReplayOutcome& o : r.replays) print_replay(o);
  std::printf("  expected: %s -> %s\n", r.expectation.c_str(),
              r.expected_match ? "match" : "MISMATCH");
  for (const std::string& m : r.mismatches) std::printf("    mismatch: %s\n", m.c_str());
}

void print_fix(const FixResult& r) {
  std::printf("\nthe fix (arm A again)\n");
  std::printf("  WS requested as persistent inside the capture: %s\n",
              r.persistent_refused ? "refused" : "NOT refused");
  std::printf("    %s\n", r.refusal.c_str());
  std::printf("  WS preallocated before the capture (PersistentCache), get() inside it: "
              "%zu finding(s), %d replays, WS clobbered %llu/%llu\n",
              r.preallocated_findings.size(), r.preallocated.times,
              static_cast<unsigned long long>(r.preallocated.clobbered),
              static_cast<unsigned long long>(r.preallocated.total));
  std::printf("  expected: refused with the fix named; preallocated WS intact -> %s\n",
              r.expected_match ? "match" : "MISMATCH");
  for (const std::string& m : r.mismatches) std::printf("    mismatch: %s\n", m.c_str());
}

void json_replay(detail::JsonWriter& j, const ReplayOutcome& o) {
  j.begin_object();
  j.field("graph", o.graph);
  j.field("times", o.times);
  j.field("refused", o.refused);
  j.field("clobbered", o.clobbered);
  j.field("total", o.total);
  j.field("value", o.value);
  j.end_object();
}

std::string to_json(std::string_view runtime, bool strict, const std::vector<ArmResult>& arms,
                    const FixResult* fix, bool all_match) {
  detail::JsonWriter j;
  j.begin_object();
  j.field("runtime", runtime);
  j.field("strict", strict);
  j.key("arms").begin_array();
  for (const ArmResult& r : arms) {
    j.begin_object();
    j.field("arm", std::string(1, r.arm));
    j.field("title", r.title);
    j.field("alias_question", r.alias_question);
    j.field("alias", r.alias);
    j.key("findings_before_replay").begin_array();
    for (const Finding& f : r.findings_before_replay) detail::write_finding(j, f);
    j.end_array();
    j.key("replays").begin_array();
    for (const ReplayOutcome& o : r.replays) json_replay(j, o);
    j.end_array();
    j.field("expected", r.expectation);
    j.field("expected_match", r.expected_match);
    j.key("mismatches").begin_array();
    for (const std::string& m : r.mismatches) j.value(m);
    j.end_array();
    j.end_object();
  }
  j.end_array();
  if (fix != nullptr) {
    j.key("fix").begin_object();
    j.field("persistent_refused", fix->persistent_refused);
    j.field("refusal", fix->refusal);
    j.field("preallocated_findings", static_cast<std::uint64_t>(fix->preallocated_findings.size()));
    j.key("preallocated_replay");
    json_replay(j, fix->preallocated);
    j.field("expected_match", fix->expected_match);
    j.end_object();
  }
  j.field("all_match", all_match);
  j.end_object();
  return j.str();
}

struct ArmsFlags {
  std::string which = "all";
  bool json = false;
  std::string report_dir;  // --report: one report per arm there
  std::unique_ptr<SettingsFlags> settings;
};

int arms_command(const ArmsFlags& flags) {
  ScenarioStart start;
  if (int status = start_scenario(*flags.settings, flags.report_dir, start); status != 0) {
    return status;
  }
  const std::string& which = flags.which;
  const bool json = flags.json;
  const bool strict = start.options.strict;
  const std::string arms = which == "all" ? "ABCD" : which;
  if (!json) {
    std::printf("capalloc arms: seed 003's four arms on the %s runtime, capalloc as the allocator%s\n"
                "N = %zu float32 (1 MiB), src = 3.0, T = src * 2, canary %.1f\n",
                start.runtime_label.c_str(), strict_label(start.settings.tracker),
                scenarios::kArmElements, scenarios::kCanary);
  }
  std::vector<ArmResult> results;
  bool all_match = true;
  std::vector<std::string> reports;
  for (char arm : arms) {
    report::ScenarioTrace trace(absl::StrFormat("capalloc arms --arm %c", arm));
    scenarios::ArmsOptions arm_options = start.options;
    if (!flags.report_dir.empty()) arm_options.recorder = &trace;
    auto r = scenarios::run_arm(arm, start.runtime, arm_options);
    if (!r.ok()) return fail(r.status());
    all_match = all_match && r->expected_match;
    if (!json) print_arm(*r);
    if (!flags.report_dir.empty()) {
      auto written = write_scenario_report(
          flags.report_dir, absl::StrFormat("arm-%c", arm),
          absl::StrFormat("seed 003, arm %c: %s (%s runtime)", arm, r->title, start.runtime_label),
          trace);
      if (!written.ok()) return fail(written.status());
      reports.push_back(*std::move(written));
    }
    results.push_back(*std::move(r));
  }
  std::unique_ptr<FixResult> fix;
  if (which == "all") {
    auto r = scenarios::run_fix(start.runtime, start.options);
    if (!r.ok()) return fail(r.status());
    fix = std::make_unique<FixResult>(*std::move(r));
    all_match = all_match && fix->expected_match;
    if (!json) print_fix(*fix);
  }
  if (json) {
    std::printf("%s\n", to_json(start.runtime_label, strict, results, fix.get(), all_match).c_str());
  } else {
    std::printf("\nevery observation matches seed 003: %s\n", all_match ? "yes" : "NO");
    for (const std::string& path : reports) std::printf("report: %s\n", path.c_str());
  }
  return all_match ? 0 : 1;
}

}  // namespace

void add_arms_command(CLI::App& app, Runner& run) {
  CLI::App* command = app.add_subcommand(
      "arms", "replay seed 003's four aliasing arms with capalloc as the allocator, then the fix");
  auto flags = std::make_shared<ArmsFlags>();
  command->add_option("--arm", flags->which, "the arm to run (all: the four and the fix)")
      ->check(CLI::IsMember({"A", "B", "C", "D", "all"}))
      ->capture_default_str();
  command->add_flag("--json", flags->json, "one JSON object instead of text");
  command->add_option("--report", flags->report_dir,
                      "write DIR/arm-X.html (with its trace and snapshot) per arm; DIR is created if "
                      "missing (its parent must exist) (docs/report.md)")
      ->check(non_empty_path());
  flags->settings = std::make_unique<SettingsFlags>(*command, kAllSettingFlags);
  command->callback([flags, &run] { run = [flags] { return arms_command(*flags); }; });
}

}  // namespace capalloc::cli
