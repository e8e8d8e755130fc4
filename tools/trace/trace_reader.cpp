// tools/trace/trace_reader.cpp: see trace_reader.hpp.
#include "tools/trace/trace_reader.hpp"

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <unordered_map>
#include <utility>

#include <nlohmann/json.hpp>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "tools/trace/json_error.hpp"

namespace capalloc::trace {

namespace {

using Json = nlohmann::json;

constexpr const char* kFormat = "capalloc.trace/1";

enum class CaptureState { kActive, kEnded, kDestroyed };

struct CaptureEntry {
  std::uint32_t index = 0;
  std::uint32_t stream = 0;
  CaptureState state = CaptureState::kActive;
};

// The reader's state between lines: what is live, and the dense numbering.
class Decoder {
 public:
  explicit Decoder(std::string_view name) { trace_.name = std::string(name); }

  absl::Status line(std::size_t number, std::string_view text);
  absl::StatusOr<Trace> finish();

 private:
  absl::Status error(const std::string& message) const {
    return absl::InvalidArgumentError(absl::StrCat(trace_.name, ":", line_, ": ", message));
  }
  // Appends an event, noting the line it came from.
  void push(TraceOp op);
  absl::Status header(const Json& object);
  absl::Status event(const Json& object);
  absl::StatusOr<std::int64_t> integer(const Json& object, const char* member) const;
  absl::StatusOr<std::uint32_t> stream(const Json& object);
  absl::Status check_device(const Json& object) const;
  absl::Status alloc(const Json& object);
  absl::Status free_or_record(const Json& object, OpKind kind);
  absl::Status capture_begin(const Json& object);
  absl::Status capture_event(const Json& object, OpKind kind);

  Trace trace_;
  std::size_t line_ = 0;
  bool have_header_ = false;
  std::unordered_map<std::int64_t, std::uint32_t> live_;  // trace id -> slot
  std::unordered_map<std::uint32_t, std::uint64_t> live_sizes_;  // slot -> size
  // slot -> the allocation's dense stream: a free is replayed on it, as
  // PyTorch's allocator passes the block's stream to its free function.
  std::unordered_map<std::uint32_t, std::uint32_t> live_streams_;
  std::vector<std::uint32_t> free_slots_;
  std::unordered_map<std::uint64_t, std::uint32_t> streams_;  // trace stream -> dense
  std::unordered_map<std::uint32_t, std::int64_t> capturing_;  // dense stream -> capture id
  std::unordered_map<std::int64_t, CaptureEntry> captures_;
  std::unordered_map<std::string, std::uint32_t> pools_;
  std::uint64_t live_bytes_ = 0;
};

void Decoder::push(TraceOp op) {
  trace_.ops.push_back(op);
  trace_.op_lines.push_back(static_cast<std::uint32_t>(line_));
}

absl::Status Decoder::line(std::size_t number, std::string_view text) {
  line_ = number;
  const std::size_t first = text.find_first_not_of(" \t\r");
  if (first == std::string_view::npos || text[first] == '#') return absl::OkStatus();
  const Json object = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (object.is_discarded()) {
    // Parsed again for the parser's reason: on this line only, which is
    // refused anyway.
    const std::string reason = json_error(text);
    return error(reason.empty() ? std::string("not valid JSON")
                                : absl::StrCat("not valid JSON (", reason, ")"));
  }
  if (!object.is_object()) return error("not a JSON object");
  return have_header_ ? event(object) : header(object);
}

absl::Status Decoder::header(const Json& object) {
  const auto format = object.find("format");
  if (format == object.end() || !format->is_string()) {
    return error(absl::StrCat("the first object must be the header, with \"format\": \"",
                              kFormat, "\""));
  }
  if (format->get<std::string>() != std::string(kFormat)) {
    return error(absl::StrCat("format \"", format->get<std::string>(), "\" is not \"", kFormat,
                              "\", the one this reader knows"));
  }
  if (const auto source = object.find("source"); source != object.end() && source->is_string()) {
    trace_.source = source->get<std::string>();
  }
  have_header_ = true;
  return absl::OkStatus();
}

absl::StatusOr<std::int64_t> Decoder::integer(const Json& object, const char* member) const {
  const auto it = object.find(member);
  if (it == object.end()) return error(absl::StrCat("member \"", member, "\" is missing"));
  if (!it->is_number_integer()) {
    return error(absl::StrCat("member \"", member, "\" must be an integer, not ", it->dump()));
  }
  if (it->is_number_unsigned() && it->get<std::uint64_t>() > INT64_MAX) {
    return error(absl::StrCat("member \"", member, "\" is out of range: ", it->dump()));
  }
  return it->get<std::int64_t>();
}

absl::StatusOr<std::uint32_t> Decoder::stream(const Json& object) {
  // A stream handle, any 64-bit unsigned value: capalloc's own traces write
  // kNoStream (2^64 - 1) for a block of a destroyed stream's segment.
  const auto found = object.find("stream");
  if (found == object.end()) return error("member \"stream\" is missing");
  if (!found->is_number_integer()) {
    return error(absl::StrCat("member \"stream\" must be an integer, not ", found->dump()));
  }
  if (!found->is_number_unsigned() && found->get<std::int64_t>() < 0) {
    return error(absl::StrCat("stream ", found->get<std::int64_t>(), " is negative"));
  }
  const auto id = found->get<std::uint64_t>();
  if (streams_.empty()) {  // the default stream is always dense stream 0
    streams_.emplace(0, 0);
    trace_.stream_ids.push_back(0);
  }
  auto [it, inserted] = streams_.emplace(id, static_cast<std::uint32_t>(streams_.size()));
  if (inserted) trace_.stream_ids.push_back(id);
  return it->second;
}

absl::Status Decoder::check_device(const Json& object) const {
  const auto it = object.find("device");
  if (it == object.end()) return absl::OkStatus();
  if (!it->is_number_integer()) return error("member \"device\" must be an integer");
  if (it->get<std::int64_t>() != 0) {
    return error(absl::StrCat("device ", it->dump(),
                              ": capalloc bench replays device 0 only (convert one device of "
                              "a multi-device trace at a time)"));
  }
  return absl::OkStatus();
}

absl::Status Decoder::event(const Json& object) {
  const auto op = object.find("op");
  if (op == object.end() || !op->is_string()) return error("member \"op\" (a string) is missing");
  const std::string name = op->get<std::string>();
  if (name == "alloc") return alloc(object);
  if (name == "free") return free_or_record(object, OpKind::kFree);
  if (name == "record_stream") return free_or_record(object, OpKind::kRecordStream);
  if (name == "capture_begin") return capture_begin(object);
  if (name == "capture_end") return capture_event(object, OpKind::kCaptureEnd);
  if (name == "replay") return capture_event(object, OpKind::kReplay);
  if (name == "graph_destroy") return capture_event(object, OpKind::kGraphDestroy);
  // Written by the library's event trace; a replay makes its own.
  if (name == "release" || name == "release_done" || name == "finding") return absl::OkStatus();
  return error(absl::StrCat("unknown op \"", name, "\""));
}

absl::Status Decoder::alloc(const Json& object) {
  auto id = integer(object, "id");
  if (!id.ok()) return id.status();
  auto size = integer(object, "size");
  if (!size.ok()) return size.status();
  if (*size <= 0) return error(absl::StrCat("alloc of id ", *id, ": size ", *size, " (must be > 0)"));
  if (auto s = check_device(object); !s.ok()) return s;
  auto dense_stream = stream(object);
  if (!dense_stream.ok()) return dense_stream.status();
  if (live_.count(*id) != 0) {
    return error(absl::StrCat("alloc of id ", *id, ", which is live (allocated before and not freed)"));
  }
  std::uint32_t slot;
  if (free_slots_.empty()) {
    slot = static_cast<std::uint32_t>(trace_.slots++);
  } else {
    slot = free_slots_.back();
    free_slots_.pop_back();
  }
  live_.emplace(*id, slot);
  const auto bytes = static_cast<std::uint64_t>(*size);
  live_sizes_[slot] = bytes;
  live_streams_[slot] = *dense_stream;
  live_bytes_ += bytes;
  if (live_bytes_ > trace_.peak_requested_bytes) trace_.peak_requested_bytes = live_bytes_;
  push({.size = bytes, .index = slot, .stream = *dense_stream, .kind = OpKind::kAlloc});
  ++trace_.allocs;
  return absl::OkStatus();
}

absl::Status Decoder::free_or_record(const Json& object, OpKind kind) {
  const char* what = op_name(kind);
  auto id = integer(object, "id");
  if (!id.ok()) return id.status();
  std::uint32_t dense_stream = 0;
  if (kind == OpKind::kRecordStream) {
    auto s = stream(object);
    if (!s.ok()) return s.status();
    dense_stream = *s;
  }
  const auto it = live_.find(*id);
  if (it == live_.end()) {
    return error(absl::StrCat(what, " of id ", *id, ", which is not live (never allocated, or freed already)"));
  }
  const std::uint32_t slot = it->second;
  TraceOp op{.index = slot, .stream = dense_stream, .kind = kind};
  if (kind == OpKind::kFree) {
    op.size = live_sizes_[slot];
    op.stream = live_streams_[slot];
    live_bytes_ -= op.size;
    live_sizes_.erase(slot);
    live_streams_.erase(slot);
    live_.erase(it);
    free_slots_.push_back(slot);
    ++trace_.frees;
  }
  push(op);
  return absl::OkStatus();
}

absl::Status Decoder::capture_begin(const Json& object) {
  auto id = integer(object, "capture");
  if (!id.ok()) return id.status();
  if (auto s = check_device(object); !s.ok()) return s;
  auto dense_stream = stream(object);
  if (!dense_stream.ok()) return dense_stream.status();
  if (*dense_stream == 0) {
    return error(absl::StrCat("capture ", *id, " begins on stream 0, the default stream, which "
                              "cannot be captured (CUDA refuses it): capture on a stream of its own"));
  }
  if (captures_.count(*id) != 0) return error(absl::StrCat("capture ", *id, " is begun twice"));
  if (const auto busy = capturing_.find(*dense_stream); busy != capturing_.end()) {
    return error(absl::StrCat("capture ", *id, " begins on stream ", trace_.stream_ids[*dense_stream],
                              ", which capture ", busy->second, " is still capturing"));
  }
  std::uint32_t pool = kNoPool;
  if (const auto it = object.find("pool"); it != object.end()) {
    if (!it->is_string()) return error("member \"pool\" must be a string (a shared pool's name)");
    auto [entry, inserted] =
        pools_.emplace(it->get<std::string>(), static_cast<std::uint32_t>(pools_.size()));
    if (inserted) trace_.pools.push_back(entry->first);
    pool = entry->second;
  }
  const auto index = static_cast<std::uint32_t>(trace_.captures++);
  captures_.emplace(*id, CaptureEntry{.index = index, .stream = *dense_stream});
  capturing_.emplace(*dense_stream, *id);
  push({.index = index, .stream = *dense_stream, .pool = pool,
                        .kind = OpKind::kCaptureBegin});
  return absl::OkStatus();
}

absl::Status Decoder::capture_event(const Json& object, OpKind kind) {
  const char* what = op_name(kind);
  auto id = integer(object, "capture");
  if (!id.ok()) return id.status();
  const auto it = captures_.find(*id);
  if (it == captures_.end()) return error(absl::StrCat(what, " of capture ", *id, ", which was never begun"));
  CaptureEntry& capture = it->second;
  const CaptureState expected = kind == OpKind::kCaptureEnd ? CaptureState::kActive : CaptureState::kEnded;
  if (capture.state != expected) {
    const char* state = capture.state == CaptureState::kActive ? "still capturing"
                        : capture.state == CaptureState::kEnded ? "ended already"
                                                                : "destroyed";
    return error(absl::StrCat(what, " of capture ", *id, ", which is ", state));
  }
  if (kind == OpKind::kCaptureEnd) {
    capture.state = CaptureState::kEnded;
    capturing_.erase(capture.stream);
  } else if (kind == OpKind::kGraphDestroy) {
    capture.state = CaptureState::kDestroyed;
  } else {
    ++trace_.replays;
  }
  push({.index = capture.index, .stream = capture.stream, .kind = kind});
  return absl::OkStatus();
}

absl::StatusOr<Trace> Decoder::finish() {
  if (!have_header_) {
    return absl::InvalidArgumentError(
        absl::StrCat(trace_.name, ": no header (the first object must name \"format\": \"",
                     kFormat, "\")"));
  }
  if (!capturing_.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        trace_.name, ": capture ", capturing_.begin()->second, " never ends (no capture_end)"));
  }
  if (trace_.stream_ids.empty()) trace_.stream_ids.push_back(0);
  for (const auto& [id, slot] : live_) {
    trace_.live_at_end.push_back({slot, live_sizes_[slot], live_streams_[slot]});
  }
  return std::move(trace_);
}

}  // namespace

absl::StatusOr<Trace> parse_trace(std::istream& in, std::string_view name) {
  Decoder decoder(name);
  std::string text;
  for (std::size_t number = 1; std::getline(in, text); ++number) {
    if (auto s = decoder.line(number, text); !s.ok()) return s;
  }
  if (in.bad()) return absl::DataLossError(absl::StrCat(std::string(name), ": read error"));
  return decoder.finish();
}

absl::StatusOr<Trace> read_trace(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": a directory, not a trace file"));
  }
  std::ifstream in(path);
  if (!in) {
    const int error = errno;  // what open(2) said: missing, or not readable
    return absl::NotFoundError(absl::StrCat(path, ": cannot open the trace: ", std::strerror(error)));
  }
  return parse_trace(in, path);
}

}  // namespace capalloc::trace
