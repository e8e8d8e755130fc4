// capture/span_index.hpp: address ranges by start address, split by size
// class, for "which ranges overlap this span?" over ranges that may
// overlap one another (the history's occupants over time, every graph's
// writes).
//
// One ordered map by start address answers an overlap query by scanning
// from `span.begin() - longest` (no range starting earlier can reach the
// span), so one long range (a 14 MiB activation among 8 KiB ones) makes
// every query scan 14 MiB of starts. Here ranges are kept in one map per
// power-of-two size class, each with its own longest: a query scans each
// non-empty class from its own lookback, which for the small classes is
// small. Queries visit classes in turn (not one address order); callers
// that need an order sort what they collect, or keep one class. A class
// spans a factor of 8 in size: each non-empty class costs a descent of its
// tree per query, so finer classes cost more than they save (measured on
// bench_capture's parts 2 and 3).
//
// Not thread-safe: const queries may run concurrently with each other only.
#ifndef CAPALLOC_CAPTURE_SPAN_INDEX_HPP_
#define CAPALLOC_CAPTURE_SPAN_INDEX_HPP_

#include <algorithm>
#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>

#include "absl/container/btree_map.h"
#include "capalloc/runtime.hpp"

namespace capalloc::detail {

// `ClassBits`: a class spans a factor of 2^ClassBits in size; 64 keeps one
// class (one map, one longest: queries then visit in address order).
template <typename Value, int ClassBits = 3>
class SpanIndex {
 public:
  using Map = absl::btree_multimap<std::uintptr_t, Value>;

  // A range of `size` bytes at `begin` (size 0 counts as 1 byte's class).
  void add(std::uintptr_t begin, std::size_t size, const Value& value) {
    const int k = class_of(size);
    classes_[k].by_begin.emplace(begin, value);
    classes_[k].longest = std::max(classes_[k].longest, size);
    used_ |= std::uint64_t{1} << k;
  }
  // Erases the first entry at `begin` of `size`'s class that `match` accepts;
  // returns whether one was.
  template <typename Match>
  bool erase_first(std::uintptr_t begin, std::size_t size, Match&& match) {
    const int k = class_of(size);
    Map& m = classes_[k].by_begin;
    for (auto it = m.lower_bound(begin); it != m.end() && it->first == begin; ++it) {
      if (match(it->second)) {
        m.erase(it);
        if (m.empty()) used_ &= ~(std::uint64_t{1} << k);
        return true;
      }
    }
    return false;
  }
  // Erases every entry at `begin` of `size`'s class that `match` accepts.
  template <typename Match>
  void erase_all(std::uintptr_t begin, std::size_t size, Match&& match) {
    const int k = class_of(size);
    Map& m = classes_[k].by_begin;
    // A btree erase invalidates every other iterator: compare keys, not an
    // end iterator taken before the erase.
    for (auto it = m.lower_bound(begin); it != m.end() && it->first == begin;) {
      it = match(it->second) ? m.erase(it) : std::next(it);
    }
    if (m.empty()) used_ &= ~(std::uint64_t{1} << k);
  }
  bool empty() const { return used_ == 0; }

  // Calls visit(begin, value) for every entry that may overlap `span`: each
  // class's entries starting in [span.begin() - its longest, span.end()).
  // `visited` counts them. The caller checks the overlap itself (it knows
  // each entry's end). Stops early when visit returns false.
  template <typename F>
  void for_candidates(MemorySpan span, std::uint64_t& visited, F&& visit) const {
    if (span.bytes == 0) return;
    for (std::uint64_t used = used_; used != 0; used &= used - 1) {
      const Class& c = classes_[std::countr_zero(used)];
      const std::uintptr_t from = span.begin() > c.longest ? span.begin() - c.longest : 0;
      for (auto it = c.by_begin.lower_bound(from);
           it != c.by_begin.end() && it->first < span.end(); ++it) {
        ++visited;
        if (!visit(it->first, it->second)) return;
      }
    }
  }

 private:
  // ceil(log2(size)) / ClassBits: a query looks up few classes (each costs
  // a descent of its tree) and scans at most a factor of 2^ClassBits of
  // lookback in each.
  static int class_of(std::size_t size) {
    if (size <= 1) return 0;
    const int k = static_cast<int>(std::bit_width(size - 1)) / ClassBits;
    return k >= kClasses ? kClasses - 1 : k;
  }
  struct Class {
    Map by_begin;
    std::size_t longest = 0;
  };
  static constexpr int kClasses = ClassBits >= 64 ? 1 : 64;
  std::array<Class, kClasses> classes_;
  std::uint64_t used_ = 0;  // bit k: class k has entries
};

}  // namespace capalloc::detail

#endif  // CAPALLOC_CAPTURE_SPAN_INDEX_HPP_
