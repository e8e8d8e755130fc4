// tools/report/report_data.hpp: what `capalloc report` draws, read from its
// inputs: at most one snapshot (docs/snapshot.md: one JSON object, the state
// at one moment: segments, graphs' ranges, findings, the audit) and at most
// one event trace (docs/trace.md: JSON Lines, the history from which the
// page rebuilds each block's lifetime). Either alone makes a report; both
// together draw the trace's history over the snapshot's segments.
//
// Reading checks what the page relies on and names the file and line of what
// it cannot use; the page itself does the drawing (report_page.hpp).
#ifndef CAPALLOC_TOOLS_REPORT_REPORT_DATA_HPP_
#define CAPALLOC_TOOLS_REPORT_REPORT_DATA_HPP_

#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/status/status.h"

namespace capalloc::report {

struct ReportData {
  std::string title;                 // the page's heading
  std::vector<std::string> sources;  // where each input came from (file names)
  nlohmann::ordered_json snapshot;   // null when none was given
  nlohmann::ordered_json trace_header;  // null when no trace was given
  nlohmann::ordered_json events = nlohmann::ordered_json::array();  // the trace's events
  std::vector<std::string> notes;    // said at the top of the page (e.g. what a recording missed)
  // Set by bound_report_blocks (report_bound.hpp) when it left blocks out:
  // their number, bytes and per-bucket summary; null otherwise.
  nlohmann::ordered_json omitted;
  std::size_t trace_events = 0;      // the trace's events before any was left out
};

// Adds the snapshot or trace in `text` (named `source` in messages and on
// the page). kInvalidArgument, changing nothing, for text that is neither,
// a line of a trace that is not a JSON object with an `op`, a trace whose
// format is not capalloc.trace/1, or a second snapshot or trace.
absl::Status add_report_input(const std::string& text, const std::string& source,
                              ReportData& data);

// Reads `path` and adds it (kNotFound when it cannot be read).
absl::Status add_report_file(const std::string& path, ReportData& data);

}  // namespace capalloc::report

#endif  // CAPALLOC_TOOLS_REPORT_REPORT_DATA_HPP_
