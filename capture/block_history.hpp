// capture/block_history.hpp: every block the tracker has seen occupy device
// memory, so that a write can be tied to the block it went through and a
// finding can show the reuse chain that led to it.
//
// Blocks enter the history when the allocator reports them (allocations and
// frees made while a capture is active) and when the tracker meets a live
// block otherwise (a block allocated outside captures that a graph writes).
// Each occupant keeps its allocation (capture and position) and, once freed,
// when: the capture and position of the free, and the tracker's tick, a
// counter that orders all events the tracker saw.
//
// Cost: add is amortized O(1) (and O(live) for a live block); free, O(live);
// `overlapping` is O(g + k + w) where g counts granules looked up and w
// counts occupants starting within the longest length of their size class
// before the span (span_index.hpp). Not thread-safe; the tracker locks around it.
#ifndef CAPALLOC_CAPTURE_BLOCK_HISTORY_HPP_
#define CAPALLOC_CAPTURE_BLOCK_HISTORY_HPP_

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

#include "absl/container/btree_map.h"
#include "absl/container/flat_hash_map.h"
#include "capalloc/capture.hpp"
#include "common/chunked_vector.hpp"
#include "capture/span_index.hpp"

namespace capalloc::detail {

struct Occupant {
  BlockRef block;
  std::uint64_t alloc_tick = 0;  // 0: allocated before the tracker saw it
  std::uint64_t free_tick = 0;   // 0: live (as far as the tracker knows)
  CaptureId freed_in_capture = 0;
  std::size_t freed_at = 0;
  int device = 0;
  bool live_indexed = false;  // in the live indexes (noted without freed_next)

  bool live() const { return free_tick == 0; }
  ChainLink link() const {
    return {block, live(), freed_in_capture, freed_at};
  }
};

class BlockHistory {
 public:
  // Chunks of 128 occupants (112 bytes each): a std::deque allocated a node
  // for every four.
  using Occupants = ChunkedVector<Occupant, 128>;
  BlockHistory() = default;
  // Not copyable: slots_ points into occupants_ (a copy would point into
  // the original). A move keeps the occupants where they are.
  BlockHistory(const BlockHistory&) = delete;
  BlockHistory& operator=(const BlockHistory&) = delete;
  BlockHistory(BlockHistory&&) = default;
  BlockHistory& operator=(BlockHistory&&) = default;
  // Records an allocation at `alloc_tick` (0 for a block first met live,
  // allocated before the tracker looked). Idempotent per block.
  // `freed_next`: the caller records the block's free next, before any
  // query (an allocation and its free drained together), so the block
  // skips the live indexes it would leave at once.
  Occupant& note(int device, const BlockRef& block, std::uint64_t alloc_tick,
                 bool freed_next = false);
  // A batch of allocation and free events (the tracker's drain): each
  // allocation is noted with note_in_batch, which leaves it out of the live
  // indexes and returns its index when it is new (else kNotNew); once the
  // batch's frees are recorded, index_if_live(index) adds those still live.
  // The same state as note(..., freed_next) with foreknowledge of the frees,
  // without asking which blocks the batch frees.
  static constexpr std::size_t kNotNew = ~std::size_t{0};
  std::size_t note_in_batch(int device, const BlockRef& block, std::uint64_t alloc_tick);
  void index_if_live(std::size_t index);
  // Records a free; a block never noted is noted first.
  void freed(int device, const BlockRef& block, std::uint64_t free_tick, CaptureId capture,
             std::size_t position);

  const Occupant* find(std::uint64_t sequence) const;
  // Every occupant of `device` whose range ever overlapped `span`, in
  // allocation order (for reuse chains: the whole history of the range).
  std::vector<const Occupant*> overlapping(int device, MemorySpan span) const;
  // The reuse chain of `span` from block `first` to block `last` (by
  // sequence): the occupants overlapping it with a sequence in that range,
  // in allocation order, at most `links` of them: beyond that the first one
  // and the latest `links` - 1. O(occupants overlapping `span`): only those
  // in the range are ordered, and only the kept ones sorted.
  // Into `out` (cleared first), which keeps its capacity across calls.
  void chain(int device, MemorySpan span, std::uint64_t first, std::uint64_t last,
             std::size_t links, std::vector<const Occupant*>& out) const;
  // Appends the live occupants overlapping `span` to `out`. Unordered.
  void live_overlapping(int device, MemorySpan span, std::vector<const Occupant*>& out) const;
  // Likewise, only those allocated outside any capture: the only ones whose
  // free the allocator may not report, so the only ones that can go stale.
  void live_outside_overlapping(int device, MemorySpan span,
                                std::vector<const Occupant*>& out) const;
  // Whether any live occupant allocated outside captures is held for `device`.
  bool any_live_outside(int device) const;
  // Occupants freed after `tick`, in free order.
  std::vector<const Occupant*> freed_since(int device, std::uint64_t tick) const;

  // Marks a block the history holds as live, but the allocator no longer
  // does, as freed before any capture now in progress began (its free was not
  // reported: it happened while no capture was active on the device).
  void forget_live(int device, std::uint64_t sequence);

  // Drops every occupant `keep` rejects; live occupants are always kept.
  // O(occupants): the kept ones keep their indexes' orders (the freed lists
  // stay in free order without a sort). Returns how many remain.
  template <typename Keep>
  std::size_t prune(Keep&& keep) {
    Occupants kept;
    std::vector<std::size_t> renumbered(occupants_.size(), kDropped);
    for (std::size_t i = 0; i < occupants_.size(); ++i) {
      Occupant& o = *slots_[i];
      if (o.live() || keep(o)) {
        renumbered[i] = kept.size();
        kept.push_back(std::move(o));
      }
    }
    rebuild(std::move(kept), renumbered);
    return occupants_.size();
  }
  std::size_t size() const { return occupants_.size(); }
  // Entries visited so far by queries, and occupants re-indexed by prunes
  // (the tracker's work counter).
  std::uint64_t visited() const { return visited_; }

 private:
  // Occupants by start address, so that an overlap query scans only the
  // starts that can reach the span (span_index.hpp). The live indexes, whose
  // queries list blocks by address (the order writes are tied to blocks in)
  // and which hold only the blocks now live, are sorted vectors; the index
  // of every occupant, which holds a range's whole history, is a SpanIndex
  // (size classes, hashed granules: cheap inserts, unordered queries).
  template <typename Spans>
  struct AddressIndex {
    Spans spans;
    void add(std::uintptr_t begin, std::size_t size, std::size_t index) {
      spans.add(begin, size, index);
    }
    template <typename Ranges>
    void assign(const Ranges& ranges) {
      spans.assign(ranges);
    }
    void remove(std::uintptr_t begin, std::size_t size, std::size_t index) {
      spans.erase_first(begin, size, [&](std::size_t i) { return i == index; });
    }
    template <typename F>
    void for_overlapping(MemorySpan span, std::uint64_t& visited, F&& visit) const {
      spans.for_candidates(span, visited, [&](std::uintptr_t, std::size_t i) {
        visit(i);
        return true;
      });
    }
  };
  using AllIndex = AddressIndex<SpanIndex<std::size_t>>;
  using LiveIndex = AddressIndex<SortedSpans<std::size_t>>;
  // The index of every occupant, which only reuse chains and `overlapping`
  // read (when a finding is made, or on demand): additions wait in a list
  // and are folded in at the first query, so that captures without
  // findings never pay for it. Never removed from (a prune rebuilds it).
  struct LazyAddressIndex {
    struct Pending {
      std::uintptr_t begin;
      std::size_t size;
      std::size_t index;
    };
    mutable AllIndex index;
    mutable std::vector<Pending> pending;
    void add(std::uintptr_t begin, std::size_t size, std::size_t i) {
      pending.push_back({begin, size, i});
    }
    const AllIndex& folded() const;
  };
  struct DeviceIndex {
    LazyAddressIndex all;  // every occupant ever noted
    LiveIndex live;  // occupants not freed
    LiveIndex live_outside;  // of those, the ones allocated outside captures
    std::vector<std::size_t> freed;  // occupants in the order they were freed
  };
  // The occupants a prune kept, and each former index's new one (kDropped
  // for those it dropped).
  static constexpr std::size_t kDropped = ~std::size_t{0};
  void rebuild(Occupants occupants, const std::vector<std::size_t>& renumbered);
  // note(), returning the occupant's index.
  std::size_t note_index(int device, const BlockRef& block, std::uint64_t alloc_tick,
                         bool freed_next, bool* inserted = nullptr);
  void index_live(int device, Occupant& o, std::size_t index);

  mutable std::uint64_t visited_ = 0;
  Occupants occupants_;  // growing never moves an occupant
  // Each occupant's address by index: indexing occupants_ takes a division
  // and two loads, and a reuse chain visits every occupant that ever sat on
  // its range.
  std::vector<Occupant*> slots_;
  absl::flat_hash_map<std::uint64_t, std::size_t> by_sequence_;
  // Each device's indexes, by device number (numbered from 0, and few: an
  // index, not a hash, at every note and query).
  std::vector<DeviceIndex> devices_;
  DeviceIndex& device_index(int device) {
    const auto i = static_cast<std::size_t>(device);  // a negative one: past the end
    return i < devices_.size() ? devices_[i] : add_device(device);
  }
  // Grows devices_ to hold `device`; std::invalid_argument for a negative
  // one (nothing changed).
  DeviceIndex& add_device(int device);
  const DeviceIndex* find_device(int device) const {
    return device >= 0 && static_cast<std::size_t>(device) < devices_.size()
               ? &devices_[static_cast<std::size_t>(device)]
               : nullptr;
  }
};

}  // namespace capalloc::detail

#endif  // CAPALLOC_CAPTURE_BLOCK_HISTORY_HPP_
