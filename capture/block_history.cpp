// capture/block_history.cpp: see block_history.hpp.
#include "capture/block_history.hpp"

#include <algorithm>
#include <cassert>
#include <stdexcept>

#include "absl/strings/str_cat.h"

namespace capalloc::detail {

const BlockHistory::AllIndex& BlockHistory::LazyAddressIndex::folded() const {
  if (!pending.empty()) {
    for (const Pending& p : pending) index.add(p.begin, p.size, p.index);
    pending.clear();
  }
  return index;
}

Occupant& BlockHistory::note(int device, const BlockRef& block, std::uint64_t alloc_tick,
                            bool freed_next) {
  return *slots_[note_index(device, block, alloc_tick, freed_next)];
}

std::size_t BlockHistory::note_index(int device, const BlockRef& block, std::uint64_t alloc_tick,
                                     bool freed_next, bool* inserted) {
  // The device first: one it refuses leaves the history as it was.
  DeviceIndex& d = device_index(device);
  const auto [it, fresh] = by_sequence_.try_emplace(block.sequence, occupants_.size());
  if (inserted != nullptr) *inserted = fresh;
  if (!fresh) return it->second;
  const std::size_t index = it->second;
  Occupant& o = occupants_.emplace_back();
  slots_.push_back(&o);
  o.block = block;
  o.alloc_tick = alloc_tick;
  o.device = device;
  d.all.add(block.span().begin(), block.size, index);
  if (!freed_next) index_live(device, o, index);
  return index;
}

void BlockHistory::index_live(int device, Occupant& o, std::size_t index) {
  DeviceIndex& d = device_index(device);
  o.live_indexed = true;
  d.live.add(o.block.span().begin(), o.block.size, index);
  if (o.block.capture == 0) d.live_outside.add(o.block.span().begin(), o.block.size, index);
}

std::size_t BlockHistory::note_in_batch(int device, const BlockRef& block,
                                        std::uint64_t alloc_tick) {
  bool inserted = false;
  const std::size_t index = note_index(device, block, alloc_tick, /*freed_next=*/true, &inserted);
  return inserted ? index : kNotNew;
}

void BlockHistory::index_if_live(std::size_t index) {
  Occupant& o = *slots_[index];
  if (o.live() && !o.live_indexed) index_live(o.device, o, index);
}

void BlockHistory::freed(int device, const BlockRef& block, std::uint64_t free_tick,
                         CaptureId capture, std::size_t position) {
  // Tick 0 would mean "live"; the tracker's ticks start at 1 and rise, which
  // keeps each freed list in tick order (prune relies on it).
  assert(free_tick > 0);
  const std::size_t index = note_index(device, block, 0, /*freed_next=*/false);
  Occupant& o = *slots_[index];
  if (!o.live()) return;  // already recorded
  DeviceIndex& d = device_index(device);
  assert(o.device == device);
  assert(d.freed.empty() || slots_[d.freed.back()]->free_tick <= free_tick);
  o.free_tick = free_tick;
  o.freed_in_capture = capture;
  o.freed_at = position;
  if (o.live_indexed) {
    o.live_indexed = false;
    d.live.remove(o.block.span().begin(), o.block.size, index);
    if (o.block.capture == 0) d.live_outside.remove(o.block.span().begin(), o.block.size, index);
  }
  d.freed.push_back(index);
}

void BlockHistory::rebuild(Occupants occupants,
                           const std::vector<std::size_t>& renumbered) {
  // Each device's freed list is in free order already (freed() is called
  // in tick order): the kept ones keep it, renumbered, each under its own
  // device. Freed occupants in no list (forget_live's, whose free the
  // allocator never reported: tick 1, at or before every other) go first,
  // as a sort by tick would put them. The live indexes are built whole,
  // each with one sort.
  using LiveRanges = std::vector<SortedSpans<std::size_t>::Range>;
  struct Rebuilt {
    LiveRanges live, live_outside;
    std::vector<std::size_t> unlisted;  // freed, in no list
    std::vector<std::size_t> carried;   // freed, from the lists, in free order
  };
  // Every occupant's device has its index already: by device number.
  std::vector<Rebuilt> rebuilt(devices_.size());
  std::vector<bool> listed(occupants.size(), false);  // by new index
  for (const DeviceIndex& d : devices_) {
    for (std::size_t old : d.freed) {
      if (const std::size_t i = renumbered[old]; i != kDropped && !listed[i]) {
        rebuilt[static_cast<std::size_t>(occupants[i].device)].carried.push_back(i);
        listed[i] = true;
      }
    }
  }
  occupants_ = std::move(occupants);
  slots_.clear();
  slots_.reserve(occupants_.size());
  for (std::size_t i = 0; i < occupants_.size(); ++i) slots_.push_back(&occupants_[i]);
  visited_ += occupants_.size();
  by_sequence_.clear();
  by_sequence_.reserve(occupants_.size());
  devices_.clear();
  for (std::size_t i = 0; i < occupants_.size(); ++i) {
    Occupant& o = *slots_[i];
    const int device = o.device;
    by_sequence_.emplace(o.block.sequence, i);
    device_index(device).all.add(o.block.span().begin(), o.block.size, i);
    Rebuilt& r = rebuilt[static_cast<std::size_t>(device)];
    o.live_indexed = o.live();
    if (o.live()) {
      r.live.push_back({o.block.span().begin(), o.block.size, i});
      if (o.block.capture == 0) r.live_outside.push_back({o.block.span().begin(), o.block.size, i});
    } else if (!listed[i]) {
      r.unlisted.push_back(i);
    }
  }
  for (std::size_t device = 0; device < rebuilt.size(); ++device) {
    Rebuilt& r = rebuilt[device];
    DeviceIndex& d = device_index(static_cast<int>(device));
    d.live.assign(r.live);
    d.live_outside.assign(r.live_outside);
    d.freed = std::move(r.unlisted);
    d.freed.insert(d.freed.end(), r.carried.begin(), r.carried.end());
  }
}

void BlockHistory::forget_live(int device, std::uint64_t sequence) {
  auto it = by_sequence_.find(sequence);
  if (it == by_sequence_.end()) return;
  Occupant& o = *slots_[it->second];
  if (!o.live()) return;
  // Tick 1 is before every capture's begin tick, and the occupant stays out
  // of the `freed` list, which is kept in tick order for recent frees.
  o.free_tick = 1;
  if (!o.live_indexed) return;
  o.live_indexed = false;
  DeviceIndex& d = device_index(device);
  d.live.remove(o.block.span().begin(), o.block.size, it->second);
  if (o.block.capture == 0) {
    d.live_outside.remove(o.block.span().begin(), o.block.size, it->second);
  }
}

BlockHistory::DeviceIndex& BlockHistory::add_device(int device) {
  // Devices come from the allocator's blocks and records, which it checked;
  // a negative one here is a caller's bug, refused before it could index
  // out of the vector.
  if (device < 0) {
    throw std::invalid_argument(absl::StrCat("BlockHistory: device ", device, " is not a device"));
  }
  const auto i = static_cast<std::size_t>(device);
  devices_.resize(i + 1);
  return devices_[i];
}

const Occupant* BlockHistory::find(std::uint64_t sequence) const {
  auto it = by_sequence_.find(sequence);
  return it == by_sequence_.end() ? nullptr : slots_[it->second];
}

std::vector<const Occupant*> BlockHistory::overlapping(int device, MemorySpan span) const {
  std::vector<const Occupant*> out;
  const DeviceIndex* d = find_device(device);
  if (d == nullptr) return out;
  d->all.folded().for_overlapping(span, visited_, [&](std::size_t i) {
    if (slots_[i]->block.span().overlaps(span)) out.push_back(slots_[i]);
  });
  std::sort(out.begin(), out.end(), [](const Occupant* a, const Occupant* b) {
    return a->block.sequence < b->block.sequence;
  });
  return out;
}

void BlockHistory::chain(int device, MemorySpan span, std::uint64_t first, std::uint64_t last,
                         std::size_t links, std::vector<const Occupant*>& out) const {
  out.clear();
  const DeviceIndex* d = find_device(device);
  if (d == nullptr || links == 0) return;
  d->all.folded().for_overlapping(span, visited_, [&](std::size_t i) {
    const Occupant& o = *slots_[i];
    if (o.block.sequence >= first && o.block.sequence <= last && o.block.span().overlaps(span)) {
      out.push_back(&o);
    }
  });
  const auto by_sequence = [](const Occupant* a, const Occupant* b) {
    return a->block.sequence < b->block.sequence;
  };
  if (out.size() > links) {
    // The earliest to the front, the latest links - 1 to the back, in order.
    std::iter_swap(out.begin(), std::min_element(out.begin(), out.end(), by_sequence));
    const auto latest = out.end() - static_cast<std::ptrdiff_t>(links - 1);
    std::nth_element(out.begin() + 1, latest, out.end(), by_sequence);
    out.erase(out.begin() + 1, latest);
  }
  std::sort(out.begin(), out.end(), by_sequence);
}

void BlockHistory::live_overlapping(int device, MemorySpan span,
                                    std::vector<const Occupant*>& out) const {
  const DeviceIndex* d = find_device(device);
  if (d == nullptr) return;
  d->live.for_overlapping(span, visited_, [&](std::size_t i) {
    if (slots_[i]->block.span().overlaps(span)) out.push_back(slots_[i]);
  });
}

bool BlockHistory::any_live_outside(int device) const {
  const DeviceIndex* d = find_device(device);
  return d != nullptr && !d->live_outside.spans.empty();
}

void BlockHistory::live_outside_overlapping(int device, MemorySpan span,
                                            std::vector<const Occupant*>& out) const {
  const DeviceIndex* d = find_device(device);
  if (d == nullptr) return;
  d->live_outside.for_overlapping(span, visited_, [&](std::size_t i) {
    if (slots_[i]->block.span().overlaps(span)) out.push_back(slots_[i]);
  });
}

std::vector<const Occupant*> BlockHistory::freed_since(int device, std::uint64_t tick) const {
  std::vector<const Occupant*> out;
  const DeviceIndex* d = find_device(device);
  if (d == nullptr) return out;
  // Frees are recorded in tick order: walk back from the newest.
  const auto& freed = d->freed;
  for (auto it = freed.rbegin(); it != freed.rend() && slots_[*it]->free_tick > tick; ++it) {
    out.push_back(slots_[*it]);
  }
  visited_ += out.size();
  std::reverse(out.begin(), out.end());
  return out;
}

}  // namespace capalloc::detail
