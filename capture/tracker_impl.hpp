// capture/tracker_impl.hpp: the CaptureTracker's state, shared by
// capture_tracker.cpp (the public calls) and tracker_impl.cpp (records,
// checks, captures discovered through the allocator).
//
// Locking: `mu` guards the registry, the history, the records and the write
// index, and may be held while calling the allocator or the runtime. The
// allocator calls the listener with its own lock held, so the listener only
// appends to `log`, which the allocator's lock guards: the tracker reads it
// (and takes a capture's begin tick) under that lock, lent through
// detail::with_listener_lock (allocator/listener_lock.hpp). Lock order mu ->
// allocator, with no cycle. The log is drained into the history whenever
// the tracker needs it.
//
// Per capture the tracker holds: the graph pool (a reference for the graph,
// released by destroy_graph), the capture's begin tick, and the sequences of
// the blocks allocated in it. Captures it did not begin (a host application
// capturing through the native API, as PyTorch does) are discovered from the
// allocator's events; once their stream has left them, they get a footprint
// record under a graph handle of their own (kDiscoveredGraph | capture id).
#ifndef CAPALLOC_CAPTURE_TRACKER_IMPL_HPP_
#define CAPALLOC_CAPTURE_TRACKER_IMPL_HPP_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "capalloc/capture.hpp"
#include "capture/alias_rule.hpp"
#include "capture/block_history.hpp"
#include "capture/write_record.hpp"

namespace capalloc {

namespace detail {

// Graph handles of records for captures the tracker discovered: the capture
// id with the top bit set, so they never collide with a runtime's handles.
inline constexpr GraphHandle kDiscoveredGraph = GraphHandle{1} << 63;

struct ActiveCapture {
  CaptureId id = 0;
  int device = 0;
  StreamHandle stream = kDefaultStream;
  PoolHandle pool = kDefaultPool;
  std::string label;
  std::uint64_t begin_tick = 0;
  std::uintptr_t graph = 0;  // CaptureInfo::graph of a discovered capture (0: unknown)
};

// One allocator event as the log keeps it until drain_log: what the history
// and the capture registry read of it, 96 bytes where BlockEvent is 136
// (the log of a capture of 100,000 allocate+free pairs is 19 MB instead of
// 29 MB, written during the capture). The last two words depend on the kind:
// an allocation's stream and graph (its capture and position are the
// block's), a free's capture and position at the free.
//
// Built in place in the log (emplace_back) from the event's fields one by
// one, in an order that no two neighbours share with BlockEvent's: the
// compiler then loads each field alone instead of two at a time, and a
// wide load never spans two of the narrower stores that just built the
// event on the allocator's stack (a failed store-to-load forward: perf).
struct LoggedEvent {
  LoggedEvent(const BlockEvent& event, std::uint64_t at)
      : tick(at),
        ptr(event.block.ptr),
        sequence(event.block.sequence),
        size(event.block.size),
        pool(event.block.pool),
        tag_data(event.block.tag.data()),
        block_capture(event.block.capture),
        tag_size(static_cast<std::uint32_t>(event.block.tag.size())),
        device(event.block.device),
        block_capture_position(event.block.capture_position),
        kind(event.kind),
        lifetime(event.block.lifetime),
        stream_or_capture(event.kind == BlockEvent::Kind::kAllocate ? event.block.stream
                                                                     : event.capture),
        graph_or_position(event.kind == BlockEvent::Kind::kAllocate ? event.capture_graph
                                                                     : event.position) {}

  BlockRef block() const {
    BlockRef ref;
    ref.sequence = sequence;
    ref.tag = std::string_view(tag_data, tag_size);
    ref.ptr = ptr;
    ref.size = size;
    ref.lifetime = lifetime;
    ref.pool = pool;
    ref.capture = block_capture;
    ref.capture_position = block_capture_position;
    return ref;
  }

  std::uint64_t tick;
  const void* ptr;
  std::uint64_t sequence;
  std::size_t size;
  PoolHandle pool;
  const char* tag_data;
  CaptureId block_capture;
  std::uint32_t tag_size;
  std::int32_t device;
  std::size_t block_capture_position;
  BlockEvent::Kind kind;
  Lifetime lifetime;
  std::uint64_t stream_or_capture;  // kAllocate: the block's stream; kFree: the capture
  std::uint64_t graph_or_position;  // kAllocate: the capture's graph; kFree: the position
};
static_assert(sizeof(LoggedEvent) == 96);

// A finding's identity for reporting: one per (graph, victim, harm).
struct FindingKey {
  GraphHandle graph;
  std::uint64_t victim;
  Harm harm;
  bool operator==(const FindingKey&) const = default;
  template <typename H>
  friend H AbslHashValue(H h, const FindingKey& k) {
    return H::combine(std::move(h), k.graph, k.victim, k.harm);
  }
};

// Findings in a fixed order: by capture, then graph, then victim.
void sort_findings(std::vector<Finding>& findings);

}  // namespace detail

struct CAPALLOC_INTERNAL CaptureTracker::Impl final : CaptureListener {
  using IndexedRecord = detail::IndexedRecord;

  Allocator* allocator = nullptr;
  // The allocator's runtime, through its graph and launch seam.
  DeviceRuntime* runtime = nullptr;
  std::atomic<bool> strict{false};
  std::atomic<bool> strict_possible{false};

  // Orders the allocator's events and the captures' starts. Guarded by the
  // allocator's lock: an event takes its tick as it is appended, so the log
  // is in tick order, and an event during a capture (on the allocation
  // path) takes no lock or atomic operation of its own.
  std::uint64_t ticks = 0;
  std::vector<detail::LoggedEvent> log;       // guarded by the allocator's lock
  std::vector<detail::LoggedEvent> draining;  // guarded by mu
  // The history indexes of the blocks the batch drain_log is noting
  // allocated (kept for its capacity). Guarded by mu.
  std::vector<std::size_t> noted_in_batch;
  std::vector<CaptureId> graphs_gone;         // guarded by the allocator's lock

  mutable std::mutex mu;
  absl::flat_hash_map<StreamHandle, detail::ActiveCapture> active;  // by origin stream
  // Captures seen only through the allocator's events, by id.
  absl::flat_hash_map<CaptureId, detail::ActiveCapture> discovered;
  absl::flat_hash_map<CaptureId, std::vector<std::uint64_t>> allocated_in;
  detail::BlockHistory history;
  absl::flat_hash_map<GraphHandle, std::unique_ptr<IndexedRecord>> records;
  detail::WriteIndex index;  // written with mu and pins_mu held; read with either
  // Waivers by graph: a victim block (sequence) or a tag, and the reason.
  struct Waiver {
    std::uint64_t victim = 0;  // 0: by tag
    std::string tag;
    std::string reason;
  };
  absl::flat_hash_map<GraphHandle, std::vector<Waiver>> waivers;
  // Marks the findings a waiver covers. Requires mu.
  void apply_waivers(std::vector<Finding>& findings) const;

  // The most severe severity each finding was reported at: a finding is
  // reported again only when a later graph raises it (reads the victim
  // first). Entries go with their graph.
  absl::flat_hash_map<detail::FindingKey, Severity> reported;
  // Blocks that records name as writers, with how many writes name them:
  // the history keeps them (for reuse chains) while their graphs exist.
  absl::flat_hash_map<std::uint64_t, int> writer_refs;
  std::size_t history_after_prune = 0;
  mutable TrackerWork work;  // guarded by mu
  // complete_finding's vectors, reused from finding to finding so that,
  // once grown, they do not allocate. Guarded by mu.
  mutable std::vector<detail::VictimAccess> finding_accesses;
  mutable std::vector<const detail::Occupant*> finding_chain;


  void on_block_event(const BlockEvent& event) override;
  [[gnu::noinline, gnu::cold]] void append_growing(const BlockEvent& event);
  void on_capture_graph_gone(CaptureId capture) override;
  // A discovered capture's capture-end hook: its graph is inspected now, and
  // its record built (inspected evidence).
  void on_capture_pool_end(CaptureId capture) override;
  bool graph_uses(int device, MemorySpan span) const override;
  // graph_uses answers from `index` under a lock of its own, which the
  // allocator takes with its lock held (pins_mu is a leaf: nothing is called
  // while it is held). `index` changes only with both mu and pins_mu held,
  // so either lock suffices to read it; graph_uses reads it through
  // any_overlapping, which leaves the work counter alone (the tracker's
  // queries, under mu, count).
  mutable std::mutex pins_mu;
  // Records of discovered graphs the runtime reported gone
  // (on_capture_graph_gone) that the next drain_log drops: they pin nothing
  // from the report on, so that the call that learnt of it (empty_cache, the
  // out-of-memory retry) can already return the graph's memory. Guarded by
  // pins_mu.
  absl::flat_hash_set<GraphHandle> gone_pins;
  // The graph of each capture this tracker began, while its record lives:
  // the runtime reports a graph gone by capture id, and such a record is
  // filed under its graph handle. Guarded by pins_mu.
  absl::flat_hash_map<CaptureId, GraphHandle> own_graphs;
  // Set while this thread calls the allocator's end_allocate_to_pool with mu
  // held: its hook then has nothing to do (and must not take mu). Defined
  // here (inline, constant-initialised) so that no source file needs a TLS
  // init function from another: clang references one for a thread_local
  // defined elsewhere, which a hidden-visibility PIE link cannot resolve.
  static inline thread_local int self_calls = 0;
  struct SelfCall {
    SelfCall() { ++self_calls; }
    ~SelfCall() { --self_calls; }
    SelfCall(const SelfCall&) = delete;
    SelfCall& operator=(const SelfCall&) = delete;
  };
  // What a discovered capture's graph showed at its capture-end hook.
  struct Inspection {
    std::vector<GraphWrite> writes;
    detail::GraphOrder order;
  };
  absl::flat_hash_map<CaptureId, Inspection> inspected;  // guarded by mu
  // A capture's graph is gone: a discovered capture gets no record, or its
  // record is dropped; a graph this tracker captured but the application
  // destroyed through the runtime loses its record and pool reference.
  // Requires mu.
  void forget_discovered_graph(CaptureId capture);
  // Removes a graph's record, index entries and reported findings; returns
  // the record's pool. Requires mu; the graph must have a record.
  PoolHandle drop_record(GraphHandle graph);

  // Everything below requires mu.
  void count_writers(const IndexedRecord& r, int delta);
  void maybe_prune_history();
  void drain_log();
  std::vector<BlockRef> live_victims(int device, std::vector<MemorySpan> spans);
  void complete_finding(Finding& f) const;
  int device_of(const Finding& f) const;
  // `accessed_live`: the live blocks on the graph's list of accesses, found
  // when its record was built (empty: none known, asked again).
  std::vector<Finding> check_record(const IndexedRecord& r,
                                    std::vector<BlockRef> accessed_live = {});
  std::vector<Finding> only_new(std::vector<Finding> findings);
  absl::StatusOr<const IndexedRecord*> record_of(GraphHandle graph) const;
  // Builds, indexes and checks the record of a finished capture; returns
  // the new findings (also logged). `writes` absent: a footprint record.
  // `order`: the graph's, from its edges where the runtime gives them.
  std::vector<Finding> finish_capture(const detail::ActiveCapture& capture, GraphHandle graph,
                                      const absl::StatusOr<std::vector<GraphWrite>>& writes,
                                      detail::GraphOrder order);
  // The order of `graph`'s replays: from the runtime's edges, else capture
  // order (logged when the edges are malformed).
  detail::GraphOrder order_of(GraphHandle graph) const;
  // Records the discovered captures whose stream has left them; returns
  // their new findings.
  std::vector<Finding> finish_discovered();
  // Registers capture `id`, met in an allocation event, as discovered unless
  // this tracker began it.
  void note_capture(CaptureId id, int device, StreamHandle stream, PoolHandle pool,
                    std::uint64_t tick, std::uintptr_t graph);

  static constexpr std::size_t kChainLinks = 16;
};

}  // namespace capalloc

#endif  // CAPALLOC_CAPTURE_TRACKER_IMPL_HPP_
