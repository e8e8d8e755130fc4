// tools/report/scenario_trace.cpp: see scenario_trace.hpp.
#include "tools/report/scenario_trace.hpp"

#include <utility>

#include <nlohmann/json.hpp>

#include "absl/strings/str_format.h"

namespace capalloc::report {

namespace {

using Json = nlohmann::ordered_json;

std::string pointer(const void* p) { return absl::StrFormat("%p", p); }

}  // namespace

ScenarioTrace::ScenarioTrace(std::string source)
    : source_(std::move(source)), start_(std::chrono::steady_clock::now()) {}

std::uint64_t ScenarioTrace::now_ns() const {
  return static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                        std::chrono::steady_clock::now() - start_)
                                        .count());
}

void ScenarioTrace::emit(nlohmann::ordered_json event) {
  event["t"] = now_ns();
  lines_.push_back(event.dump(-1, ' ', false, Json::error_handler_t::replace));
}

void ScenarioTrace::step(const Allocator& allocator) {
  std::map<std::uint64_t, BlockInfo> now;
  std::uint64_t allocations = 0;
  for (int d = 0; d < allocator.runtime().device_count(); ++d) {
    if (auto stats = allocator.stats(d); stats.ok()) allocations += stats->allocations;
    for (const SegmentInfo& segment : allocator.segments(d)) {
      for (const BlockInfo& b : segment.blocks) {
        if (b.state == BlockState::kAllocated) now.emplace(b.sequence, b);
      }
    }
  }
  // Frees first: a step may free a block and hand its memory out again.
  for (auto it = live_.begin(); it != live_.end();) {
    if (now.count(it->first) != 0) {
      ++it;
      continue;
    }
    Json e;
    e["op"] = "free";
    e["id"] = it->first;
    e["addr"] = pointer(it->second.ptr);
    emit(std::move(e));
    it = live_.erase(it);
  }
  std::uint64_t added = 0;
  for (const auto& [sequence, b] : now) {
    if (live_.count(sequence) != 0) continue;
    Json e;
    e["op"] = "alloc";
    e["id"] = sequence;
    e["size"] = b.requested;
    e["rounded"] = b.size;
    e["stream"] = static_cast<std::uint64_t>(b.stream);
    e["device"] = b.device;
    e["tag"] = std::string(b.tag);
    e["lifetime"] = b.lifetime == Lifetime::kPersistent ? "persistent" : "transient";
    e["addr"] = pointer(b.ptr);
    e["pool"] = b.pool;
    e["capture"] = b.capture;
    emit(std::move(e));
    live_.emplace(sequence, LiveBlock{b.ptr, b.size});
    ++added;
  }
  const std::uint64_t made = allocations - allocations_seen_;
  if (made > added) missed_ += made - added;
  allocations_seen_ = allocations;
}

void ScenarioTrace::capture_begun(const Allocator& allocator, CaptureId capture,
                                  StreamHandle stream, PoolHandle pool, std::string_view label) {
  step(allocator);
  Json e;
  e["op"] = "capture_begin";
  e["capture"] = capture;
  e["stream"] = static_cast<std::uint64_t>(stream);
  e["pool"] = std::to_string(pool);
  e["label"] = std::string(label);
  emit(std::move(e));
}

void ScenarioTrace::capture_ended(const Allocator& allocator, CaptureId capture,
                                  const std::vector<Finding>& new_findings) {
  step(allocator);
  Json e;
  e["op"] = "capture_end";
  e["capture"] = capture;
  emit(std::move(e));
  for (const Finding& f : new_findings) {
    Json finding;
    finding["op"] = "finding";
    finding["severity"] = severity_name(f.severity);
    finding["addr"] = pointer(f.overlap.ptr);
    finding["size"] = f.harmed_bytes();
    finding["graph"] = f.graph;
    finding["capture"] = f.capture;
    finding["victim"] = f.victim.sequence;
    finding["writer"] = f.writer.sequence;
    finding["message"] = f.summary();
    emit(std::move(finding));
  }
}

void ScenarioTrace::replayed(const Allocator& allocator, CaptureId capture, bool refused) {
  step(allocator);
  Json e;
  e["op"] = "replay";
  e["capture"] = capture;
  if (refused) e["refused"] = true;
  emit(std::move(e));
}

void ScenarioTrace::finished(CaptureTracker& tracker) {
  step(tracker.allocator());
  snapshot_ = tracker.snapshot_json();
}

std::string ScenarioTrace::trace_jsonl() const {
  Json header;
  header["format"] = "capalloc.trace/1";
  header["source"] = source_;
  header["devices"] = 1;
  std::string out = header.dump(-1, ' ', false, Json::error_handler_t::replace) + "\n";
  for (const std::string& line : lines_) out += line + "\n";
  return out;
}

}  // namespace capalloc::report
