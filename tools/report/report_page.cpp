// tools/report/report_page.cpp: see report_page.hpp.
#include "tools/report/report_page.hpp"

#include <string_view>

#include "absl/strings/str_replace.h"

namespace capalloc::report {

// tools/report/page_assets.cpp.in (generated into the build tree).
extern const std::string_view kReportHtml;
extern const std::string_view kReportCss;
extern const std::string_view kReportJs;

namespace {

// JSON inside <script type="application/json">: "<" occurs only inside
// strings there, where \u003c means the same and cannot close the element.
std::string embeddable_json(const nlohmann::ordered_json& value) {
  const std::string text =
      value.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
  return absl::StrReplaceAll(text, {{"<", "\\u003c"}});
}

std::string escape_html(const std::string& text) {
  return absl::StrReplaceAll(text, {{"&", "&amp;"}, {"<", "&lt;"}, {">", "&gt;"}, {"\"", "&quot;"}});
}

}  // namespace

std::string render_report_html(const ReportData& data) {
  nlohmann::ordered_json document;
  document["title"] = data.title;
  document["sources"] = data.sources;
  document["notes"] = data.notes;
  document["snapshot"] = data.snapshot;
  if (data.trace_header.is_null()) {
    document["trace"] = nullptr;
  } else {
    document["trace"] = {{"header", data.trace_header},
                         {"xmax", data.trace_events},
                         {"events", data.events}};
    if (!data.omitted.is_null()) document["trace"]["omitted"] = data.omitted;
  }
  const std::string html(kReportHtml);
  return absl::StrReplaceAll(html, {{"{{TITLE}}", escape_html(data.title)},
                                    {"/*{{CSS}}*/", std::string(kReportCss)},
                                    {"/*{{JS}}*/", std::string(kReportJs)},
                                    {"{{DATA}}", embeddable_json(document)}});
}

}  // namespace capalloc::report
