// allocator/free_index.cpp: see free_index.hpp for the structure and policy.
#include "allocator/free_index.hpp"

#include <bit>
#include <cassert>

namespace capalloc::detail {

FreeIndex::Bin FreeIndex::bin_of(std::size_t size) const {
  const std::uint64_t granules = size >> granule_shift_;
  assert(granules > 0);
  const unsigned first = static_cast<unsigned>(std::bit_width(granules)) - 1;
  unsigned second;
  if (first < kSecondLevelBits) {
    // Fewer than 16 distinct sizes in this power-of-two range: one bin each.
    second = static_cast<unsigned>(granules - (std::uint64_t{1} << first));
  } else {
    second = static_cast<unsigned>((granules >> (first - kSecondLevelBits)) & (kSecondLevels - 1));
  }
  return {first, second};
}

void FreeIndex::insert(Block* block) {
  assert(!block->in_free_index);
  const Bin bin = bin_of(block->size);
  Block*& head = heads_[bin.index()];
  block->free_prev = nullptr;
  block->free_next = head;
  if (head != nullptr) head->free_prev = block;
  head = block;
  block->in_free_index = true;
  block->free_bin = static_cast<std::uint16_t>(bin.index());
  first_level_map_ |= std::uint64_t{1} << bin.first;
  second_level_map_[bin.first] =
      static_cast<std::uint16_t>(second_level_map_[bin.first] | (1u << bin.second));
  ++count_;
  filed_bytes_ += block->size;
}

void FreeIndex::remove(Block* block) {
  assert(block->in_free_index);
  assert(block->free_bin == bin_of(block->size).index());
  // The bin insert filed it in: the block's size has not changed since
  // (merges and splits unfile a block before they resize it).
  const Bin bin{block->free_bin / kSecondLevels, block->free_bin % kSecondLevels};
  Block*& head = heads_[block->free_bin];
  if (block->free_prev != nullptr) {
    block->free_prev->free_next = block->free_next;
  } else {
    head = block->free_next;
  }
  if (block->free_next != nullptr) block->free_next->free_prev = block->free_prev;
  block->free_prev = block->free_next = nullptr;
  block->in_free_index = false;
  if (head == nullptr) {
    second_level_map_[bin.first] =
        static_cast<std::uint16_t>(second_level_map_[bin.first] & ~(1u << bin.second));
    if (second_level_map_[bin.first] == 0) first_level_map_ &= ~(std::uint64_t{1} << bin.first);
  }
  --count_;
  filed_bytes_ -= block->size;
}

Block* FreeIndex::find(std::size_t size) const {
  const Bin own = bin_of(size);
  // Best fit among the first few blocks of the request's own bin.
  Block* best = nullptr;
  int probes = kOwnBinProbe;
  for (Block* b = heads_[own.index()]; b != nullptr && probes-- > 0; b = b->free_next) {
    if (b->size >= size && (best == nullptr || b->size < best->size)) {
      best = b;
      if (b->size == size) break;
    }
  }
  if (best != nullptr) return best;
  // Every block of a bin above the request's own fits: the lowest non-empty
  // bin above it on its own first level, else the lowest of the next
  // non-empty first level.
  unsigned first = own.first;
  std::uint32_t seconds = static_cast<std::uint32_t>(second_level_map_[first]) & (~1u << own.second);
  if (seconds == 0) {
    if (first + 1 >= kFirstLevels) return nullptr;
    const std::uint64_t firsts = first_level_map_ & (~std::uint64_t{0} << (first + 1));
    if (firsts == 0) return nullptr;
    first = static_cast<unsigned>(std::countr_zero(firsts));
    seconds = second_level_map_[first];
  }
  return heads_[first * kSecondLevels + static_cast<unsigned>(std::countr_zero(seconds))];
}

bool FreeIndex::contains(const Block* block) const {
  const unsigned bin = bin_of(block->size).index();
  if (block->free_bin != bin) return false;
  for (const Block* b = heads_[bin]; b != nullptr; b = b->free_next) {
    if (b == block) return true;
  }
  return false;
}

}  // namespace capalloc::detail
