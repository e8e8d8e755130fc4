// capture/snapshot.cpp: CaptureTracker::snapshot_json(), the state of the
// allocator and the tracker as one JSON document (schema in
// docs/snapshot.md): per device its stats, live blocks and pools (every
// segment with every block tiling it), every graph's record with the ranges
// its replays access, and the current findings. `capalloc report` draws it.
#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "capalloc/capture.hpp"
#include "capture/findings.hpp"
#include "capture/json_writer.hpp"
#include "capture/snapshot_audit.hpp"
#include "capture/tracker_impl.hpp"

namespace capalloc {

namespace {

void write_counter(detail::JsonWriter& j, std::string_view name, const StatCounter& c) {
  j.key(name).begin_object();
  j.field("current", c.current);
  j.field("peak", c.peak);
  j.end_object();
}

void write_stats(detail::JsonWriter& j, const AllocatorStats& s) {
  j.begin_object();
  write_counter(j, "allocated_bytes", s.allocated_bytes);
  write_counter(j, "requested_bytes", s.requested_bytes);
  write_counter(j, "reserved_bytes", s.reserved_bytes);
  write_counter(j, "segments", s.segments);
  write_counter(j, "allocated_blocks", s.allocated_blocks);
  j.field("free_blocks", s.free_blocks);
  j.field("pending_free_blocks", s.pending_free_blocks);
  j.field("allocations", s.allocations);
  j.field("frees", s.frees);
  j.field("retries", s.retries);
  j.field("ooms", s.ooms);
  j.end_object();
}

const char* state_name(BlockState s) {
  switch (s) {
    case BlockState::kAllocated:
      return "allocated";
    case BlockState::kFree:
      return "free";
    case BlockState::kPendingFree:
      return "pending_free";
  }
  return "allocated";
}

const char* lifetime_name(Lifetime l) {
  return l == Lifetime::kPersistent ? "persistent" : "transient";
}

// Per pool (default first, then graph pools by handle) its segments in
// address order, each with the blocks tiling it. Free blocks carry only
// their extent and state: their tag and sequence are a former occupant's.
void write_pools(detail::JsonWriter& j, const std::vector<SegmentInfo>& segments) {
  std::vector<PoolHandle> pools;
  for (const SegmentInfo& s : segments) {
    if (std::find(pools.begin(), pools.end(), s.pool) == pools.end()) pools.push_back(s.pool);
  }
  std::sort(pools.begin(), pools.end());
  j.key("pools").begin_array();
  for (PoolHandle pool : pools) {
    j.begin_object();
    j.field("pool", pool);
    j.field("kind", pool == kDefaultPool ? "default" : "graph");
    j.key("segments").begin_array();
    for (const SegmentInfo& s : segments) {
      if (s.pool != pool) continue;
      j.begin_object();
      j.key("base").pointer(s.base);
      j.field("size", static_cast<std::uint64_t>(s.size));
      j.field("stream", static_cast<std::uint64_t>(s.stream));
      j.key("blocks").begin_array();
      for (const BlockInfo& b : s.blocks) {
        j.begin_object();
        j.key("ptr").pointer(b.ptr);
        j.field("size", static_cast<std::uint64_t>(b.size));
        j.field("state", state_name(b.state));
        if (b.state != BlockState::kFree) {
          j.field("requested", static_cast<std::uint64_t>(b.requested));
          j.field("tag", b.tag);
          j.field("lifetime", lifetime_name(b.lifetime));
          j.field("sequence", b.sequence);
          j.field("capture", b.capture);
        }
        j.end_object();
      }
      j.end_array();
      j.end_object();
    }
    j.end_array();
    j.end_object();
  }
  j.end_array();
}

// The accesses of a graph's replays, as its write record holds them.
void write_ranges(detail::JsonWriter& j, const WriteRecord& r) {
  j.key("ranges").begin_array();
  for (const RecordedWrite& w : r.writes) {
    j.begin_object();
    j.key("begin").pointer(w.span.ptr);
    j.field("bytes", static_cast<std::uint64_t>(w.span.bytes));
    j.field("mode", access_mode_name(w.mode));
    j.field("inferred_write", w.inferred_write);
    j.field("op", w.op);
    j.field("position", static_cast<std::uint64_t>(w.position));
    j.field("evidence", evidence_name(w.evidence));
    j.field("through", w.writer.sequence);
    j.end_object();
  }
  j.end_array();
}

}  // namespace

std::string CaptureTracker::snapshot_json() {
  // Findings first: check() takes the tracker's lock itself.
  const std::vector<Finding> findings = check();
  Impl& m = *impl_;
  Allocator& a = *m.allocator;
  detail::JsonWriter j;
  j.begin_object();
  j.field("schema", "capalloc.snapshot/4");
  j.field("runtime", a.runtime().name());
  j.field("strict", strict());
  j.key("devices").begin_array();
  for (int d = 0; d < a.runtime().device_count(); ++d) {
    auto stats = a.stats(d);
    if (!stats.ok()) continue;
    j.begin_object();
    j.field("device", d);
    j.key("stats");
    write_stats(j, *stats);
    j.key("live_blocks").begin_array();
    const MemorySpan everything{nullptr, ~std::size_t{0}};
    for (const BlockInfo& b : a.live_blocks(d, {everything})) {
      j.begin_object();
      j.key("ptr").pointer(b.ptr);
      j.field("size", static_cast<std::uint64_t>(b.size));
      j.field("requested", static_cast<std::uint64_t>(b.requested));
      j.field("stream", static_cast<std::uint64_t>(b.stream));
      j.field("tag", b.tag);
      j.field("lifetime", lifetime_name(b.lifetime));
      j.field("sequence", b.sequence);
      j.field("pool", b.pool);
      j.field("capture", b.capture);
      j.end_object();
    }
    j.end_array();
    write_pools(j, a.segments(d));
    j.end_object();
  }
  j.end_array();
  {
    std::lock_guard lock(m.mu);
    j.key("graphs").begin_array();
    for (const auto& [graph, record] : m.records) {
      const WriteRecord& r = record->record;
      j.begin_object();
      j.field("graph", r.graph);
      j.field("label", r.label);
      j.field("capture", r.capture);
      j.field("device", r.device);
      j.field("pool", r.pool);
      j.field("precision", evidence_name(r.precision));
      j.field("order", r.order_from_edges ? "edges" : "capture_order");
      j.field("writes", static_cast<std::uint64_t>(r.writes.size()));
      j.field("discovered", (r.graph & detail::kDiscoveredGraph) != 0);
      write_ranges(j, r);
      j.end_object();
    }
    j.end_array();
    j.key("captures_in_progress").begin_array();
    for (const auto& [stream, capture] : m.active) {
      j.begin_object();
      j.field("capture", capture.id);
      j.field("stream", static_cast<std::uint64_t>(stream));
      j.field("pool", capture.pool);
      j.field("label", capture.label);
      j.end_object();
    }
    j.end_array();
  }
  j.key("findings").begin_array();
  for (const Finding& f : findings) detail::write_finding(j, f);
  j.end_array();
  detail::write_audit_section(j, a);
  j.end_object();
  return j.str();
}

}  // namespace capalloc
