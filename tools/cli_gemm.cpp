// tools/cli_gemm.cpp: `capalloc gemm-scenario`, seed 003's aiter scenario
// with capalloc's split-K GEMM: the status quo's wrong outputs and capalloc's
// right ones, as the seed's table or as one JSON object.
#include <cstdio>
#include <string>
#include <vector>

#include "capalloc/gemm.hpp"
#include "capture/findings.hpp"
#include "capture/json_writer.hpp"
#include "tools/cli.hpp"
#include "tools/scenarios/seed003_gemm.hpp"

namespace capalloc::cli {

namespace {

using scenarios::GemmArmResult;
using scenarios::GemmGraphOutcome;

void print_arm(const GemmArmResult& r) {
  std::printf("\n=== %s ===\n", r.arm == "status_quo"
                                     ? "STATUS QUO: stream-keyed cache, buffers allocated in capture"
                                     : "CAPALLOC: device-keyed persistent buffers, preallocated");
  std::printf("  tracker after the captures, before any replay: %zu finding(s)\n",
              r.findings_before_replay.size());
  for (const Finding& f : r.findings_before_replay) std::printf("    %s\n", f.summary().c_str());
  std::printf("  %-5s %-26s %-30s %-16s %s\n", "graph", "workspace aliases decoy",
              "sem slots dirtied by 1 decoy", "wrong outputs", "max abs err");
  for (const GemmGraphOutcome& o : r.graphs) {
    std::printf("  %-5s %-26s %3d/%d (%d of the %d in use)    %4d/%-11d %.4g%s\n", o.graph.c_str(),
                o.workspace_aliases_decoy ? "true" : "false", o.sem_slots_dirtied, kSplitKMaxTiles,
                o.sem_slots_dirtied_in_use, scenarios::kGemmTilesInUse, o.wrong_outputs,
                o.total_outputs, o.max_abs_err, o.wrong_outputs ? "  <-- WRONG" : "");
  }
  for (const GemmGraphOutcome& o : r.graphs) {
    if (o.decoy_replay_refused) {
      std::printf("  before %s: the decoy's replay was refused (strict mode: it would clobber "
                  "the split-K semaphore)\n",
                  o.graph.c_str());
    }
  }
  if (r.arm == "status_quo" && r.graphs.size() == 2 && !r.strict) {
    const GemmGraphOutcome& g2 = r.graphs[1];
    std::printf("  arithmetic: %d dirty slot(s) among the %d in use x tile_n 64 = %d wrong outputs "
                "expected; g2 has %d. Slot 0 held %u (0x%08X) after the decoy replay.\n",
                g2.sem_slots_dirtied_in_use, scenarios::kGemmTilesInUse,
                64 * g2.sem_slots_dirtied_in_use, g2.wrong_outputs, r.dirty_slot_value,
                r.dirty_slot_value);
  }
  std::printf("  expected outcome -> %s\n", r.expected_match ? "match" : "MISMATCH");
  for (const std::string& m : r.mismatches) std::printf("    mismatch: %s\n", m.c_str());
}

std::string to_json(std::string_view runtime, bool strict, const std::vector<GemmArmResult>& arms,
                    bool all_match) {
  detail::JsonWriter j;
  j.begin_object();
  j.field("runtime", runtime);
  j.field("strict", strict);
  j.field("m", scenarios::kGemmM);
  j.field("n", scenarios::kGemmN);
  j.field("k", scenarios::kGemmK);
  j.field("split_k", scenarios::kGemmSplitK);
  j.key("arms").begin_array();
  for (const GemmArmResult& r : arms) {
    j.begin_object();
    j.field("arm", r.arm);
    j.key("graphs").begin_array();
    for (const GemmGraphOutcome& o : r.graphs) {
      j.begin_object();
      j.field("graph", o.graph);
      j.field("workspace_aliases_decoy", o.workspace_aliases_decoy);
      j.field("sem_slots_dirtied", o.sem_slots_dirtied);
      j.field("sem_slots_dirtied_in_use", o.sem_slots_dirtied_in_use);
      j.field("wrong_outputs", o.wrong_outputs);
      j.field("total_outputs", o.total_outputs);
      j.field("max_abs_err", o.max_abs_err);
      j.field("decoy_replay_refused", o.decoy_replay_refused);
      j.end_object();
    }
    j.end_array();
    j.key("findings_before_replay").begin_array();
    for (const Finding& f : r.findings_before_replay) detail::write_finding(j, f);
    j.end_array();
    j.field("dirty_slot_value", static_cast<std::uint64_t>(r.dirty_slot_value));
    j.field("expected_match", r.expected_match);
    j.key("mismatches").begin_array();
    for (const std::string& m : r.mismatches) j.value(m);
    j.end_array();
    j.end_object();
  }
  j.end_array();
  j.field("all_match", all_match);
  j.end_object();
  return j.str();
}

struct GemmFlags {
  bool json = false;
  std::string report_dir;  // --report: one report per arm there
  std::unique_ptr<SettingsFlags> settings;
};

int gemm_scenario_command(const GemmFlags& flags) {
  ScenarioStart start;
  if (int status = start_scenario(*flags.settings, flags.report_dir, start); status != 0) {
    return status;
  }
  const bool json = flags.json;
  const bool strict = start.options.strict;
  if (!json) {
    std::printf("capalloc gemm-scenario: seed 003's aiter scenario on the %s runtime\n"
                "split-K GEMM M=%d N=%d K=%d split_k=%d, fp8 e4m3 inputs with scales, bf16 "
                "output; decoy, g1 (cache miss) and g2 (cache hit) captured on one side stream "
                "into one shared pool%s\n",
                start.runtime_label.c_str(), scenarios::kGemmM, scenarios::kGemmN, scenarios::kGemmK,
                scenarios::kGemmSplitK, strict_label(start.settings.tracker));
  }
  std::vector<GemmArmResult> arms;
  bool all_match = true;
  std::vector<std::string> reports;
  for (bool status_quo : {true, false}) {
    const std::string name = status_quo ? "gemm-status_quo" : "gemm-capalloc";
    report::ScenarioTrace trace("capalloc gemm-scenario (" + name + ")");
    scenarios::GemmScenarioOptions arm_options = start.options;
    if (!flags.report_dir.empty()) arm_options.recorder = &trace;
    auto r = scenarios::run_gemm_arm(status_quo, start.runtime, arm_options);
    if (!r.ok()) return fail(r.status());
    all_match = all_match && r->expected_match;
    if (!json) print_arm(*r);
    if (!flags.report_dir.empty()) {
      auto written = write_scenario_report(
          flags.report_dir, name,
          "seed 003, split-K GEMM scenario, " +
              std::string(status_quo ? "status quo (stream-keyed buffers allocated in the capture)"
                                     : "capalloc (device-keyed persistent buffers)") +
              " (" + start.runtime_label + " runtime)",
          trace);
      if (!written.ok()) return fail(written.status());
      reports.push_back(*std::move(written));
    }
    arms.push_back(*std::move(r));
  }
  if (json) {
    std::printf("%s\n", to_json(start.runtime_label, strict, arms, all_match).c_str());
  } else {
    std::printf("\nstatus quo: g1 wrong=%d, g2 wrong=%d\ncapalloc  : g1 wrong=%d, g2 wrong=%d\n"
                "every observation matches seed 003: %s\n",
                arms[0].graphs[0].wrong_outputs, arms[0].graphs[1].wrong_outputs,
                arms[1].graphs[0].wrong_outputs, arms[1].graphs[1].wrong_outputs,
                all_match ? "yes" : "NO");
    for (const std::string& path : reports) std::printf("report: %s\n", path.c_str());
  }
  return all_match ? 0 : 1;
}

}  // namespace

void add_gemm_scenario_command(CLI::App& app, Runner& run) {
  CLI::App* command = app.add_subcommand(
      "gemm-scenario",
      "seed 003's wrong-GEMM scenario: a stream-keyed split-K cache against capalloc's");
  auto flags = std::make_shared<GemmFlags>();
  command->add_flag("--json", flags->json, "one JSON object instead of text");
  command->add_option("--report", flags->report_dir,
                      "write DIR/gemm-<arm>.html (with its trace and snapshot) per arm; DIR is "
                      "created if missing (its parent must exist) (docs/report.md)")
      ->check(non_empty_path());
  flags->settings = std::make_unique<SettingsFlags>(*command, kAllSettingFlags);
  command->callback([flags, &run] { run = [flags] { return gemm_scenario_command(*flags); }; });
}

}  // namespace capalloc::cli
