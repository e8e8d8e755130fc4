// capture/alias_rule.hpp: the alias rule (DESIGN.md section 5) and the index
// that finds, for a block, the graph writes that land on it.
//
// Graph G clobbers live block B when G's record holds a write (any mode but
// kRead) to a range overlapping B made through another block's identity, and
// (with declared or inspected evidence) some replay order G's edges allow
// leaves those bytes holding it: G does not write them whole (kWrite) through
// B itself on a path of edges after the clobbering node, or G reads them
// through B while they may still hold it. One finding is made per (graph,
// victim); classify() then decides its severity from every graph's accesses
// through B, each in its own graph's order.
#ifndef CAPALLOC_CAPTURE_ALIAS_RULE_HPP_
#define CAPALLOC_CAPTURE_ALIAS_RULE_HPP_

#include <cstdint>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/container/btree_map.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/inlined_vector.h"
#include "absl/types/span.h"
#include "capalloc/capture.hpp"
#include "capture/graph_order.hpp"
#include "capture/span_index.hpp"

namespace capalloc::detail {

// A write record with its writes grouped by the block written through, and
// the order its graph's replays respect.
struct IndexedRecord {
  WriteRecord record;
  GraphOrder order;

  IndexedRecord(WriteRecord r, GraphOrder order);
  // Indices of the writes overlapping `span`, in capture order. O(log
  // writes + hits).
  std::vector<std::size_t> writes_overlapping(MemorySpan span) const;
  // The same into `out` (cleared first), which keeps its capacity across
  // calls.
  void writes_overlapping(MemorySpan span, std::vector<std::size_t>& out) const;
  // Indices of the accesses made through block `sequence`, in capture order.
  absl::Span<const std::size_t> accesses_through(std::uint64_t sequence) const;
  // Calls visit(sequence, accesses) once per block accessed (sequence 0:
  // through no block), with the indices of its accesses in capture order.
  template <typename F>
  void for_each_writer(F&& visit) const {
    for (const WriterGroup& g : writer_groups_) {
      visit(g.sequence, absl::Span<const std::size_t>(by_writer_.data() + g.first, g.last - g.first));
    }
  }

 private:
  std::vector<std::size_t> by_begin_;  // write indices sorted by start address
  std::size_t longest_ = 0;
  // Write indices grouped by the block written through (capture order within
  // a group), and each block's group as [first, last) in it: one array for
  // the record rather than a vector per block. The groups are in sequence
  // order (found by binary search: built with one sort, not a hash insert
  // per access, and walked as an array).
  std::vector<std::size_t> by_writer_;
  struct WriterGroup {
    std::uint64_t sequence;
    std::size_t first;
    std::size_t last;
  };
  std::vector<WriterGroup> writer_groups_;
};

// Every graph's writes by address, per device.
class WriteIndex {
 public:
  // `by_writer`: also index accesses by the block they go through (for
  // `through`); an index asked only by address skips that cost.
  explicit WriteIndex(bool by_writer = true) : index_writers_(by_writer) {}
  void add(const IndexedRecord& record);
  void remove(const IndexedRecord& record);
  // (graph, write index) of every write overlapping `span` on `device`, by
  // size class, then start address.
  std::vector<std::pair<GraphHandle, std::size_t>> overlapping(int device, MemorySpan span) const;
  // The same into `out` (cleared first).
  void overlapping(int device, MemorySpan span,
                   std::vector<std::pair<GraphHandle, std::size_t>>& out) const;
  // Whether some write overlapping `span` on `device` belongs to a graph
  // `wanted` accepts. Const in every respect (the work counter too), so that
  // readers holding different locks may call it concurrently.
  template <typename Wanted>
  bool any_overlapping(int device, MemorySpan span, Wanted&& wanted) const {
    auto d = devices_.find(device);
    if (d == devices_.end()) return false;
    bool found = false;
    std::uint64_t uncounted = 0;
    d->second.for_candidates(span, uncounted, [&](std::uintptr_t, const Entry& e) {
      found = e.end > span.begin() && wanted(e.graph);
      return !found;
    });
    return found;
  }
  // (graph, write index) of every access made through block `sequence`, in
  // the order `overlapping` would list them (by start address, then as
  // added). O(those accesses), however many other writes share its bytes.
  std::vector<std::pair<GraphHandle, std::size_t>> through(std::uint64_t sequence) const;
  // Entries scanned by `overlapping` and `through` so far (the tracker's
  // work counter).
  std::uint64_t visited() const { return visited_; }

 private:
  bool index_writers_ = true;
  mutable std::uint64_t visited_ = 0;
  std::uint64_t added_ = 0;
  // The records that access a block through it, each with the number of
  // accesses added before its own (for ties on start address in `through`): one
  // entry per (block, record), not per access; the accesses themselves are
  // the record's (accesses_through). Most blocks are accessed by one graph:
  // one entry inline, no allocation.
  struct Accessor {
    const IndexedRecord* record;
    std::uint64_t base;
  };
  absl::flat_hash_map<std::uint64_t, absl::InlinedVector<Accessor, 1>> by_writer_;
  // `through`'s accesses before they are sorted, in a vector kept across
  // calls (it allocates only while it grows).
  struct ThroughEntry {
    std::uintptr_t begin;
    std::uint64_t added;  // order of addition, for ties on `begin`
    GraphHandle graph;
    std::size_t write;
  };
  mutable std::vector<ThroughEntry> through_entries_;
  struct Entry {
    GraphHandle graph;
    std::size_t write;
    std::uintptr_t end;
  };
  // Writes by start address, in size classes (span_index.hpp).
  using DeviceWrites = SpanIndex<Entry>;
  absl::flat_hash_map<int, DeviceWrites> devices_;
};

// Vectors find_clobbers fills and clears, kept by its caller across victims
// so that, once grown, they do not allocate. Holds nothing between calls.
struct ClobberScratch {
  std::vector<const RecordedWrite*> own;  // the victim's accesses on a write's bytes
  std::vector<MemorySpan> left;           // bytes a write leaves harmed
  std::vector<MemorySpan> left_optimistic;
  std::vector<MemorySpan> named_left;  // those of the write that names the finding
  std::vector<MemorySpan> restored;    // whole writes through the victim after a write
  std::vector<MemorySpan> between;     // and those before a read of the victim
};

// Appends the findings of `record` against `victim`, considering the writes
// `candidates` (indices into record.writes overlapping the victim).
void find_clobbers(const IndexedRecord& record, const BlockRef& victim,
                   const std::vector<std::size_t>& candidates, std::vector<Finding>& out,
                   ClobberScratch& scratch);

// One access some graph makes through the victim's own block.
struct VictimAccess {
  GraphHandle graph = 0;
  std::string_view label;
  const RecordedWrite* access = nullptr;
  const GraphOrder* order = nullptr;  // of `graph`'s replays
};

// Sets f.severity and f.severity_reason from the victim's lifetime and
// `accesses`, every graph's accesses through the victim (the rule is in
// capalloc/capture.hpp at Severity, with examples in docs/design.md).
// Reorders `accesses` (by graph, stably).
void classify(Finding& f, std::vector<VictimAccess>& accesses);
// Appends the stale-read finding of `record` against `victim`, if any: the
// graph reads the victim's bytes through another block (freed since, or no
// block) without writing them first in the same replay.
void find_stale_reads(const IndexedRecord& record, const BlockRef& victim,
                      const std::vector<std::size_t>& candidates, std::vector<Finding>& out);

std::string fix_for(const Finding& finding);

}  // namespace capalloc::detail

#endif  // CAPALLOC_CAPTURE_ALIAS_RULE_HPP_
