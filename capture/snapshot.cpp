// capture/snapshot.cpp: CaptureTracker::snapshot_json(), the state of the
// allocator and the tracker as one JSON document (schema in
// docs/snapshot.md): per device its stats and live blocks, every graph's
// record in brief, and the current findings.
#include <string>

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

}  // namespace

std::string CaptureTracker::snapshot_json() {
  // Findings first: check() takes the tracker's lock itself.
  const std::vector<Finding> findings = check();
  Impl& m = *impl_;
  Allocator& a = *m.allocator;
  detail::JsonWriter j;
  j.begin_object();
  j.field("schema", "capalloc.snapshot/3");
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
      j.field("lifetime", b.lifetime == Lifetime::kPersistent ? "persistent" : "transient");
      j.field("sequence", b.sequence);
      j.field("pool", b.pool);
      j.field("capture", b.capture);
      j.end_object();
    }
    j.end_array();
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
