// capture/capture_tracker.cpp: the CaptureTracker's public calls: begin and
// end a capture, replay through the guard, check, destroy. The machinery is
// in tracker_impl.cpp; the state and its locking in tracker_impl.hpp.
#include <algorithm>
#include <atomic>
#include <mutex>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/config.hpp"
#include "common/log.hpp"
#include "capalloc/capture.hpp"
#include "allocator/listener_lock.hpp"
#include "allocator/trace_hooks.hpp"
#include "capture/alias_rule.hpp"
#include "capture/block_history.hpp"
#include "capture/tracker_impl.hpp"
#include "capture/write_record.hpp"

namespace capalloc {

using detail::IndexedRecord;

absl::StatusOr<TrackerOptions> TrackerOptions::from_env() {
  TrackerOptions options;
  const absl::StatusOr<std::string> strict = config::get_choice(config::Var::kStrict);
  if (!strict.ok()) return strict.status();
  options.strict = *strict != "0";
  options.strict_possible = *strict == "possible";
  return options;
}

absl::StatusOr<std::unique_ptr<CaptureTracker>> CaptureTracker::create(Allocator& allocator,
                                                                       TrackerOptions options) {
  auto impl = std::make_unique<Impl>();
  impl->allocator = &allocator;
  impl->runtime = allocator.device_runtime();
  if (impl->runtime == nullptr) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "CaptureTracker::create: the allocator's %s runtime has no graph and launch seam (it "
        "is a MemoryRuntime, not a DeviceRuntime), so captures cannot be inspected",
        std::string(allocator.runtime().name())));
  }
  impl->strict = options.strict;
  impl->strict_possible = options.strict_possible;
  if (absl::Status s = allocator.set_capture_listener(impl.get()); !s.ok()) return s;
  return std::unique_ptr<CaptureTracker>(new CaptureTracker(std::move(impl)));
}

CaptureTracker::CaptureTracker(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

CaptureTracker::~CaptureTracker() {
  impl_->allocator->set_capture_listener(nullptr).IgnoreError();
  std::lock_guard lock(impl_->mu);
  for (auto& [graph, record] : impl_->records) {
    impl_->runtime->destroy_graph(graph).IgnoreError();
    if ((graph & detail::kDiscoveredGraph) == 0) {
      impl_->allocator->drop_graph_pool_hold(record->record.pool, record->record.capture)
          .IgnoreError();
    }
  }
}

Allocator& CaptureTracker::allocator() const { return *impl_->allocator; }
bool CaptureTracker::graph_uses(int device, MemorySpan span) const {
  return impl_->graph_uses(device, span);
}
TrackerWork CaptureTracker::work() const {
  std::lock_guard lock(impl_->mu);
  TrackerWork work = impl_->work;
  work.blocks += impl_->history.visited();
  work.accesses += impl_->index.visited();
  return work;
}
bool CaptureTracker::strict() const { return impl_->strict.load(); }
void CaptureTracker::set_strict(bool strict) { impl_->strict = strict; }
bool CaptureTracker::strict_possible() const { return impl_->strict_possible.load(); }
void CaptureTracker::set_strict_possible(bool strict_possible) {
  impl_->strict_possible = strict_possible;
}

absl::StatusOr<CaptureId> CaptureTracker::begin_capture(int device, StreamHandle stream,
                                                        CaptureOptions options) {
  Impl& m = *impl_;
  Allocator& a = *m.allocator;
  std::lock_guard lock(m.mu);
  // A handle on the pool for the duration of this call (the caller's pool
  // must still have a handle: a released pool takes no new capture); the
  // graph then takes a reference of its own, held until destroy_graph.
  PoolHandle pool = options.pool;
  if (pool == kDefaultPool) {
    auto created = a.create_graph_pool(device);
    if (!created.ok()) return created.status();
    pool = *created;
  } else if (absl::Status s = a.retain_graph_pool(pool); !s.ok()) {
    return s;
  }
  // Ticks order the allocator's events around the capture's start.
  std::uint64_t begin_tick = 0;
  detail::with_listener_lock(a, [&] { begin_tick = ++m.ticks; });
  auto id = m.runtime->begin_capture(stream, options.mode);
  if (!id.ok()) {
    a.release_graph_pool(pool).IgnoreError();
    return id.status();
  }
  absl::Status routed = a.hold_graph_pool(pool, *id);
  if (routed.ok()) {
    routed = a.begin_allocate_to_pool(device, *id, pool, stream);
    if (!routed.ok()) a.drop_graph_pool_hold(pool, *id).IgnoreError();
  }
  a.release_graph_pool(pool).IgnoreError();
  if (!routed.ok()) {
    if (auto g = m.runtime->end_capture(stream); g.ok()) m.runtime->destroy_graph(*g).IgnoreError();
    return routed;
  }
  m.active[stream] = detail::ActiveCapture{*id, device, stream, pool, options.label, begin_tick};
  detail::trace_capture_begin(a, *id, stream, pool, device, options.label);
  return *id;
}

absl::StatusOr<CaptureResult> CaptureTracker::end_capture(StreamHandle stream) {
  Impl& m = *impl_;
  Allocator& a = *m.allocator;
  std::lock_guard lock(m.mu);
  auto it = m.active.find(stream);
  if (it == m.active.end()) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "end_capture: stream 0x%x has no capture begun through this tracker", stream));
  }
  const detail::ActiveCapture capture = it->second;
  // The capture's allocation events are noted while it is still known as
  // begun here; drained after, they would register it as discovered too,
  // and a second (footprint) record would follow at the next check.
  m.drain_log();
  m.active.erase(it);
  auto graph = m.runtime->end_capture(stream);
  detail::trace_capture_end(a, capture.id);
  // Whatever the outcome, the capture no longer allocates into the pool.
  {
    const Impl::SelfCall self;
    a.end_allocate_to_pool(capture.id).IgnoreError();
  }
  m.drain_log();
  if (!graph.ok()) {
    m.allocated_in.erase(capture.id);
    a.drop_graph_pool_hold(capture.pool, capture.id).IgnoreError();
    return graph.status();
  }

  CaptureResult result;
  result.graph = *graph;
  auto writes = m.runtime->graph_writes(*graph);
  if (!writes.ok()) {
    detail::log().info("capture {}: its graph's accesses cannot be read ({}); footprint evidence",
                       capture.id, std::string(writes.status().message()));
  }
  result.new_findings = m.finish_capture(capture, *graph, writes, m.order_of(*graph));
  return result;
}

absl::StatusOr<std::vector<Finding>> CaptureTracker::check_graph(GraphHandle graph) {
  Impl& m = *impl_;
  std::lock_guard lock(m.mu);
  m.allocator->apply_graph_lifetimes();
  m.drain_log();
  auto r = m.record_of(graph);
  if (!r.ok()) return r.status();
  return m.check_record(**r);
}

std::vector<Finding> CaptureTracker::check() {
  Impl& m = *impl_;
  std::lock_guard lock(m.mu);
  m.allocator->apply_graph_lifetimes();
  m.drain_log();
  m.finish_discovered();
  std::vector<Finding> all;
  for (const auto& [graph, record] : m.records) {
    for (Finding& f : m.check_record(*record)) all.push_back(std::move(f));
  }
  detail::sort_findings(all);
  return all;
}

absl::Status CaptureTracker::replay(GraphHandle graph, StreamHandle stream) {
  auto findings = check_graph(graph);
  if (!findings.ok()) return findings.status();
  std::string hazards;
  const bool refuse_possible = impl_->strict_possible.load();
  for (const Finding& f : *findings) {
    const bool refusable = f.severity == Severity::kHazard ||
                           (refuse_possible && f.severity == Severity::kPossible);
    if (refusable && !f.waived) absl::StrAppend(&hazards, "\n  ", f.summary());
  }
  if (!hazards.empty() && strict()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "replay of graph ", graph, " refused (strict mode): it would clobber live blocks:",
        hazards));
  }
  {
    std::lock_guard lock(impl_->mu);
    for (const Finding& f : impl_->only_new(*findings)) {
      if (detail::log().should_log(spdlog::level::warn)) detail::log().warn("{}", f.summary());
    }
  }
  CaptureId capture = 0;
  {
    std::lock_guard lock(impl_->mu);
    if (auto r = impl_->record_of(graph); r.ok()) capture = (*r)->record.capture;
  }
  if (absl::Status s = impl_->runtime->launch_graph(graph, stream); !s.ok()) return s;
  detail::trace_replay(*impl_->allocator, capture);
  return absl::OkStatus();
}

absl::Status CaptureTracker::destroy_graph(GraphHandle graph) {
  Impl& m = *impl_;
  std::lock_guard lock(m.mu);
  auto it = m.records.find(graph);
  if (it == m.records.end()) {
    return absl::NotFoundError(
        absl::StrFormat("destroy_graph: graph %d is unknown to this tracker", graph));
  }
  // A graph the application already destroyed through the runtime is gone
  // all the same: its record, findings and pool reference go too.
  if (absl::Status s = m.runtime->destroy_graph(graph);
      !s.ok() && s.code() != absl::StatusCode::kNotFound) {
    return s;
  }
  const CaptureId capture = it->second->record.capture;
  detail::trace_graph_destroy(*m.allocator, capture);
  // kNotFound: the runtime already reported the graph gone (destroyed
  // through it) and the allocator let the hold go then.
  if (absl::Status s = m.allocator->drop_graph_pool_hold(m.drop_record(graph), capture);
      !s.ok() && s.code() != absl::StatusCode::kNotFound) {
    return s;
  }
  return absl::OkStatus();
}

absl::Status CaptureTracker::waive(GraphHandle graph, const void* victim, std::string_view tag,
                                   std::string_view reason) {
  Impl& m = *impl_;
  if (reason.empty()) {
    return absl::InvalidArgumentError("waive: give the reason the finding is benign");
  }
  if (victim == nullptr && tag.empty()) {
    return absl::InvalidArgumentError("waive: name the victim by a pointer into it or by its tag");
  }
  std::lock_guard lock(m.mu);
  if (!m.records.contains(graph)) {
    return absl::NotFoundError(
        absl::StrFormat("waive: graph %d is unknown to this tracker (not captured through it, "
                        "not yet checked, or destroyed)",
                        graph));
  }
  Impl::Waiver w{.victim = 0, .tag = std::string(tag), .reason = std::string(reason)};
  if (victim != nullptr) {
    auto info = m.allocator->block_info(victim);
    if (!info.ok()) {
      return absl::NotFoundError(absl::StrFormat(
          "waive: %p is in no live block: %s", victim, std::string(info.status().message())));
    }
    // block_info also finds free memory: no victim lives there.
    if (info->state != BlockState::kAllocated) {
      return absl::NotFoundError(absl::StrFormat(
          "waive: %p is in no live block: the memory there is free", victim));
    }
    w.victim = info->sequence;
    w.tag.clear();
  }
  m.waivers[graph].push_back(std::move(w));
  return absl::OkStatus();
}

absl::StatusOr<WriteRecord> CaptureTracker::write_record(GraphHandle graph) const {
  std::lock_guard lock(impl_->mu);
  auto r = impl_->record_of(graph);
  if (!r.ok()) return r.status();
  return (*r)->record;
}

std::vector<ChainLink> CaptureTracker::reuse_chain(int device, MemorySpan span) {
  Impl& m = *impl_;
  std::lock_guard lock(m.mu);
  m.drain_log();
  std::vector<ChainLink> chain;
  for (const detail::Occupant* o : m.history.overlapping(device, span)) chain.push_back(o->link());
  return chain;
}

}  // namespace capalloc
