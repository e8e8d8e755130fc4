// capture/tracker_impl.cpp: the CaptureTracker's machinery: the event log,
// the history, records and their checks, and captures discovered through the
// allocator (see tracker_impl.hpp for the locking and the state).
#include "capture/tracker_impl.hpp"

#include <algorithm>
#include <string>
#include <tuple>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "allocator/listener_lock.hpp"
#include "allocator/trace_hooks.hpp"
#include "common/log.hpp"

namespace capalloc {

using detail::IndexedRecord;

// By the graph's capture (ids increase on every runtime; graph handles are
// pointers on CUDA), then the victim's allocation.
void detail::sort_findings(std::vector<Finding>& findings) {
  std::stable_sort(findings.begin(), findings.end(), [](const Finding& a, const Finding& b) {
    return std::tie(a.capture, a.graph, a.victim.sequence, a.harm) <
           std::tie(b.capture, b.graph, b.victim.sequence, b.harm);
  });
}

void CaptureTracker::Impl::count_writers(const IndexedRecord& r, int delta) {
  // One lookup per block the record names (its writes are grouped by block).
  r.for_each_writer([&](std::uint64_t sequence, absl::Span<const std::size_t> accesses) {
    if (sequence == 0) return;
    auto it = writer_refs.try_emplace(sequence, 0).first;
    if ((it->second += delta * static_cast<int>(accesses.size())) <= 0) writer_refs.erase(it);
  });
}

// Forgets freed blocks nothing can ask about any more: no record names
// them and no capture not yet recorded began before they were freed. The
// history is then bounded by the blocks that live records name, plus those
// freed since the oldest unrecorded capture began, plus twice that after the
// last prune (the amortization). Amortized:
// runs when the history has doubled since the last time. Requires mu.
void CaptureTracker::Impl::maybe_prune_history() {
  if (history.size() < 2 * history_after_prune + 4096) return;
  // Captures not yet recorded: those begun through the tracker, and those
  // found through the allocator (native captures), ended or not, whose
  // records the next check() builds from the frees they made.
  std::uint64_t oldest_active = ~std::uint64_t{0};
  for (const auto& [stream, capture] : active) {
    oldest_active = std::min(oldest_active, capture.begin_tick);
  }
  for (const auto& [id, capture] : discovered) {
    oldest_active = std::min(oldest_active, capture.begin_tick);
  }
  history_after_prune = history.prune([&](const detail::Occupant& o) {
    return writer_refs.contains(o.block.sequence) || o.free_tick > oldest_active;
  });
}

// The listener's calls run with the allocator's lock held, which guards the
// log, the ticks and graphs_gone (allocator/listener_lock.hpp).
//
// The append is all on_block_event does on the allocator's path, once per
// allocation and free in a capture. The log grows out of line, reached by a
// tail call (append_growing), so that the append needs no stack frame: a
// bounds test and the event's stores. With the reallocation inlined, or
// called from here, every call saved and restored the registers only growth
// needs (about 35 instructions an event, callgrind on
// capalloc_bench_capture's part 1).
void CaptureTracker::Impl::on_block_event(const BlockEvent& event) {
  if (log.size() == log.capacity()) [[unlikely]] return append_growing(event);
  // Tells the compiler what the test above established, so that it leaves
  // emplace_back's reallocation out of this function.
  if (log.size() >= log.capacity()) __builtin_unreachable();
  log.emplace_back(event, ++ticks);
}

void CaptureTracker::Impl::append_growing(const BlockEvent& event) {
  log.reserve(std::max<std::size_t>(1024, 2 * log.capacity()));
  log.emplace_back(event, ++ticks);
}

void CaptureTracker::Impl::on_capture_graph_gone(CaptureId capture) {
  graphs_gone.push_back(capture);
  std::lock_guard pins_lock(pins_mu);
  const auto own = own_graphs.find(capture);
  gone_pins.insert(own != own_graphs.end() ? own->second : detail::kDiscoveredGraph | capture);
}

void CaptureTracker::Impl::forget_discovered_graph(CaptureId capture) {
  inspected.erase(capture);
  if (discovered.erase(capture) == 1) {
    allocated_in.erase(capture);  // the capture failed, or its graph went before any check
    return;
  }
  if (records.contains(detail::kDiscoveredGraph | capture)) {
    detail::trace_graph_destroy(*allocator, capture);
    drop_record(detail::kDiscoveredGraph | capture);
    return;
  }
  // A graph this tracker captured, destroyed through the runtime rather than
  // through destroy_graph: its record and pool reference go now.
  for (const auto& [graph, record] : records) {
    if (record->record.capture == capture && (graph & detail::kDiscoveredGraph) == 0) {
      const GraphHandle gone = graph;
      allocator->drop_graph_pool_hold(drop_record(gone), capture).IgnoreError();
      return;
    }
  }
}

void CaptureTracker::Impl::apply_waivers(std::vector<Finding>& findings) const {
  if (waivers.empty()) return;
  for (Finding& f : findings) {
    auto it = waivers.find(f.graph);
    if (it == waivers.end()) continue;
    for (const Waiver& w : it->second) {
      if (w.victim != 0 ? w.victim == f.victim.sequence : w.tag == f.victim.tag) {
        f.waived = true;
        f.waiver_reason = w.reason;
        break;
      }
    }
  }
}

PoolHandle CaptureTracker::Impl::drop_record(GraphHandle graph) {
  waivers.erase(graph);
  auto it = records.find(graph);
  {
    std::lock_guard pins_lock(pins_mu);  // graph_uses reads the index under it
    index.remove(*it->second);
    if ((graph & detail::kDiscoveredGraph) == 0) {
      own_graphs.erase(it->second->record.capture);
      gone_pins.erase(graph);
    }
  }
  count_writers(*it->second, -1);
  const PoolHandle pool = it->second->record.pool;
  records.erase(it);
  // A later graph may get the same handle (CUDA's are pointers): it starts
  // with nothing reported.
  for (auto r = reported.begin(); r != reported.end();) {
    if (r->first.graph == graph) {
      reported.erase(r++);
    } else {
      ++r;
    }
  }
  return pool;
}

void CaptureTracker::Impl::drain_log() {
  // Two buffers trade places, so that neither is reallocated (and its
  // pages faulted in again) once both have grown to a capture's size.
  std::vector<CaptureId> gone;
  detail::with_listener_lock(*allocator, [&] {
    draining.swap(log);
    gone.swap(graphs_gone);
  });
  work.blocks += draining.size();
  // A block allocated and freed within the batch (a capture's transient)
  // never enters the history's live indexes: allocations are noted outside
  // them, and those the batch leaves live are indexed after its frees.
  noted_in_batch.clear();
  // The events of one capture come in runs: its allocation list is looked
  // up once per run.
  CaptureId run_capture = 0;
  std::uintptr_t run_graph = 0;
  std::vector<std::uint64_t>* run_allocated = nullptr;
  for (const detail::LoggedEvent& e : draining) {
    const BlockRef ref = e.block();
    if (e.kind == BlockEvent::Kind::kAllocate) {
      const std::size_t noted = history.note_in_batch(e.device, ref, e.tick);
      if (noted != detail::BlockHistory::kNotNew) noted_in_batch.push_back(noted);
      if (ref.capture != 0) {
        // note_capture again with the same capture and graph changes nothing.
        const std::uintptr_t graph = e.graph_or_position;
        if (ref.capture != run_capture || run_allocated == nullptr || graph != run_graph) {
          run_capture = ref.capture;
          run_graph = graph;
          run_allocated = &allocated_in[ref.capture];
          note_capture(ref.capture, e.device, e.stream_or_capture, e.pool, e.tick, graph);
        }
        run_allocated->push_back(ref.sequence);
      }
    } else {
      history.freed(e.device, ref, e.tick, e.stream_or_capture, e.graph_or_position);
    }
  }
  for (std::size_t noted : noted_in_batch) history.index_if_live(noted);
  draining.clear();
  // After the events, so that a capture's allocations are known before its
  // graph's end is.
  for (CaptureId capture : gone) forget_discovered_graph(capture);
  if (!gone.empty()) {
    std::lock_guard pins_lock(pins_mu);
    for (CaptureId capture : gone) gone_pins.erase(detail::kDiscoveredGraph | capture);
  }
}

// Live blocks overlapping `spans`, noted in the history. Blocks the
// history holds as live there but the allocator no longer has were freed
// outside any capture (unreported): they are marked so. Requires mu.
std::vector<BlockRef> CaptureTracker::Impl::live_victims(int device,
                                                         std::vector<MemorySpan> spans) {
  std::vector<BlockRef> out;
  for (const BlockInfo& info : allocator->live_blocks(device, spans)) {
    out.push_back(BlockRef::from(info));
    history.note(device, out.back(), 0);
  }
  std::vector<const detail::Occupant*> stale;
  if (history.any_live_outside(device)) {
    for (const MemorySpan& span : spans) history.live_outside_overlapping(device, span, stale);
  }
  if (!stale.empty()) {
    absl::flat_hash_set<std::uint64_t> live_now;
    for (const BlockRef& b : out) live_now.insert(b.sequence);
    for (const detail::Occupant* o : stale) {
      if (!live_now.contains(o->block.sequence)) history.forget_live(device, o->block.sequence);
    }
  }
  work.blocks += out.size();
  return out;
}

// Completes a finding of find_clobbers: its severity from every graph's
// accesses through the victim, then the reuse chain that led to it: the
// occupants of the overlap from the writer to the victim, in allocation
// order. A range a shared pool has reused a thousand times keeps its ends
// and the most recent steps.
void CaptureTracker::Impl::complete_finding(Finding& f) const {
  ++work.findings;
  std::vector<detail::VictimAccess>& accesses = finding_accesses;
  accesses.clear();
  // Every graph's accesses through the victim (blocks are on one device).
  const auto overlapping = index.through(f.victim.sequence);
  work.accesses += overlapping.size();
  for (auto [graph, i] : overlapping) {
    auto it = records.find(graph);
    if (it == records.end()) continue;
    const RecordedWrite& a = it->second->record.writes[i];
    if (a.writer.sequence == f.victim.sequence) {
      accesses.push_back({graph, it->second->record.label, &a, &it->second->order});
    }
  }
  detail::classify(f, accesses);
  history.chain(device_of(f), f.overlap, f.writer.sequence, f.victim.sequence, kChainLinks,
                finding_chain);
  f.reuse_chain.clear();
  f.reuse_chain.reserve(finding_chain.size());
  for (const detail::Occupant* o : finding_chain) f.reuse_chain.push_back(o->link());
  f.fix = detail::fix_for(f);
}
int CaptureTracker::Impl::device_of(const Finding& f) const {
  auto it = records.find(f.graph);
  return it == records.end() ? 0 : it->second->record.device;
}

// Findings of one record against the live blocks its writes touch.
// Requires mu.
std::vector<Finding> CaptureTracker::Impl::check_record(const IndexedRecord& r,
                                                       std::vector<BlockRef> accessed_live) {
  // The live blocks on anything the graph accesses, asked once: a block is
  // weighed for clobbers when it overlaps an access that may write (any
  // mode but kRead), and for stale reads when it overlaps one that may read
  // (any mode but kWrite), as two lists, one per question, would give.
  // The record's accesses cover the bytes of the graph's own list, except
  // touches, which cover their blocks whole: without touches, the live
  // blocks found on that list before the record was built are these.
  const bool touches = std::any_of(r.record.writes.begin(), r.record.writes.end(),
                                   [](const RecordedWrite& w) { return w.mode == AccessMode::kTouch; });
  if (accessed_live.empty() || touches) {
    std::vector<MemorySpan> spans;
    spans.reserve(r.record.writes.size());
    for (const RecordedWrite& w : r.record.writes) spans.push_back(w.span);
    accessed_live = live_victims(r.record.device, std::move(spans));
  }
  std::vector<Finding> out;
  std::vector<std::size_t> candidates;
  detail::ClobberScratch scratch;
  std::vector<BlockRef> read_victims;  // those overlapping an access that may read
  for (const BlockRef& victim : accessed_live) {
    r.writes_overlapping(victim.span(), candidates);
    bool written = false, read = false;
    for (std::size_t i : candidates) {
      written = written || r.record.writes[i].mode != AccessMode::kRead;
      read = read || r.record.writes[i].mode != AccessMode::kWrite;
    }
    if (read) read_victims.push_back(victim);
    if (!written) continue;
    ++work.victims;
    work.accesses += candidates.size();
    detail::find_clobbers(r, victim, candidates, out, scratch);
  }
  // Stale reads: live blocks now holding bytes the graph reads through
  // another block (the common case, a read through its own live block,
  // finds nothing).
  for (const BlockRef& victim : read_victims) {
    r.writes_overlapping(victim.span(), candidates);
    ++work.victims;
    work.accesses += candidates.size();
    detail::find_stale_reads(r, victim, candidates, out);
  }
  for (Finding& f : out) complete_finding(f);
  detail::sort_findings(out);
  apply_waivers(out);
  return out;
}

// Keeps the findings not reported before, and remembers them.
std::vector<Finding> CaptureTracker::Impl::only_new(std::vector<Finding> findings) {
  work.findings += findings.size();
  std::vector<Finding> fresh;
  for (Finding& f : findings) {
    auto [it, inserted] = reported.try_emplace({f.graph, f.victim.sequence, f.harm}, f.severity);
    // Severity's values run from most to least severe.
    if (inserted || f.severity < it->second) {
      it->second = f.severity;
      fresh.push_back(std::move(f));
    }
  }
  return fresh;
}

absl::StatusOr<const detail::IndexedRecord*> CaptureTracker::Impl::record_of(
    GraphHandle graph) const {
  auto it = records.find(graph);
  if (it == records.end()) {
    return absl::NotFoundError(absl::StrFormat(
        "graph %d is unknown to this tracker (not captured through it, or destroyed)", graph));
  }
  return it->second.get();
}

detail::GraphOrder CaptureTracker::Impl::order_of(GraphHandle graph) const {
  auto dependencies = runtime->graph_dependencies(graph);
  if (!dependencies.ok()) return detail::GraphOrder::capture_order();
  auto order = detail::GraphOrder::from_edges(*std::move(dependencies));
  if (order.ok()) return *std::move(order);
  detail::log().warn("graph {}: its edges cannot be used ({}); capture order stands in for them",
                     graph, std::string(order.status().message()));
  return detail::GraphOrder::capture_order();
}

std::vector<Finding> CaptureTracker::Impl::finish_capture(
    const detail::ActiveCapture& capture, GraphHandle graph,
    const absl::StatusOr<std::vector<GraphWrite>>& writes, detail::GraphOrder order) {
  WriteRecord record;
  record.graph = graph;
  record.label = capture.label.empty() ? absl::StrCat("graph ", graph) : capture.label;
  record.capture = capture.id;
  record.device = capture.device;
  record.pool = capture.pool;
  const detail::CaptureWindow window{capture.id, capture.device, capture.begin_tick};
  std::vector<std::uint64_t> allocated;
  if (auto node = allocated_in.extract(capture.id)) allocated = std::move(node.mapped());
  std::vector<BlockRef> accessed_live;  // on the graph's accesses, by address
  if (writes.ok()) {
    // Note the live blocks the writes touch (allocated before the capture,
    // outside it) so each write can be tied to its block.
    std::vector<MemorySpan> spans;
    for (const GraphWrite& w : *writes) spans.push_back(w.span);
    accessed_live = live_victims(capture.device, std::move(spans));
    work.nodes += writes->size();
    detail::add_declared_writes(*writes, window, history, record, work.blocks);
  } else {
    work.blocks += allocated.size();
    detail::add_footprint_writes(allocated, history, record);
  }
  work.nodes += order.node_count();
  auto indexed = std::make_unique<IndexedRecord>(std::move(record), std::move(order));
  const IndexedRecord& r = *indexed;
  ++work.records;
  {
    std::lock_guard pins_lock(pins_mu);  // graph_uses reads the index under it
    index.add(r);
    if ((graph & detail::kDiscoveredGraph) == 0) own_graphs.insert_or_assign(capture.id, graph);
  }
  count_writers(r, +1);
  records.emplace(graph, std::move(indexed));

  // (a) this graph against every live block it writes or reads; (b) every
  // other graph (its clobbers and stale reads) against the live blocks this
  // capture allocated and left live, and against the live blocks this graph
  // uses through their own identity (its reads can raise the severity of a
  // clobber another graph makes there).
  std::vector<Finding> findings = check_record(r, std::move(accessed_live));
  std::vector<MemorySpan> victim_spans;
  for (std::uint64_t sequence : allocated) {
    if (const detail::Occupant* o = history.find(sequence); o != nullptr && o->live()) {
      victim_spans.push_back(o->block.span());
    }
  }
  for (const RecordedWrite& a : r.record.writes) {
    if (a.writer.sequence != 0 && a.evidence != WriteEvidence::kFootprint) {
      victim_spans.push_back(a.writer.span());
    }
  }
  absl::flat_hash_set<std::uint64_t> seen;
  // Reused across victims: the writes on the victim, by graph then write
  // (each graph's candidates in capture order), and one graph's candidates.
  std::vector<std::pair<GraphHandle, std::size_t>> overlapping;
  std::vector<std::size_t> candidates;
  detail::ClobberScratch scratch;
  for (const BlockRef& victim : live_victims(capture.device, std::move(victim_spans))) {
    if (!seen.insert(victim.sequence).second) continue;
    index.overlapping(capture.device, victim.span(), overlapping);
    std::erase_if(overlapping, [&](const auto& e) { return e.first == graph; });
    std::sort(overlapping.begin(), overlapping.end());
    for (std::size_t at = 0; at < overlapping.size();) {
      const GraphHandle g = overlapping[at].first;
      candidates.clear();
      for (; at < overlapping.size() && overlapping[at].first == g; ++at) {
        candidates.push_back(overlapping[at].second);
      }
      ++work.victims;
      work.accesses += candidates.size();
      const IndexedRecord& other = *records.at(g);
      const std::size_t before = findings.size();
      detail::find_clobbers(other, victim, candidates, findings, scratch);
      detail::find_stale_reads(other, victim, candidates, findings);
      for (std::size_t i = before; i < findings.size(); ++i) complete_finding(findings[i]);
    }
  }
  detail::sort_findings(findings);
  apply_waivers(findings);
  std::vector<Finding> fresh = only_new(std::move(findings));
  maybe_prune_history();
  if (detail::log().should_log(spdlog::level::warn)) {
    for (const Finding& f : fresh) detail::log().warn("{}", f.summary());
  }
  // The trace's message is the finding's summary: built only for a trace.
  for (const Finding& f : fresh) {
    if (!detail::trace_running(*allocator)) break;
    detail::trace_finding(*allocator, severity_name(f.severity), f.overlap.ptr, f.overlap.bytes,
                          f.graph, f.victim.sequence, f.victim.tag, f.summary());
  }
  return fresh;
}

void CaptureTracker::Impl::note_capture(CaptureId id, int device, StreamHandle stream,
                                        PoolHandle pool, std::uint64_t tick,
                                        std::uintptr_t graph) {
  if (auto it = discovered.find(id); it != discovered.end()) {
    if (it->second.graph == 0) it->second.graph = graph;
    return;
  }
  for (const auto& [origin, capture] : active) {
    if (capture.id == id) return;  // begun through this tracker
  }
  // A capture nobody announced: its first allocation is how it shows.
  discovered.emplace(id, detail::ActiveCapture{id, device, stream, pool,
                                               absl::StrCat("capture ", id), tick - 1, graph});
}

std::vector<Finding> CaptureTracker::Impl::finish_discovered() {
  std::vector<Finding> fresh;
  std::vector<CaptureId> over;
  for (const auto& [id, capture] : discovered) {
    auto info = runtime->capture_info(capture.stream);
    if (info.ok() && info->status != CaptureStatus::kNone && info->id == id) continue;
    over.push_back(id);
  }
  std::sort(over.begin(), over.end());
  for (CaptureId id : over) {
    const detail::ActiveCapture capture = discovered.at(id);
    discovered.erase(id);
    // Its record stays until the runtime reports the graph gone
    // (on_capture_graph_gone; a capture that failed is reported as soon as
    // the runtime drops its graph, on CUDA possibly a little later than the
    // failed end). Where the runtime cannot watch graphs, it stays for good.
    {
      const SelfCall self;
      allocator->end_allocate_to_pool(id).IgnoreError();
    }
    detail::trace_capture_end(*allocator, id);
    // Inspected at its capture-end hook, or footprint: capalloc saw only its
    // allocations and frees.
    auto inspection = inspected.extract(id);
    const absl::StatusOr<std::vector<GraphWrite>> writes =
        inspection ? absl::StatusOr<std::vector<GraphWrite>>(std::move(inspection.mapped().writes))
                   : absl::UnimplementedError("a discovered capture's writes are not listed");
    detail::GraphOrder order = inspection ? std::move(inspection.mapped().order)
                                          : detail::GraphOrder::capture_order();
    for (Finding& f : finish_capture(capture, detail::kDiscoveredGraph | id, writes,
                                      std::move(order))) {
      fresh.push_back(std::move(f));
    }
  }
  return fresh;
}

}  // namespace capalloc

namespace capalloc {

void CaptureTracker::Impl::on_capture_pool_end(CaptureId capture) {
  // The tracker's own end_allocate_to_pool calls hold mu; they need nothing.
  if (self_calls > 0) return;
  std::lock_guard lock(mu);
  drain_log();
  auto it = discovered.find(capture);
  if (it == discovered.end() || it->second.graph == 0) return;
  // The capture has just ended natively and its graph still exists: inspect
  // it now, before the host application destroys it.
  DeviceRuntime& rt = *runtime;
  auto writes = rt.captured_graph_writes(it->second.graph);
  if (!writes.ok()) {
    detail::log().info("capture {}: its graph cannot be inspected ({}); footprint evidence",
                       capture, std::string(writes.status().message()));
    return;
  }
  detail::GraphOrder order = detail::GraphOrder::capture_order();
  if (auto deps = rt.captured_graph_dependencies(it->second.graph); deps.ok()) {
    if (auto from_edges = detail::GraphOrder::from_edges(*std::move(deps)); from_edges.ok()) {
      order = *std::move(from_edges);
    }
  }
  inspected.insert_or_assign(capture, Inspection{*std::move(writes), std::move(order)});
  finish_discovered();
}

}  // namespace capalloc

namespace capalloc {

bool CaptureTracker::Impl::graph_uses(int device, MemorySpan span) const {
  std::lock_guard pins_lock(pins_mu);
  return index.any_overlapping(device, span,
                               [&](GraphHandle graph) { return !gone_pins.contains(graph); });
}

}  // namespace capalloc
