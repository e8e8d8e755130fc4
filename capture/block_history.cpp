// capture/block_history.cpp: see block_history.hpp.
#include "capture/block_history.hpp"

#include <algorithm>

namespace capalloc::detail {

Occupant& BlockHistory::note(int device, const BlockRef& block, std::uint64_t alloc_tick) {
  if (auto it = by_sequence_.find(block.sequence); it != by_sequence_.end()) {
    return occupants_[it->second];
  }
  const std::size_t index = occupants_.size();
  occupants_.push_back(Occupant{block, alloc_tick});
  by_sequence_.emplace(block.sequence, index);
  DeviceIndex& d = devices_[device];
  d.by_address.emplace(block.span().begin(), index);
  d.longest = std::max(d.longest, block.size);
  return occupants_[index];
}

void BlockHistory::freed(int device, const BlockRef& block, std::uint64_t free_tick,
                         CaptureId capture, std::size_t position) {
  Occupant& o = note(device, block, 0);
  o.free_tick = free_tick;
  o.freed_in_capture = capture;
  o.freed_at = position;
}

const Occupant* BlockHistory::find(std::uint64_t sequence) const {
  auto it = by_sequence_.find(sequence);
  return it == by_sequence_.end() ? nullptr : &occupants_[it->second];
}

std::vector<const Occupant*> BlockHistory::overlapping(int device, MemorySpan span) const {
  std::vector<const Occupant*> out;
  auto d = devices_.find(device);
  if (d == devices_.end() || span.bytes == 0) return out;
  const std::uintptr_t from =
      span.begin() > d->second.longest ? span.begin() - d->second.longest : 0;
  for (auto it = d->second.by_address.lower_bound(from);
       it != d->second.by_address.end() && it->first < span.end(); ++it) {
    const Occupant& o = occupants_[it->second];
    if (o.block.span().overlaps(span)) out.push_back(&o);
  }
  std::sort(out.begin(), out.end(), [](const Occupant* a, const Occupant* b) {
    return a->block.sequence < b->block.sequence;
  });
  return out;
}

}  // namespace capalloc::detail
