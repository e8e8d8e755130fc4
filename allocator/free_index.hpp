// allocator/free_index.hpp: the free-block index of one (pool, stream, size
// class), a two-level segregated fit (TLSF-style) structure.
//
// Why TLSF and not an ordered set (PyTorch keeps a std::set ordered by size
// and address): lookup, insert and remove are O(1) with a small constant (two
// bit scans and a list splice), independent of how many blocks are free, and
// no node is allocated per insert. An ordered set gives exact best fit at
// O(log n) with a heap node per entry.
//
// Layout: sizes are counted in granules (the allocator's rounding
// granularity). The first level is floor(log2(granules)); the second level
// splits each power-of-two range into 16 equal bins. Bin lists are intrusive
// (Block::free_prev/free_next), newest first, so the most recently freed block
// of a size is reused first. Bitmaps record which bins are non-empty.
//
// Fit policy ("good fit"): take the best fit among the first few blocks of
// the request's own bin (an exact or near-exact fit, which is what a
// steady-state trace of repeated sizes produces), else the first block
// of the next non-empty bin above, where every block fits. The waste of the
// second step is bounded by 1/16 of the request before the allocator splits
// the remainder off.
#ifndef CAPALLOC_ALLOCATOR_FREE_INDEX_HPP_
#define CAPALLOC_ALLOCATOR_FREE_INDEX_HPP_

#include <array>
#include <cstddef>
#include <cstdint>

#include "allocator/block.hpp"
#include "allocator/quick_cache.hpp"

namespace capalloc::detail {

class FreeIndex {
 public:
  // `granule_shift`: log2 of the allocator's granularity; every size given to
  // the index is a non-zero multiple of the granularity.
  explicit FreeIndex(unsigned granule_shift) : quick(granule_shift), granule_shift_(granule_shift) {}

  // Recently freed blocks of this (pool, stream, size class) by exact size,
  // in front of the index (quick_cache.hpp). The Pool decides what goes in.
  QuickCache quick;

  void insert(Block* block);
  void remove(Block* block);
  // A free block of at least `size` bytes, or nullptr. Does not remove it.
  Block* find(std::size_t size) const;

  std::size_t count() const { return count_; }
  bool empty() const { return count_ == 0; }
  // Bytes in the blocks filed here (not those of the quick cache).
  std::size_t filed_bytes() const { return filed_bytes_; }
  // Bytes of the segments whose free blocks are filed here, counted by
  // Pool::file_segment as segments come, go and change stream.
  std::size_t segment_bytes() const { return segment_bytes_; }
  void add_segment_bytes(std::size_t bytes) { segment_bytes_ += bytes; }
  void remove_segment_bytes(std::size_t bytes) { segment_bytes_ -= bytes; }
  // Whether free memory is scarce here: under a quarter of the segments'
  // bytes free, the cached included. Then a freed block beside a free run
  // merges rather than waits in the quick cache (Pool::caches_freed).
  bool scarce() const { return 4 * (filed_bytes_ + quick.bytes()) < segment_bytes_; }
  // True when `block` is linked in the bin its size maps to, and remembers
  // that bin (remove() trusts Block::free_bin: a block resized while filed
  // fails this). O(bin length); for invariant checks only.
  bool contains(const Block* block) const;

  template <typename F>
  void for_each(F&& visit) const {
    for (const Block* head : heads_)
      for (const Block* b = head; b != nullptr; b = b->free_next) visit(b);
  }

 private:
  static constexpr unsigned kSecondLevelBits = 4;
  static constexpr unsigned kSecondLevels = 1u << kSecondLevelBits;
  static constexpr unsigned kFirstLevels = 64;
  // How many blocks of the request's own bin find() inspects.
  static constexpr int kOwnBinProbe = 4;

  struct Bin {
    unsigned first = 0;
    unsigned second = 0;
    unsigned index() const { return first * kSecondLevels + second; }
  };
  // The bin a block of `size` is filed in.
  Bin bin_of(std::size_t size) const;

  unsigned granule_shift_;
  std::size_t count_ = 0;
  std::size_t filed_bytes_ = 0;
  std::size_t segment_bytes_ = 0;
  std::uint64_t first_level_map_ = 0;
  std::array<std::uint16_t, kFirstLevels> second_level_map_{};
  std::array<Block*, kFirstLevels * kSecondLevels> heads_{};
};

}  // namespace capalloc::detail

#endif  // CAPALLOC_ALLOCATOR_FREE_INDEX_HPP_
