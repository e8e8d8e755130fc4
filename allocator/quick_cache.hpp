// allocator/quick_cache.hpp: recently freed small blocks of one (pool,
// stream, size class), by exact size, in front of the FreeIndex.
//
// Why: in steady state most requests repeat sizes that were just freed. A
// free that merges with its neighbours and files the result in the TLSF
// index, followed by an allocation that finds, removes and splits it again,
// costs about 400 instructions per pair; popping the block the last free of
// that size left costs a few dozen. tcmalloc's and mimalloc's free lists
// rest on the same observation.
//
// What it costs in memory: little at peak (see Pool::caches_freed for the
// cap). A cached block is free (counted in the pool's free blocks and bytes)
// but not merged with its free neighbours, so it serves only its own size.
// When the FreeIndex cannot serve a request, the Pool drains the cache of
// that (stream, class) into the index (merging each block) and tries again
// before the Allocator reserves a new segment; anything that gives segments
// back drains every cache first. So no segment is ever reserved while cached
// blocks could have served the request, and a drain costs one merge per
// cached block, once: amortized O(1) per free.
//
// Layout: the TLSF index's size classes (16 per power of two, exact below
// 16 granules), one intrusive LIFO list each (Block::free_prev/free_next,
// which a cached block does not otherwise use), so that the most recently
// freed block of a class is reused first and a merge can unlink a cached
// neighbour in O(1). A block is filed under the class its size falls in; a
// request pops from the lowest class whose every block fits it, else from
// the class above that when none of its sizes is more than 1/4 larger, so a
// hit hands out at most 1/4 more than the request rounded to the
// granularity (kept inside the block, as a split keeps a remainder),
// and serves sizes that differ by a few granules, as a steady state of
// varying sizes asks. The second class: on small-block churn about half the
// requests found the first one empty and paid the free index and a split
// (callgrind, torch entry points: 51.00M -> 46.98M instructions; peak
// reserved unchanged on the four generated traces).
#ifndef CAPALLOC_ALLOCATOR_QUICK_CACHE_HPP_
#define CAPALLOC_ALLOCATOR_QUICK_CACHE_HPP_

#include <array>
#include <bit>
#include <cassert>
#include <cstddef>

#include "allocator/block.hpp"

namespace capalloc::detail {

// The quick cache's size classes, and tables of them by size in granules.
namespace quick_classes {

inline constexpr unsigned kSecondLevelBits = 4;
inline constexpr unsigned kSecondLevels = 1u << kSecondLevelBits;
// Sizes below 2^kFirstLevels granules are cached (256 KiB at the default
// 512-byte granularity).
inline constexpr unsigned kFirstLevels = 9;
inline constexpr std::size_t kBins = kFirstLevels * kSecondLevels;

// The class of a block of `granules` granules (FreeIndex's bins).
constexpr std::size_t class_of(std::size_t granules) {
  const unsigned first = static_cast<unsigned>(std::bit_width(granules)) - 1;
  const std::size_t second = first < kSecondLevelBits
                                 ? granules - (std::size_t{1} << first)
                                 : (granules >> (first - kSecondLevelBits)) & (kSecondLevels - 1);
  return first * kSecondLevels + second;
}

// The lowest class whose every size holds `granules`: its own class when it
// is the smallest size there, else the next one up.
constexpr std::size_t fitting_class(std::size_t granules) {
  std::size_t i = class_of(granules);
  if (granules >= (std::size_t{1} << kSecondLevelBits) &&
      (granules & ((std::size_t{1} << (std::bit_width(granules) - 1 - kSecondLevelBits)) - 1)) !=
          0) {
    ++i;
  }
  return i;
}

// class_of and fitting_class of every cached size, by granules: a load
// instead of the bit arithmetic on the steady-state path (callgrind,
// small-block churn: about 15 instructions an allocation and 10 a free);
// and `second`, the class a request tries when its fitting class is empty:
// the class above that, when every size filed there is at most 1/4 more
// than the request, else none (below 16 granules, where each size has its
// own class, the next size up is often more: 3 granules for 2). 3 x 512
// bytes. Entry 0 (no block or request has 0 granules) is kBins, no class.
inline constexpr std::size_t kTableGranules = std::size_t{1} << kFirstLevels;
struct ClassTables {
  std::array<unsigned char, kTableGranules> class_of{};
  std::array<unsigned char, kTableGranules> fitting{};
  std::array<unsigned char, kTableGranules> second{};
};
static_assert(kBins < 256, "classes fit the tables' bytes");
constexpr ClassTables make_tables() {
  ClassTables t;
  // The largest size filed in each class (0: no size is).
  std::array<std::size_t, kBins> largest{};
  for (std::size_t g = 1; g < kTableGranules; ++g) largest[class_of(g)] = g;
  t.class_of[0] = t.fitting[0] = t.second[0] = static_cast<unsigned char>(kBins);
  for (std::size_t g = 1; g < kTableGranules; ++g) {
    t.class_of[g] = static_cast<unsigned char>(class_of(g));
    const std::size_t fit = fitting_class(g);
    t.fitting[g] = static_cast<unsigned char>(fit);
    const std::size_t above = fit + 1;
    const bool usable = above < kBins && largest[above] != 0 && 4 * largest[above] <= 5 * g;
    t.second[g] = static_cast<unsigned char>(usable ? above : kBins);
  }
  return t;
}
inline constexpr ClassTables kTables = make_tables();

}  // namespace quick_classes

class QuickCache {
 public:
  static constexpr unsigned kSecondLevelBits = quick_classes::kSecondLevelBits;
  static constexpr unsigned kSecondLevels = quick_classes::kSecondLevels;
  static constexpr unsigned kFirstLevels = quick_classes::kFirstLevels;
  static constexpr std::size_t kBins = quick_classes::kBins;
  // The largest request a cached block can serve, in granules.
  static constexpr std::size_t kMaxCachedGranules =
      (std::size_t{1} << kFirstLevels) - (std::size_t{1} << (kFirstLevels - 1 - kSecondLevelBits));

  explicit QuickCache(unsigned granule_shift) : granule_shift_(granule_shift) {}

  // Whether freed blocks of `size` bytes (a non-zero multiple of the
  // granularity) are cached at all: none once refuse_all() ran.
  bool caches(std::size_t size) const { return (size >> granule_shift_) < cached_below_; }
  // The cache takes no block from now on (it must be empty). For the
  // orphans' indexes (Pool::orphan_stream): a cached block is a hole the
  // segment's "fully free" test does not see, so an orphan with one could
  // never be adopted or given back.
  void refuse_all() {
    assert(empty());
    cached_below_ = 0;
  }

  // The most recently cached block of the lowest class whose blocks all
  // hold `size` bytes, else of the class above it when that class's blocks
  // are all at most 1/4 larger than `size` (kTables.second), unlinked;
  // nullptr when neither has one or the size is beyond the cached classes.
  Block* pop(std::size_t size) {
    const std::size_t granules = size >> granule_shift_;
    if (granules >= quick_classes::kTableGranules) return nullptr;
    const std::size_t i = quick_classes::kTables.fitting[granules];
    if (i >= kBins) return nullptr;
    if (Block* b = pop_head(i)) return b;
    const std::size_t j = quick_classes::kTables.second[granules];
    return j < kBins ? pop_head(j) : nullptr;
  }

  // Files a free block. Precondition: caches(block->size), not filed anywhere.
  void push(Block* block) {
    assert(!block->in_quick_cache && !block->in_free_index);
    Block*& head = heads_[bin(block->size)];
    block->free_prev = nullptr;
    block->free_next = head;
    if (head != nullptr) head->free_prev = block;
    head = block;
    block->in_quick_cache = true;
    ++count_;
    bytes_ += block->size;
  }

  // Unlinks a cached block (a neighbour that a merge absorbs).
  void remove(Block* block) {
    assert(block->in_quick_cache);
    if (block->free_prev != nullptr) {
      block->free_prev->free_next = block->free_next;
    } else {
      heads_[bin(block->size)] = block->free_next;
    }
    if (block->free_next != nullptr) block->free_next->free_prev = block->free_prev;
    block->free_prev = block->free_next = nullptr;
    block->in_quick_cache = false;
    --count_;
    bytes_ -= block->size;
  }

  // Unlinks every cached block and hands it to `take` (smallest sizes first).
  template <typename F>
  void drain(F&& take) {
    for (std::size_t i = 0; i < kBins && count_ > 0; ++i) {
      // `take` may unlink other cached blocks (merged neighbours), so each
      // pop leaves the list well formed first.
      while (Block* b = pop_head(i)) take(b);
    }
  }

  std::size_t count() const { return count_; }
  std::size_t bytes() const { return bytes_; }
  bool empty() const { return count_ == 0; }
  // True when `block` is linked in its size's list. For invariant checks.
  bool contains(const Block* block) const {
    for (const Block* b = heads_[bin(block->size)]; b != nullptr; b = b->free_next) {
      if (b == block) return true;
    }
    return false;
  }

 private:
  std::size_t bin(std::size_t size) const {
    assert(size > 0 && caches(size));
    return quick_classes::kTables.class_of[size >> granule_shift_];
  }

  Block* pop_head(std::size_t i) {
    Block* b = heads_[i];
    if (b == nullptr) return nullptr;
    heads_[i] = b->free_next;
    if (b->free_next != nullptr) b->free_next->free_prev = nullptr;
    b->free_next = nullptr;
    b->in_quick_cache = false;
    --count_;
    bytes_ -= b->size;
    return b;
  }

  unsigned granule_shift_;
  // caches() takes sizes below this many granules.
  std::size_t cached_below_ = std::size_t{1} << kFirstLevels;
  std::size_t count_ = 0;
  std::size_t bytes_ = 0;
  std::array<Block*, kBins> heads_{};
};

}  // namespace capalloc::detail

#endif  // CAPALLOC_ALLOCATOR_QUICK_CACHE_HPP_
