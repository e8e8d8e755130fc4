// tools/cli_report.cpp: `capalloc report`, the visual report of a snapshot
// and/or an event trace (docs/report.md), and the per-scenario reports that
// `arms --report` and `gemm-scenario --report` write.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "tools/cli.hpp"
#include "tools/report/report_data.hpp"
#include "tools/report/report_page.hpp"

namespace capalloc::cli {

namespace {

absl::Status write_file(const std::filesystem::path& path, std::string_view text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(text.data(), static_cast<std::streamsize>(text.size()));
  out.close();
  if (!out) return absl::PermissionDeniedError(absl::StrCat(path.string(), ": cannot be written"));
  return absl::OkStatus();
}

struct ReportFlags {
  std::vector<std::string> inputs;
  std::string output = "report.html";
  std::string title;
};

int report_command(const ReportFlags& flags) {
  report::ReportData data;
  for (const std::string& input : flags.inputs) {
    if (absl::Status s = report::add_report_file(input, data); !s.ok()) return fail(s);
  }
  data.title = flags.title.empty() ? absl::StrCat("capalloc report: ", data.sources.front())
                                   : flags.title;
  if (absl::Status s = write_file(flags.output, report::render_report_html(data)); !s.ok()) {
    return fail(s);
  }
  std::printf("capalloc report: wrote %s (%zu events%s)\n", flags.output.c_str(),
              data.events.size(), data.snapshot.is_null() ? "" : ", a snapshot");
  return 0;
}

}  // namespace

absl::StatusOr<std::string> write_scenario_report(const std::string& dir, const std::string& name,
                                                  const std::string& title,
                                                  const report::ScenarioTrace& trace) {
  std::error_code error;
  std::filesystem::create_directories(dir, error);
  if (error) {
    return absl::PermissionDeniedError(
        absl::StrCat(dir, ": cannot create the report directory: ", error.message()));
  }
  const std::filesystem::path base = std::filesystem::path(dir) / name;
  const std::string trace_text = trace.trace_jsonl();
  report::ReportData data;
  data.title = title;
  const std::string trace_path = base.string() + ".trace.jsonl";
  const std::string snapshot_path = base.string() + ".snapshot.json";
  if (absl::Status s = write_file(trace_path, trace_text); !s.ok()) return s;
  if (absl::Status s = write_file(snapshot_path, trace.snapshot_json()); !s.ok()) return s;
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
  if (absl::Status s = write_file(html_path, report::render_report_html(data)); !s.ok()) return s;
  return html_path;
}

void add_report_command(CLI::App& app, Runner& run) {
  CLI::App* command = app.add_subcommand(
      "report",
      "draw a snapshot and/or an event trace as one self-contained HTML page (docs/report.md)");
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
  command->callback([flags, &run] { run = [flags] { return report_command(*flags); }; });
}

}  // namespace capalloc::cli
