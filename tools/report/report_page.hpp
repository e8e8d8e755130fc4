// tools/report/report_page.hpp: the report as one self-contained HTML page.
//
// The page is tools/report/page/ (report.html, report.css, and the script:
// report_model.js, then report_view.js, report_draw.js and
// report_interact.js in one function scope), built into the program
// (page_assets.cpp.in, tools/CMakeLists.txt), with the data embedded as
// JSON: it needs no network,
// no other file and no script but its own. Its script rebuilds each block's
// lifetime from the trace (or takes the snapshot's one moment) and draws
// every pool's address space over time as SVG, with zoom and hover details;
// it also writes what it drew into DOM attributes (data-block-count, the
// findings' addresses), which the headless-browser test reads
// (tests/report_page_test.sh).
#ifndef CAPALLOC_TOOLS_REPORT_REPORT_PAGE_HPP_
#define CAPALLOC_TOOLS_REPORT_REPORT_PAGE_HPP_

#include <string>

#include "tools/report/report_data.hpp"

namespace capalloc::report {

std::string render_report_html(const ReportData& data);

}  // namespace capalloc::report

#endif  // CAPALLOC_TOOLS_REPORT_REPORT_PAGE_HPP_
