// tools/cli_report.cpp: `capalloc report`, the visual report of a snapshot
// and/or an event trace (docs/report.md), and the per-scenario reports that
// `arms --report` and `gemm-scenario --report` write.
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "tools/cli.hpp"
#include "tools/report/report_bound.hpp"
#include "tools/report/report_data.hpp"
#include "tools/report/report_files.hpp"
#include "tools/report/report_page.hpp"

namespace capalloc::cli {

namespace {

struct ReportFlags {
  std::vector<std::string> inputs;
  std::string output = "report.html";
  std::string title;
  std::size_t max_blocks = report::kDefaultMaxBlocks;
};

int report_command(const ReportFlags& flags) {
  report::ReportData data;
  for (const std::string& input : flags.inputs) {
    if (absl::Status s = report::add_report_file(input, data); !s.ok()) return fail(s);
  }
  report::bound_report_blocks(data, flags.max_blocks);
  data.title = flags.title.empty() ? absl::StrCat("capalloc report: ", data.sources.front())
                                   : flags.title;
  if (absl::Status s = report::write_text_file(flags.output, report::render_report_html(data)); !s.ok()) {
    return fail(s);
  }
  std::printf("capalloc report: wrote %s (%zu events%s)\n", flags.output.c_str(),
              data.trace_events, data.snapshot.is_null() ? "" : ", a snapshot");
  if (!data.omitted.is_null()) {
    std::printf("capalloc report: %s of %s blocks left out of the drawing (--max-blocks %zu), "
                "summarized on the page\n",
                data.omitted["blocks"].dump().c_str(), data.omitted["total"].dump().c_str(),
                flags.max_blocks);
  }
  return 0;
}

}  // namespace

int start_scenario(const SettingsFlags& flags, const std::string& report_dir, ScenarioStart& out) {
  auto settings = flags.start();
  if (!settings.ok()) return usage_error(settings.status());
  if (!report_dir.empty()) {
    if (absl::Status s = report::make_report_dir(report_dir); !s.ok()) return fail(s);
  }
  auto runtime = make_runtime(settings->runtime);
  if (!runtime.ok()) return fail(runtime.status());
  out.settings = *std::move(settings);
  out.runtime = *std::move(runtime);
  out.runtime_label = std::string(out.runtime->name());
  out.options = {.strict = out.settings.tracker.strict,
                 .strict_possible = out.settings.tracker.strict_possible,
                 .allocator = out.settings.allocator};
  return 0;
}

absl::StatusOr<std::string> write_scenario_report(const std::string& dir, const std::string& name,
                                                  const std::string& title,
                                                  const report::ScenarioTrace& trace) {
  if (absl::Status s = report::make_report_dir(dir); !s.ok()) return s;
  const std::filesystem::path base = std::filesystem::path(dir) / name;
  const std::string trace_text = trace.trace_jsonl();
  report::ReportData data;
  data.title = title;
  const std::string trace_path = base.string() + ".trace.jsonl";
  const std::string snapshot_path = base.string() + ".snapshot.json";
  if (absl::Status s = report::write_text_file(trace_path, trace_text); !s.ok()) return s;
  if (absl::Status s = report::write_text_file(snapshot_path, trace.snapshot_json()); !s.ok()) return s;
  if (absl::Status s = report::add_report_input(trace_text, trace_path, data); !s.ok()) return s;
  if (absl::Status s = report::add_report_input(trace.snapshot_json(), snapshot_path, data);
      !s.ok()) {
    return s;
  }
  if (trace.missed_allocations() != 0) {
    data.notes.push_back(absl::StrCat(trace.missed_allocations(),
                                      " allocation(s) made and freed between two recorded steps "
                                      "are not drawn"));
  }
  const std::string html_path = base.string() + ".html";
  if (absl::Status s = report::write_text_file(html_path, report::render_report_html(data)); !s.ok()) return s;
  return html_path;
}

// CLI11 2.1 writes a positional taking 1 to 2 values as "inputs(1x)" (its
// minimum); this writes "inputs(1-2x)".
class RangeUsageFormatter : public CLI::Formatter {
 public:
  std::string make_option_usage(const CLI::Option* opt) const override {
    const int low = opt->get_expected_min();
    const int high = opt->get_expected_max();
    if (high <= 1 || high >= CLI::detail::expected_max_vector_size || low == high) {
      return CLI::Formatter::make_option_usage(opt);
    }
    std::string usage = make_option_name(opt, true) + "(" + std::to_string(low) + "-" +
                        std::to_string(high) + "x)";
    return opt->get_required() ? usage : "[" + usage + "]";
  }
};

void add_report_command(CLI::App& app, Runner& run) {
  CLI::App* command = app.add_subcommand(
      "report",
      "draw a snapshot and/or an event trace as one self-contained HTML page (docs/report.md)");
  command->formatter(std::make_shared<RangeUsageFormatter>());
  auto flags = std::make_shared<ReportFlags>();
  command
      ->add_option("inputs", flags->inputs,
                   "a snapshot (docs/snapshot.md), an event trace (docs/trace.md), or one of each")
      ->required()
      ->expected(1, 2)
      ->check(CLI::ExistingFile);
  command->add_option("-o,--output", flags->output, "the HTML file to write")
      ->capture_default_str();
  command->add_option("--title", flags->title, "the page's heading (default: the first input)");
  command
      ->add_option("--max-blocks", flags->max_blocks,
                   "draw at most this many of a trace's blocks (those of findings, live at the "
                   "end, largest and longest first; the rest summarized); 0: all")
      ->check(unsigned_at_most(std::uint64_t{1} << 40))
      ->capture_default_str();
  command->callback([flags, &run] { run = [flags] { return report_command(*flags); }; });
}

}  // namespace capalloc::cli
