// capture/capture_tracker.cpp: the capture registry, write records and the
// alias check at capture end, before replays and on demand.
//
// Locking: `mu` guards the registry, the history, the records and the write
// index, and may be held while calling the allocator or the runtime. The
// allocator calls the listener with its own lock held, so the listener only
// appends to `log` under `log_mu`, which is never held while calling out:
// lock order mu -> allocator -> log_mu, with no cycle. The log is drained
// into the history whenever the tracker needs it.
//
// Per capture the tracker holds: the graph pool (a reference for the graph,
// released by destroy_graph), the capture's begin tick, and the sequences of
// the blocks allocated in it.
#include <algorithm>
#include <atomic>
#include <mutex>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "allocator/runtime/log.hpp"
#include "capalloc/capture.hpp"
#include "capture/alias_rule.hpp"
#include "capture/block_history.hpp"
#include "capture/write_record.hpp"

namespace capalloc {

using detail::IndexedRecord;

namespace {

struct ActiveCapture {
  CaptureId id = 0;
  int device = 0;
  StreamHandle stream = kDefaultStream;
  PoolHandle pool = kDefaultPool;
  std::string label;
  std::uint64_t begin_tick = 0;
};

struct LoggedEvent {
  BlockEvent event;
  std::uint64_t tick;
};

struct FindingKey {
  GraphHandle graph;
  std::uint64_t victim;
  bool operator==(const FindingKey&) const = default;
  template <typename H>
  friend H AbslHashValue(H h, const FindingKey& k) {
    return H::combine(std::move(h), k.graph, k.victim);
  }
};

}  // namespace

struct CAPALLOC_INTERNAL CaptureTracker::Impl final : CaptureListener {
  Allocator* allocator = nullptr;
  std::atomic<bool> strict{false};
  std::atomic<std::uint64_t> ticks{0};

  std::mutex log_mu;
  std::vector<LoggedEvent> log;  // guarded by log_mu
  std::vector<LoggedEvent> draining;  // guarded by mu

  mutable std::mutex mu;
  absl::flat_hash_map<StreamHandle, ActiveCapture> active;  // by origin stream
  absl::flat_hash_map<CaptureId, std::vector<std::uint64_t>> allocated_in;
  detail::BlockHistory history;
  absl::flat_hash_map<GraphHandle, std::unique_ptr<IndexedRecord>> records;
  detail::WriteIndex index;
  absl::flat_hash_set<FindingKey> reported;
  // Blocks that records name as writers, with how many writes name them:
  // the history keeps them (for reuse chains) while their graphs exist.
  absl::flat_hash_map<std::uint64_t, int> writer_refs;
  std::size_t history_after_prune = 0;

  void count_writers(const WriteRecord& r, int delta) {
    for (const RecordedWrite& w : r.writes) {
      if (w.writer.sequence == 0) continue;
      if ((writer_refs[w.writer.sequence] += delta) <= 0) writer_refs.erase(w.writer.sequence);
    }
  }

  // Forgets freed blocks nothing can ask about any more: no record names
  // them and no capture in progress began before they were freed. Amortized:
  // runs when the history has doubled since the last time. Requires mu.
  void maybe_prune_history() {
    if (history.size() < 2 * history_after_prune + 4096) return;
    std::uint64_t oldest_active = ~std::uint64_t{0};
    for (const auto& [stream, capture] : active) {
      oldest_active = std::min(oldest_active, capture.begin_tick);
    }
    history_after_prune = history.prune([&](const detail::Occupant& o) {
      return writer_refs.contains(o.block.sequence) || o.free_tick > oldest_active;
    });
  }

  void on_block_event(const BlockEvent& event) override {
    const std::uint64_t tick = ticks.fetch_add(1) + 1;
    std::lock_guard lock(log_mu);
    log.push_back({event, tick});
  }

  // Requires mu.
  void drain_log() {
    // Two buffers trade places, so that neither is reallocated (and its
    // pages faulted in again) once both have grown to a capture's size.
    {
      std::lock_guard lock(log_mu);
      draining.swap(log);
    }
    for (const LoggedEvent& e : draining) {
      const BlockRef ref = BlockRef::from(e.event.block);
      if (e.event.kind == BlockEvent::Kind::kAllocate) {
        history.note(e.event.block.device, ref, e.tick);
        if (ref.capture != 0) allocated_in[ref.capture].push_back(ref.sequence);
      } else {
        history.freed(e.event.block.device, ref, e.tick, e.event.capture, e.event.position);
      }
    }
    draining.clear();
  }

  // Live blocks overlapping `spans`, noted in the history. Blocks the
  // history holds as live there but the allocator no longer has were freed
  // outside any capture (unreported): they are marked so. Requires mu.
  std::vector<BlockRef> live_victims(int device, std::vector<MemorySpan> spans) {
    std::vector<BlockRef> out;
    absl::flat_hash_set<std::uint64_t> live_now;
    for (const BlockInfo& info : allocator->live_blocks(device, spans)) {
      out.push_back(BlockRef::from(info));
      live_now.insert(info.sequence);
      history.note(device, out.back(), 0);
    }
    std::vector<const detail::Occupant*> stale;
    for (const MemorySpan& span : spans) history.live_overlapping(device, span, stale);
    for (const detail::Occupant* o : stale) {
      if (!live_now.contains(o->block.sequence)) history.forget_live(device, o->block.sequence);
    }
    return out;
  }

  // The reuse chain that led to a finding: the occupants of the overlap from
  // the writer to the victim, in allocation order. A range a shared pool has
  // reused a thousand times keeps its ends and the most recent steps.
  static constexpr std::size_t kChainLinks = 16;
  void attach_chain(Finding& f) const {
    std::vector<ChainLink> links;
    for (const detail::Occupant* o : history.overlapping(device_of(f), f.overlap)) {
      const std::uint64_t seq = o->block.sequence;
      if (seq >= f.writer.sequence && seq <= f.victim.sequence) links.push_back(o->link());
    }
    if (links.size() > kChainLinks) {
      links.erase(links.begin() + 1, links.end() - static_cast<std::ptrdiff_t>(kChainLinks - 1));
    }
    f.reuse_chain = std::move(links);
    f.fix = detail::fix_for(f);
  }
  int device_of(const Finding& f) const {
    auto it = records.find(f.graph);
    return it == records.end() ? 0 : it->second->record.device;
  }

  // Findings of one record against the live blocks its writes touch.
  // Requires mu.
  std::vector<Finding> check_record(const IndexedRecord& r) {
    std::vector<MemorySpan> spans;
    for (const RecordedWrite& w : r.record.writes) spans.push_back(w.span);
    std::vector<Finding> out;
    for (const BlockRef& victim : live_victims(r.record.device, std::move(spans))) {
      detail::find_clobbers(r, victim, r.writes_overlapping(victim.span()), out);
    }
    for (Finding& f : out) attach_chain(f);
    return out;
  }

  // Keeps the findings not reported before, and remembers them.
  std::vector<Finding> only_new(std::vector<Finding> findings) {
    std::vector<Finding> fresh;
    for (Finding& f : findings) {
      if (reported.insert({f.graph, f.victim.sequence}).second) {
        fresh.push_back(std::move(f));
      }
    }
    return fresh;
  }

  absl::StatusOr<const IndexedRecord*> record_of(GraphHandle graph) const {
    auto it = records.find(graph);
    if (it == records.end()) {
      return absl::NotFoundError(absl::StrFormat(
          "graph %d is unknown to this tracker (not captured through it, or destroyed)", graph));
    }
    return it->second.get();
  }
};

absl::StatusOr<TrackerOptions> TrackerOptions::from_env() {
  TrackerOptions options;
  if (const char* value = std::getenv("CAPALLOC_STRICT"); value != nullptr && *value) {
    const std::string v(value);
    if (v != "0" && v != "1") {
      return absl::InvalidArgumentError(
          absl::StrCat("CAPALLOC_STRICT='", v, "' must be 0 or 1"));
    }
    options.strict = v == "1";
  }
  return options;
}

absl::StatusOr<std::unique_ptr<CaptureTracker>> CaptureTracker::create(Allocator& allocator,
                                                                       TrackerOptions options) {
  auto impl = std::make_unique<Impl>();
  impl->allocator = &allocator;
  impl->strict = options.strict;
  if (absl::Status s = allocator.set_capture_listener(impl.get()); !s.ok()) return s;
  return std::unique_ptr<CaptureTracker>(new CaptureTracker(std::move(impl)));
}

CaptureTracker::CaptureTracker(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

CaptureTracker::~CaptureTracker() {
  impl_->allocator->set_capture_listener(nullptr).IgnoreError();
  std::lock_guard lock(impl_->mu);
  for (auto& [graph, record] : impl_->records) {
    impl_->allocator->runtime().destroy_graph(graph).IgnoreError();
    impl_->allocator->release_graph_pool(record->record.pool).IgnoreError();
  }
}

Allocator& CaptureTracker::allocator() const { return *impl_->allocator; }
bool CaptureTracker::strict() const { return impl_->strict.load(); }
void CaptureTracker::set_strict(bool strict) { impl_->strict = strict; }

absl::StatusOr<CaptureId> CaptureTracker::begin_capture(int device, StreamHandle stream,
                                                        CaptureOptions options) {
  Impl& m = *impl_;
  Allocator& a = *m.allocator;
  std::lock_guard lock(m.mu);
  // The graph's reference on its pool, held until destroy_graph.
  PoolHandle pool = options.pool;
  if (pool == kDefaultPool) {
    auto created = a.create_graph_pool(device);
    if (!created.ok()) return created.status();
    pool = *created;
  } else if (absl::Status s = a.retain_graph_pool(pool); !s.ok()) {
    return s;
  }
  // Ticks order the allocator's events around the capture's start.
  const std::uint64_t begin_tick = m.ticks.fetch_add(1) + 1;
  auto id = a.runtime().begin_capture(stream, options.mode);
  if (!id.ok()) {
    a.release_graph_pool(pool).IgnoreError();
    return id.status();
  }
  if (absl::Status s = a.begin_allocate_to_pool(device, *id, pool); !s.ok()) {
    if (auto g = a.runtime().end_capture(stream); g.ok()) a.runtime().destroy_graph(*g).IgnoreError();
    a.release_graph_pool(pool).IgnoreError();
    return s;
  }
  m.active[stream] = ActiveCapture{*id, device, stream, pool, options.label, begin_tick};
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
  const ActiveCapture capture = it->second;
  m.active.erase(it);
  auto graph = a.runtime().end_capture(stream);
  // Whatever the outcome, the capture no longer allocates into the pool.
  a.end_allocate_to_pool(capture.id).IgnoreError();
  m.drain_log();
  if (!graph.ok()) {
    m.allocated_in.erase(capture.id);
    a.release_graph_pool(capture.pool).IgnoreError();
    return graph.status();
  }

  WriteRecord record;
  record.graph = *graph;
  record.label = capture.label.empty() ? absl::StrCat("graph ", *graph) : capture.label;
  record.capture = capture.id;
  record.device = capture.device;
  record.pool = capture.pool;
  const detail::CaptureWindow window{capture.id, capture.device, capture.begin_tick};
  const std::vector<std::uint64_t> allocated = m.allocated_in[capture.id];
  m.allocated_in.erase(capture.id);
  if (auto writes = a.runtime().graph_writes(*graph); writes.ok()) {
    // Note the live blocks the writes touch (allocated before the capture,
    // outside it) so each write can be tied to its block.
    std::vector<MemorySpan> spans;
    for (const GraphWrite& w : *writes) spans.push_back(w.span);
    m.live_victims(capture.device, std::move(spans));
    detail::add_declared_writes(*writes, window, m.history, record);
  } else {
    detail::add_footprint_writes(allocated, m.history, record);
  }
  auto indexed = std::make_unique<IndexedRecord>(std::move(record));
  const IndexedRecord& r = *indexed;
  m.index.add(r);
  m.count_writers(r.record, +1);
  m.records.emplace(*graph, std::move(indexed));

  // (a) this graph against every live block it writes; (b) blocks this
  // capture allocated and left live against every other graph's writes.
  std::vector<Finding> findings = m.check_record(r);
  std::vector<MemorySpan> escaped_spans;
  for (std::uint64_t sequence : allocated) {
    if (const detail::Occupant* o = m.history.find(sequence); o != nullptr && o->live()) {
      escaped_spans.push_back(o->block.span());
    }
  }
  for (const BlockRef& victim : m.live_victims(capture.device, std::move(escaped_spans))) {
    absl::flat_hash_map<GraphHandle, std::vector<std::size_t>> by_graph;
    for (auto [g, w] : m.index.overlapping(capture.device, victim.span())) {
      if (g != *graph) by_graph[g].push_back(w);
    }
    for (auto& [g, writes] : by_graph) {
      const std::size_t before = findings.size();
      detail::find_clobbers(*m.records.at(g), victim, writes, findings);
      for (std::size_t i = before; i < findings.size(); ++i) m.attach_chain(findings[i]);
    }
  }
  CaptureResult result;
  result.graph = *graph;
  result.new_findings = m.only_new(std::move(findings));
  m.maybe_prune_history();
  if (detail::log().should_log(spdlog::level::warn)) {
    for (const Finding& f : result.new_findings) detail::log().warn("{}", f.summary());
  }
  return result;
}

absl::StatusOr<std::vector<Finding>> CaptureTracker::check_graph(GraphHandle graph) {
  Impl& m = *impl_;
  std::lock_guard lock(m.mu);
  m.drain_log();
  auto r = m.record_of(graph);
  if (!r.ok()) return r.status();
  return m.check_record(**r);
}

std::vector<Finding> CaptureTracker::check() {
  Impl& m = *impl_;
  std::lock_guard lock(m.mu);
  m.drain_log();
  std::vector<Finding> all;
  for (const auto& [graph, record] : m.records) {
    for (Finding& f : m.check_record(*record)) all.push_back(std::move(f));
  }
  return all;
}

absl::Status CaptureTracker::replay(GraphHandle graph, StreamHandle stream) {
  auto findings = check_graph(graph);
  if (!findings.ok()) return findings.status();
  std::string hazards;
  for (const Finding& f : *findings) {
    if (f.severity == Severity::kHazard) absl::StrAppend(&hazards, "\n  ", f.summary());
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
  return impl_->allocator->runtime().launch_graph(graph, stream);
}

absl::Status CaptureTracker::destroy_graph(GraphHandle graph) {
  Impl& m = *impl_;
  std::lock_guard lock(m.mu);
  auto it = m.records.find(graph);
  if (it == m.records.end()) {
    return absl::NotFoundError(
        absl::StrFormat("destroy_graph: graph %d is unknown to this tracker", graph));
  }
  if (absl::Status s = m.allocator->runtime().destroy_graph(graph); !s.ok()) return s;
  m.index.remove(*it->second);
  m.count_writers(it->second->record, -1);
  const PoolHandle pool = it->second->record.pool;
  m.records.erase(it);
  return m.allocator->release_graph_pool(pool);
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
