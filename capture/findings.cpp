// capture/findings.cpp: how findings read, as text and as JSON (the schema
// is documented in docs/findings.md).
#include <cmath>
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/format.hpp"
#include "capalloc/capture.hpp"
#include "capture/findings.hpp"
#include "capture/json_writer.hpp"

namespace capalloc {

namespace detail {



namespace {

std::string describe_block(const BlockRef& b) {
  if (b.sequence == 0) return "memory no block held at capture time";
  std::string where = b.capture == 0
                          ? std::string("outside any capture")
                          : absl::StrFormat("in capture %d at position %d", b.capture,
                                            b.capture_position);
  return absl::StrFormat("'%s' (block #%d, %s, %s at %p, allocated %s)",
                         b.tag.empty() ? "untagged" : b.tag, b.sequence,
                         b.lifetime == Lifetime::kPersistent ? "persistent" : "transient",
                         bytes(static_cast<std::uint64_t>(b.size)), b.ptr, where);
}

void write_block(JsonWriter& j, const BlockRef& b) {
  j.begin_object();
  j.field("sequence", b.sequence);
  j.field("tag", b.tag);
  j.key("ptr").pointer(b.ptr);
  j.field("size", static_cast<std::uint64_t>(b.size));
  j.field("lifetime", b.lifetime == Lifetime::kPersistent ? "persistent" : "transient");
  j.field("pool", b.pool);
  j.field("capture", b.capture);
  j.field("capture_position", static_cast<std::uint64_t>(b.capture_position));
  j.end_object();
}

}  // namespace

void write_finding(JsonWriter& j, const Finding& f) {
  j.begin_object();
  j.field("graph", f.graph);
  j.field("graph_label", f.graph_label);
  j.field("capture", f.capture);
  j.field("harm", harm_name(f.harm));
  j.field("severity", severity_name(f.severity));
  j.field("evidence", evidence_name(f.evidence));
  j.key("writer");
  write_block(j, f.writer);
  j.field("write_position", static_cast<std::uint64_t>(f.write_position));
  j.field("write_op", f.write_op);
  j.field("write_mode", access_mode_name(f.write_mode));
  j.field("clobbering_writes", static_cast<std::uint64_t>(f.clobbering_writes));
  j.key("victim");
  write_block(j, f.victim);
  j.key("overlap").begin_object();
  j.key("begin").pointer(f.overlap.ptr);
  j.key("end").pointer(reinterpret_cast<const void*>(f.overlap.end()));
  j.field("bytes", static_cast<std::uint64_t>(f.harmed_bytes()));
  j.field("exact", f.ranges_exact);
  j.key("ranges").begin_array();
  for (const MemorySpan& r : f.ranges) {
    j.begin_object();
    j.key("begin").pointer(r.ptr);
    j.field("bytes", static_cast<std::uint64_t>(r.bytes));
    j.end_object();
  }
  j.end_array();
  j.end_object();
  j.key("reuse_chain").begin_array();
  for (const ChainLink& link : f.reuse_chain) {
    j.begin_object();
    j.key("block");
    write_block(j, link.block);
    j.field("live", link.live);
    j.field("freed_in_capture", link.freed_in_capture);
    j.field("freed_at", static_cast<std::uint64_t>(link.freed_at));
    j.end_object();
  }
  j.end_array();
  j.key("order").begin_object();
  j.field("basis", f.order_from_edges ? "edges" : "capture_order");
  // The sentence starts with its kind: "unordered", "after", "before a read",
  // "no rewrite", "no earlier write" or "none".
  j.field("relation", std::string_view(f.order).substr(0, f.order.find(':')));
  j.field("text", f.order);
  j.key("path").begin_array();
  for (std::size_t node : f.order_path) j.value(static_cast<std::uint64_t>(node));
  j.end_array();
  j.end_object();
  j.field("mode_unknown", f.mode_unknown);
  j.field("severity_reason", f.severity_reason);
  j.key("waived");
  if (f.waived) {
    j.begin_object();
    j.field("reason", f.waiver_reason);
    j.end_object();
  } else {
    j.null();
  }
  j.field("fix", f.fix);
  j.end_object();
}

}  // namespace detail

BlockRef BlockRef::from(const BlockInfo& info) {
  BlockRef b;
  b.sequence = info.sequence;
  b.tag = info.tag;
  b.ptr = info.ptr;
  b.size = info.size;
  b.lifetime = info.lifetime;
  b.pool = info.pool;
  b.capture = info.capture;
  b.capture_position = info.capture_position;
  return b;
}

const char* severity_name(Severity severity) {
  switch (severity) {
    case Severity::kHazard:
      return "hazard";
    case Severity::kPossible:
      return "possible";
    case Severity::kCrossGraphOutput:
      return "cross_graph_output";
  }
  return "?";
}

const char* evidence_name(WriteEvidence evidence) {
  switch (evidence) {
    case WriteEvidence::kDeclared:
      return "declared";
    case WriteEvidence::kInspected:
      return "inspected";
    case WriteEvidence::kFootprint:
      return "footprint";
  }
  return "?";
}

const char* harm_name(Harm harm) {
  return harm == Harm::kClobber ? "clobber" : "stale_read";
}

const char* access_mode_name(AccessMode mode) {
  switch (mode) {
    case AccessMode::kRead:
      return "read";
    case AccessMode::kWrite:
      return "write";
    case AccessMode::kReadWrite:
      return "read_write";
    case AccessMode::kState:
      return "state";
    case AccessMode::kTouch:
      return "touch";
  }
  return "?";
}

std::size_t Finding::harmed_bytes() const {
  std::size_t total = 0;
  for (const MemorySpan& r : ranges) total += r.bytes;
  return total;
}

std::string Finding::summary() const {
  const std::string harmed = absl::StrFormat(
      "%s%s", detail::bytes(static_cast<std::uint64_t>(harmed_bytes())),
      ranges.size() > 1 ? absl::StrFormat(" in %d ranges", ranges.size()) : std::string()) +
      (ranges_exact ? "" : " (at most: footprint evidence)");
  std::string chain;
  for (const ChainLink& link : reuse_chain) {
    absl::StrAppend(&chain, chain.empty() ? "" : " -> ", "#", link.block.sequence, " '",
                    std::string(link.block.tag), "'",
                    link.live ? " (live)"
                              : absl::StrFormat(" (freed%s)",
                                                link.freed_in_capture == 0
                                                    ? std::string()
                                                    : absl::StrFormat(" in capture %d at %d",
                                                                      link.freed_in_capture,
                                                                      link.freed_at)));
  }
  if (harm == Harm::kStaleRead) {
    return absl::StrFormat(
        "[%s] %s (capture %d) reads stale data from %s: each replay reads %s from %p through %s "
        "(%s, %s at capture position %d, %s evidence%s), memory that block no longer holds. "
        "Order: %s. %s. Reuse chain: %s. Fix: %s.",
        severity_name(severity), graph_label, capture, detail::describe_block(victim), harmed,
        overlap.ptr,
        detail::describe_block(writer), write_op, access_mode_name(write_mode), write_position,
        evidence_name(evidence),
        clobbering_writes > 1 ? absl::StrFormat("; the first of %d such reads", clobbering_writes)
                              : std::string(),
        order.empty() ? "-" : order,
        severity_reason.empty() ? "Severity: -" : absl::StrCat("Severity: ", severity_reason),
        chain.empty() ? "-" : chain, fix);
  }
  return absl::StrFormat(
      "[%s] %s (capture %d) clobbers %s: each replay writes %s from %p through %s (%s, %s at "
      "capture position %d, %s evidence%s). Order: %s. %s. Reuse chain: %s. Fix: %s.",
      severity_name(severity), graph_label, capture, detail::describe_block(victim), harmed,
      overlap.ptr,
      detail::describe_block(writer), write_op, access_mode_name(write_mode), write_position,
      evidence_name(evidence),
      clobbering_writes > 1 ? absl::StrFormat("; the last of %d such writes", clobbering_writes)
                            : std::string(),
      order.empty() ? "-" : order,
      severity_reason.empty() ? "Severity: -" : absl::StrCat("Severity: ", severity_reason),
      chain.empty() ? "-" : chain, fix);
}

std::string findings_to_json(const std::vector<Finding>& findings) {
  detail::JsonWriter j;
  j.begin_array();
  for (const Finding& f : findings) detail::write_finding(j, f);
  j.end_array();
  return j.str();
}

}  // namespace capalloc
