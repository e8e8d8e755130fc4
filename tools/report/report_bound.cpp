// tools/report/report_bound.cpp: see report_bound.hpp.
#include "tools/report/report_bound.hpp"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"

namespace capalloc::report {

namespace {

using Json = nlohmann::ordered_json;
constexpr std::size_t kNone = std::numeric_limits<std::size_t>::max();

// One block's lifetime in the trace, by event index.
struct Span {
  std::size_t alloc = 0;
  std::size_t free = kNone;  // kNone: live at the end
  std::uint64_t size = 0;
  std::uint64_t addr = 0;
  bool keep = false;
};

std::optional<std::uint64_t> unsigned_member(const Json& e, const char* name) {
  const auto it = e.find(name);
  if (it == e.end() || !it->is_number_integer() || it->get<std::int64_t>() < 0) return {};
  return it->get<std::uint64_t>();
}

std::uint64_t address(const Json& e, const char* name = "addr") {
  const auto it = e.find(name);
  if (it == e.end()) return 0;
  if (it->is_number_unsigned()) return it->get<std::uint64_t>();
  if (!it->is_string()) return 0;
  const std::string& text = it->get_ref<const std::string&>();
  try {
    return std::stoull(text, nullptr, 16);
  } catch (...) {
    return 0;
  }
}

// The trace's blocks, and which block each event is about (kNone: none).
struct Blocks {
  std::vector<Span> spans;
  std::vector<std::size_t> block_of_event;
  absl::flat_hash_map<std::uint64_t, std::size_t> last_by_id;  // the latest block of each id
};

// Marks the blocks the trace's findings involve (step 1, trace side).
void keep_finding_blocks(const Json& events, Blocks& b) {
  b.block_of_event.assign(events.size(), kNone);
  absl::flat_hash_map<std::uint64_t, std::size_t> live;
  for (std::size_t i = 0; i < events.size(); ++i) {
    const Json& e = events[i];
    const auto op_it = e.find("op");
    if (op_it == e.end() || !op_it->is_string()) continue;
    const std::string& op = op_it->get_ref<const std::string&>();
    const std::optional<std::uint64_t> id = unsigned_member(e, "id");
    if (op == "alloc" && id) {
      const std::uint64_t size = unsigned_member(e, "rounded").value_or(
          unsigned_member(e, "size").value_or(0));
      b.spans.push_back({.alloc = i, .size = size, .addr = address(e)});
      b.block_of_event[i] = b.spans.size() - 1;
      live[*id] = b.spans.size() - 1;
      b.last_by_id[*id] = b.spans.size() - 1;
    } else if (op == "finding") {
      for (const char* who : {"victim", "writer"}) {
        const auto seq = unsigned_member(e, who);
        if (seq && b.last_by_id.contains(*seq)) b.spans[b.last_by_id[*seq]].keep = true;
      }
      // The blocks over the harmed bytes when it was reported.
      const std::uint64_t begin = address(e);
      const std::uint64_t end = begin + unsigned_member(e, "size").value_or(0);
      for (const auto& [live_id, s] : live) {
        const Span& span = b.spans[s];
        if (span.addr < end && begin < span.addr + span.size) b.spans[s].keep = true;
      }
    } else if (id && live.contains(*id)) {
      // free, record_stream, release, release_done of a live block.
      const std::size_t s = live[*id];
      b.block_of_event[i] = s;
      if (op == "free") {
        b.spans[s].free = i;
        live.erase(*id);
      }
    }
  }
}

// `object[key]`, or null where `object` is no object or has no `key`; and
// the same as an array, empty where it is something else. The snapshot's
// shape is not checked whole when it is read (report_data.cpp), so every
// step here takes any JSON.
const Json& member(const Json& object, const char* key) {
  static const Json kNull;
  if (!object.is_object()) return kNull;
  const auto it = object.find(key);
  return it == object.end() ? kNull : *it;
}
const Json& array_member(const Json& object, const char* key) {
  static const Json kEmpty = Json::array();
  const Json& value = member(object, key);
  return value.is_array() ? value : kEmpty;
}

// Marks the blocks the snapshot names (step 1, snapshot side).
void keep_snapshot_blocks(const Json& snapshot, Blocks& b) {
  if (!snapshot.is_object()) return;
  auto keep = [&](const Json& value) {
    if (!value.is_number_integer()) return;
    const auto it = b.last_by_id.find(value.get<std::uint64_t>());
    if (it != b.last_by_id.end()) b.spans[it->second].keep = true;
  };
  auto keep_sequence_of = [&](const Json& object) {
    if (object.is_object() && object.contains("sequence")) keep(object["sequence"]);
  };
  for (const Json& f : array_member(snapshot, "findings")) {
    keep_sequence_of(member(f, "victim"));
    keep_sequence_of(member(f, "writer"));
    for (const Json& link : array_member(f, "reuse_chain")) keep_sequence_of(member(link, "block"));
  }
  for (const Json& device : array_member(snapshot, "devices")) {
    for (const Json& pool : array_member(device, "pools")) {
      for (const Json& segment : array_member(pool, "segments")) {
        for (const Json& block : array_member(segment, "blocks")) {
          if (member(block, "state") != "free") keep_sequence_of(block);
        }
      }
    }
    for (const Json& block : array_member(device, "live_blocks")) keep_sequence_of(block);
  }
  for (const Json& group : array_member(member(snapshot, "audit"), "groups")) {
    for (const Json& block : array_member(group, "block_list")) keep_sequence_of(block);
  }
}

// Steps 2 and 3: the blocks live at the end, then the largest and the
// longest-lived, alternately, while fewer than `max_blocks` are kept.
void keep_within(std::vector<Span>& spans, std::size_t max_blocks, std::size_t events) {
  std::size_t kept = std::count_if(spans.begin(), spans.end(), [](const Span& s) { return s.keep; });
  for (Span& s : spans) {
    if (kept >= max_blocks) return;
    if (!s.keep && s.free == kNone) {
      s.keep = true;
      ++kept;
    }
  }
  std::vector<std::size_t> by_size(spans.size());
  for (std::size_t i = 0; i < spans.size(); ++i) by_size[i] = i;
  std::vector<std::size_t> by_life = by_size;
  auto life = [&](std::size_t i) {
    return (spans[i].free == kNone ? events : spans[i].free) - spans[i].alloc;
  };
  // Ties (a churn of equal blocks) in bit-reversed order of allocation,
  // so that the blocks kept among equals spread over the whole trace
  // instead of piling up at its start.
  auto spread = [](std::size_t i) {
    std::uint32_t v = static_cast<std::uint32_t>(i);
    std::uint32_t r = 0;
    for (int bit = 0; bit < 32; ++bit, v >>= 1) r = (r << 1) | (v & 1u);
    return r;
  };
  std::sort(by_size.begin(), by_size.end(), [&](std::size_t a, std::size_t b) {
    if (spans[a].size != spans[b].size) return spans[a].size > spans[b].size;
    return spread(a) < spread(b);
  });
  std::sort(by_life.begin(), by_life.end(), [&](std::size_t a, std::size_t b) {
    if (life(a) != life(b)) return life(a) > life(b);
    return spread(a) < spread(b);
  });
  std::size_t next_size = 0;
  std::size_t next_life = 0;
  bool largest = true;
  while (kept < max_blocks && (next_size < spans.size() || next_life < spans.size())) {
    std::vector<std::size_t>& order = largest ? by_size : by_life;
    std::size_t& next = largest ? next_size : next_life;
    largest = !largest;
    while (next < order.size() && spans[order[next]].keep) ++next;
    if (next == order.size()) continue;
    spans[order[next]].keep = true;
    ++kept;
  }
}

// What was left out, per bucket of event indices.
Json summarize_left_out(const Json& events, const Blocks& b, std::size_t max_blocks) {
  const std::size_t n = events.size();
  const std::size_t buckets = std::min<std::size_t>(kOmittedBuckets, std::max<std::size_t>(1, n));
  struct Bucket {
    std::uint64_t blocks = 0, bytes = 0, peak_blocks = 0, peak_bytes = 0;
    std::optional<std::uint64_t> t0, t1;
  };
  std::vector<Bucket> out(buckets);
  std::uint64_t live_blocks = 0, live_bytes = 0, blocks = 0, bytes = 0, kept = 0;
  for (const Span& s : b.spans) kept += s.keep ? 1 : 0;
  for (std::size_t i = 0; i < n; ++i) {
    Bucket& k = out[i * buckets / n];
    if (const auto t = unsigned_member(events[i], "t")) {
      if (!k.t0) k.t0 = *t;
      k.t1 = *t;
    }
    const std::size_t s = b.block_of_event[i];
    if (s != kNone && !b.spans[s].keep) {
      const Span& span = b.spans[s];
      if (span.alloc == i) {
        ++k.blocks;
        k.bytes += span.size;
        ++blocks;
        bytes += span.size;
        ++live_blocks;
        live_bytes += span.size;
      } else if (span.free == i) {
        --live_blocks;
        live_bytes -= span.size;
      }
    }
    k.peak_blocks = std::max(k.peak_blocks, live_blocks);
    k.peak_bytes = std::max(k.peak_bytes, live_bytes);
  }
  Json rows = Json::array();
  for (std::size_t k = 0; k < buckets; ++k) {
    Json row = {{"x0", k * n / buckets},
                {"x1", (k + 1) * n / buckets},
                {"blocks", out[k].blocks},
                {"bytes", out[k].bytes},
                {"peak_live_blocks", out[k].peak_blocks},
                {"peak_live_bytes", out[k].peak_bytes}};
    if (out[k].t0) {
      row["t0"] = *out[k].t0;
      row["t1"] = *out[k].t1;
    }
    rows.push_back(std::move(row));
  }
  return {{"blocks", blocks},    {"bytes", bytes},
          {"kept", kept},        {"total", b.spans.size()},
          {"max_blocks", max_blocks}, {"buckets", std::move(rows)}};
}

}  // namespace

void bound_report_blocks(ReportData& data, std::size_t max_blocks) {
  if (max_blocks == 0 || data.trace_header.is_null()) return;
  Blocks b;
  keep_finding_blocks(data.events, b);
  if (b.spans.size() <= max_blocks) return;
  keep_snapshot_blocks(data.snapshot, b);
  keep_within(b.spans, max_blocks, data.events.size());
  data.omitted = summarize_left_out(data.events, b, max_blocks);
  Json kept = Json::array();
  for (std::size_t i = 0; i < data.events.size(); ++i) {
    const std::size_t s = b.block_of_event[i];
    if (s != kNone && !b.spans[s].keep) continue;
    Json e = std::move(data.events[i]);
    e["x"] = i;  // the page's time axis stays the trace's event index
    kept.push_back(std::move(e));
  }
  data.events = std::move(kept);
  const auto left_out = data.omitted["blocks"].get<std::uint64_t>();
  data.notes.push_back(absl::StrCat(
      left_out, " of the trace's ", b.spans.size(), " blocks are not drawn (at most ",
      max_blocks, " are: --max-blocks). Drawn: every block a finding involves, the blocks live at "
      "the end and those the snapshot holds, then the largest and the longest-lived. The rest "
      "are summarized under \"Blocks left out\"."));
}

}  // namespace capalloc::report
