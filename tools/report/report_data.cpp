// tools/report/report_data.cpp: see report_data.hpp.
#include "tools/report/report_data.hpp"

#include <filesystem>
#include <fstream>
#include <sstream>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/strings/ascii.h"
#include "tools/trace/json_error.hpp"

namespace capalloc::report {

namespace {

using Json = nlohmann::ordered_json;

constexpr absl::string_view kSnapshotSchema = "capalloc.snapshot/";
// The snapshot versions this report draws (capture/snapshot.cpp writes the last).
constexpr int kSnapshotVersions[] = {1, 2, 3, 4};
constexpr char kTraceFormat[] = "capalloc.trace/1";
constexpr std::size_t kMaxJsonDepth = 256;

using trace::json_error;  // tools/trace/json_error.hpp

absl::Status add_snapshot(Json document, const std::string& source, ReportData& data) {
  if (!data.snapshot.is_null()) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": a second snapshot; a report draws one snapshot (and one trace)"));
  }
  if (!document.contains("devices") || !document["devices"].is_array()) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": a snapshot without a `devices` array (docs/snapshot.md)"));
  }
  data.snapshot = std::move(document);
  return absl::OkStatus();
}

absl::Status add_trace(const std::string& text, const std::string& source, ReportData& data) {
  if (!data.trace_header.is_null()) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": a second trace; a report draws one trace (and one snapshot)"));
  }
  Json header;
  Json events = Json::array();
  absl::flat_hash_set<std::uint64_t> live;  // alloc'd and not freed
  int line_number = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_number;
    const absl::string_view content = absl::StripAsciiWhitespace(line);
    if (content.empty() || content.front() == '#') continue;
    Json object = Json::parse(content.begin(), content.end(), nullptr, /*allow_exceptions=*/false);
    if (object.is_discarded()) {
      const std::string why = json_error(std::string_view(content.data(), content.size()));
      return absl::InvalidArgumentError(absl::StrCat(source, ":", line_number, ": invalid JSON (",
                                                     why, ") (docs/trace.md)"));
    }
    if (!object.is_object()) {
      return absl::InvalidArgumentError(
          absl::StrCat(source, ":", line_number, ": not a JSON object (docs/trace.md)"));
    }
    if (header.is_null()) {
      if (!object.contains("format") || object["format"] != kTraceFormat) {
        return absl::InvalidArgumentError(absl::StrCat(
            source, ":", line_number, ": the first object of a trace must be its header, ",
            "{\"format\": \"", kTraceFormat, "\", ...} (docs/trace.md)"));
      }
      header = std::move(object);
      continue;
    }
    if (!object.contains("op") || !object["op"].is_string()) {
      return absl::InvalidArgumentError(
          absl::StrCat(source, ":", line_number, ": an event without a string `op`"));
    }
    // The reader rules `capalloc audit --trace` and the replays apply to ids
    // (docs/trace.md): a page drawn from a trace that breaks them would
    // show blocks that never existed.
    const std::string op = object["op"].get<std::string>();
    if (op == "alloc" || op == "free") {
      if (!object.contains("id") || !object["id"].is_number_unsigned()) {
        return absl::InvalidArgumentError(absl::StrCat(source, ":", line_number, ": ", op,
                                                       " without an unsigned integer \"id\""));
      }
      if (op == "alloc" && (!object.contains("size") || !object["size"].is_number_unsigned() ||
                            object["size"].get<std::uint64_t>() == 0)) {
        return absl::InvalidArgumentError(
            absl::StrCat(source, ":", line_number, ": alloc without a \"size\" above 0"));
      }
      const auto id = object["id"].get<std::uint64_t>();
      if (op == "alloc" && !live.insert(id).second) {
        return absl::InvalidArgumentError(
            absl::StrCat(source, ":", line_number, ": alloc of id ", id, ", which is live"));
      }
      if (op == "free" && live.erase(id) == 0) {
        return absl::InvalidArgumentError(
            absl::StrCat(source, ":", line_number, ": free of id ", id, ", which is not live"));
      }
    }
    object["line"] = line_number;  // for the page's hover text
    events.push_back(std::move(object));
  }
  if (header.is_null()) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": an empty trace"));
  }
  data.trace_header = std::move(header);
  data.trace_events = events.size();
  data.events = std::move(events);
  return absl::OkStatus();
}

}  // namespace

absl::Status add_report_input(const std::string& text_in, const std::string& source,
                              ReportData& data) {
  // A UTF-8 byte order mark at the start is allowed, as `audit --trace`
  // (and JSON parsers) allow it.
  absl::string_view text = text_in;
  absl::ConsumePrefix(&text, "\xEF\xBB\xBF");
  const absl::string_view content = absl::StripAsciiWhitespace(text);
  // The page embeds what it reads, and writing JSON recurses per level.
  if (const std::size_t depth = trace::json_depth(std::string_view(content.data(), content.size()));
      depth > kMaxJsonDepth) {
    return absl::InvalidArgumentError(absl::StrCat(
        source, ": JSON nested ", depth, " levels deep; a report reads at most ", kMaxJsonDepth,
        " (a capalloc snapshot or trace needs fewer than 10)"));
  }
  if (content.empty()) return absl::InvalidArgumentError(absl::StrCat(source, ": empty"));
  // A snapshot is one JSON object; a trace's first line is its header.
  Json whole = Json::parse(content.begin(), content.end(), nullptr, /*allow_exceptions=*/false);
  if (!whole.is_discarded() && whole.is_object() && whole.contains("schema")) {
    if (!whole["schema"].is_string() ||
        !absl::StartsWith(whole["schema"].get<std::string>(), kSnapshotSchema)) {
      return absl::InvalidArgumentError(
          absl::StrCat(source, ": schema ", whole["schema"].dump(), " is not a capalloc snapshot"));
    }
    const std::string schema = whole["schema"].get<std::string>();
    int version = 0;
    bool known = absl::SimpleAtoi(absl::string_view(schema).substr(kSnapshotSchema.size()), &version);
    if (known) {
      known = false;
      for (int v : kSnapshotVersions) known = known || v == version;
    }
    if (!known) {
      return absl::InvalidArgumentError(absl::StrCat(
          source, ": unknown snapshot schema version \"", schema, "\" (this report reads ",
          kSnapshotSchema, "1 to ", kSnapshotSchema, "4; docs/snapshot.md)"));
    }
    data.sources.push_back(source);
    absl::Status s = add_snapshot(std::move(whole), source, data);
    if (!s.ok()) data.sources.pop_back();
    return s;
  }
  if (content.front() != '{') {
    return absl::InvalidArgumentError(absl::StrCat(
        source, ": neither a capalloc snapshot (a JSON object with `schema`) nor a trace "
                "(JSON Lines starting with a capalloc.trace/1 header)"));
  }
  absl::Status s = add_trace(std::string(text), source, data);
  if (s.ok()) data.sources.push_back(source);
  return s;
}

absl::Status add_report_file(const std::string& path, ReportData& data) {
  // A device or a pipe could be endless (/dev/zero): a report reads files.
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": not a regular file (a snapshot or a trace is a file)"));
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot be read"));
  std::ostringstream text;
  text << in.rdbuf();
  return add_report_input(text.str(), path, data);
}

}  // namespace capalloc::report
