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
// Cost: add and free are O(log n); `overlapping` is O(log n + k + w) where w
// counts occupants starting within the longest occupant's length before the
// span. Not thread-safe; the tracker locks around it.
#ifndef CAPALLOC_CAPTURE_BLOCK_HISTORY_HPP_
#define CAPALLOC_CAPTURE_BLOCK_HISTORY_HPP_

#include <cstdint>
#include <deque>
#include <vector>

#include "absl/container/btree_map.h"
#include "absl/container/flat_hash_map.h"
#include "capalloc/capture.hpp"

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
  // Records an allocation at `alloc_tick` (0 for a block first met live,
  // allocated before the tracker looked). Idempotent per block.
  // `freed_next`: the caller records the block's free next, before any
  // query (an allocation and its free drained together), so the block
  // skips the live indexes it would leave at once.
  Occupant& note(int device, const BlockRef& block, std::uint64_t alloc_tick,
                 bool freed_next = false);
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
  std::vector<const Occupant*> chain(int device, MemorySpan span, std::uint64_t first,
                                     std::uint64_t last, std::size_t links) const;
  // Appends the live occupants overlapping `span` to `out`. Unordered.
  void live_overlapping(int device, MemorySpan span, std::vector<const Occupant*>& out) const;
  // Likewise, only those allocated outside any capture: the only ones whose
  // free the allocator may not report, so the only ones that can go stale.
  void live_outside_overlapping(int device, MemorySpan span,
                                std::vector<const Occupant*>& out) const;
  // Occupants freed after `tick`, in free order.
  std::vector<const Occupant*> freed_since(int device, std::uint64_t tick) const;

  // Marks a block the history holds as live, but the allocator no longer
  // does, as freed before any capture now in progress began (its free was not
  // reported: it happened while no capture was active on the device).
  void forget_live(int device, std::uint64_t sequence);

  // Drops every occupant `keep` rejects; live occupants are always kept.
  // O(occupants). Returns how many remain.
  template <typename Keep>
  std::size_t prune(Keep&& keep) {
    std::deque<Occupant> kept;
    for (Occupant& o : occupants_) {
      if (o.live() || keep(o)) kept.push_back(std::move(o));
    }
    rebuild(std::move(kept));
    return occupants_.size();
  }
  std::size_t size() const { return occupants_.size(); }
  // Entries visited so far by queries, and occupants re-indexed by prunes
  // (the tracker's work counter).
  std::uint64_t visited() const { return visited_; }

 private:
  // Occupants by start address, with the longest length among them, so that
  // an overlap query scans only [begin - longest, end).
  struct AddressIndex {
    absl::btree_multimap<std::uintptr_t, std::size_t> by_begin;
    std::size_t longest = 0;
    void add(std::uintptr_t begin, std::size_t size, std::size_t index);
    void remove(std::uintptr_t begin, std::size_t index);
    template <typename F>
    void for_overlapping(MemorySpan span, std::uint64_t& visited, F&& visit) const;
  };
  struct DeviceIndex {
    AddressIndex all;   // every occupant ever noted
    AddressIndex live;  // occupants not freed
    AddressIndex live_outside;  // of those, the ones allocated outside captures
    std::vector<std::size_t> freed;  // occupants in the order they were freed
  };
  void rebuild(std::deque<Occupant> occupants);
  // note(), returning the occupant's index.
  std::size_t note_index(int device, const BlockRef& block, std::uint64_t alloc_tick,
                         bool freed_next);

  mutable std::uint64_t visited_ = 0;
  std::deque<Occupant> occupants_;  // a deque: growing never moves an occupant
  absl::flat_hash_map<std::uint64_t, std::size_t> by_sequence_;
  absl::flat_hash_map<int, DeviceIndex> devices_;
};

}  // namespace capalloc::detail

#endif  // CAPALLOC_CAPTURE_BLOCK_HISTORY_HPP_
