// capture/span_index.hpp: address ranges by start address, for "which
// ranges overlap this span?" over ranges that may overlap one another (the
// history's occupants over time, every graph's writes, the live blocks).
//
// A query must see every range starting in [span.begin() - longest,
// span.end()): no range starting earlier can reach the span. One long range
// (a 14 MiB activation among 8 KiB ones) would make every query scan 14 MiB
// of starts, so SpanIndex keeps ranges in size classes (a factor of 8 in
// size each), each with its own longest: a query scans each non-empty class
// from its own lookback, which for the small classes is small.
//
// SpanIndex: within a class, ranges sit in a hash table of granules (their
// start address divided by a power of two that matches the class's sizes),
// so an insert is a hash lookup and an append (a btree's was 300 to 500
// instructions, measured on bench_capture's parts 2 and 3), and a query
// looks up the granules its lookback and span cover (or, when those
// outnumber the class's non-empty granules, walks those). Queries visit
// ranges in no particular order: callers that need one sort what they
// collect.
//
// SortedSpans: one sorted vector, for small sets whose queries must list
// ranges by address (the live blocks): binary search, and an insert or erase
// moves the entries after it.
//
// Not thread-safe: const queries may run concurrently with each other only.
#ifndef CAPALLOC_CAPTURE_SPAN_INDEX_HPP_
#define CAPALLOC_CAPTURE_SPAN_INDEX_HPP_

#include <algorithm>
#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/inlined_vector.h"
#include "capalloc/runtime.hpp"

namespace capalloc::detail {

template <typename Value>
class SpanIndex {
 public:
  // A range of `size` bytes at `begin` (size 0 counts as 1 byte's class).
  void add(std::uintptr_t begin, std::size_t size, const Value& value) {
    const int k = class_of(size);
    Class& c = classes_[k];
    c.granules[begin >> shift_of(k)].push_back({begin, value});
    c.longest = std::max(c.longest, size);
    ++c.entries;
    used_ |= std::uint64_t{1} << k;
  }
  // Erases the first entry at `begin` of `size`'s class that `match` accepts;
  // returns whether one was.
  template <typename Match>
  bool erase_first(std::uintptr_t begin, std::size_t size, Match&& match) {
    const int k = class_of(size);
    return erase_in(k, begin, [&](Bucket& b) {
      for (auto it = b.begin(); it != b.end(); ++it) {
        if (it->begin == begin && match(it->value)) {
          b.erase(it);
          return std::size_t{1};
        }
      }
      return std::size_t{0};
    }) != 0;
  }
  // Erases every entry at `begin` of `size`'s class that `match` accepts.
  template <typename Match>
  void erase_all(std::uintptr_t begin, std::size_t size, Match&& match) {
    const int k = class_of(size);
    erase_in(k, begin, [&](Bucket& b) {
      const std::size_t before = b.size();
      b.erase(std::remove_if(b.begin(), b.end(),
                             [&](const Item& i) { return i.begin == begin && match(i.value); }),
              b.end());
      return before - b.size();
    });
  }
  bool empty() const { return used_ == 0; }

  // Calls visit(begin, value) for every entry that may overlap `span`: each
  // class's entries starting in [span.begin() - its longest, span.end()),
  // in no particular order. `visited` counts them. The caller checks the
  // overlap itself (it knows each entry's end). Stops early when visit
  // returns false.
  template <typename F>
  void for_candidates(MemorySpan span, std::uint64_t& visited, F&& visit) const {
    if (span.bytes == 0) return;
    const std::uintptr_t end = span.end();
    for (std::uint64_t used = used_; used != 0; used &= used - 1) {
      const int k = std::countr_zero(used);
      const Class& c = classes_[k];
      const std::uintptr_t from = span.begin() > c.longest ? span.begin() - c.longest : 0;
      const auto scan = [&](const Bucket& b) {
        for (const Item& i : b) {
          if (i.begin < from || i.begin >= end) continue;
          ++visited;
          if (!visit(i.begin, i.value)) return false;
        }
        return true;
      };
      const int shift = shift_of(k);
      const std::uintptr_t first = from >> shift, last = (end - 1) >> shift;
      if (last - first >= c.granules.size()) {
        for (const auto& [granule, b] : c.granules) {
          if (granule < first || granule > last) continue;
          if (!scan(b)) return;
        }
        continue;
      }
      for (std::uintptr_t granule = first;; ++granule) {
        if (auto g = c.granules.find(granule); g != c.granules.end() && !scan(g->second)) {
          return;
        }
        if (granule == last) break;
      }
    }
  }

 private:
  struct Item {
    std::uintptr_t begin;
    Value value;
  };
  using Bucket = absl::InlinedVector<Item, 2>;
  using Granules = absl::flat_hash_map<std::uintptr_t, Bucket>;
  struct Class {
    Granules granules;  // by begin >> shift_of(class)
    std::size_t longest = 0;
    std::size_t entries = 0;
  };
  static constexpr int kClassBits = 3;
  static constexpr int kClasses = 64 / kClassBits + 1;
  // ceil(log2(size)) / 3: a query looks up few classes and scans at most a
  // factor of 8 of lookback in each.
  static int class_of(std::size_t size) {
    if (size <= 1) return 0;
    return static_cast<int>(std::bit_width(size - 1)) / kClassBits;
  }
  // A class holds sizes up to 2^(3k+3): granules of 2^(3k+2) bytes, so that
  // a query scans its span's granules and two or three more.
  static int shift_of(int k) { return std::min(kClassBits * k + kClassBits - 1, 63); }
  // Applies `erase` (returning how many it erased) to the bucket of `begin`
  // in class k, dropping it when empty.
  template <typename Erase>
  std::size_t erase_in(int k, std::uintptr_t begin, Erase&& erase) {
    Class& c = classes_[k];
    auto g = c.granules.find(begin >> shift_of(k));
    if (g == c.granules.end()) return 0;
    const std::size_t erased = erase(g->second);
    if (g->second.empty()) c.granules.erase(g);
    c.entries -= erased;
    if (c.entries == 0) used_ &= ~(std::uint64_t{1} << k);
    return erased;
  }
  std::array<Class, kClasses> classes_;
  std::uint64_t used_ = 0;  // bit k: class k has entries
};

// Ranges in one vector sorted by start address (insertion order among equal
// starts), for small sets listed by address. Beside each range, the
// furthest end of the ranges up to it: a query scans from the first range
// that reaches past the span's start, not from a lookback as long as the
// longest range ever held (for ranges that do not overlap one another, as
// live blocks do not, that is the overlapping ones and at most one more).
template <typename Value>
class SortedSpans {
 public:
  struct Range {
    std::uintptr_t begin;
    std::size_t size;
    Value value;
  };
  // Replaces the contents with `ranges`, given in the order add() would
  // have received them: the same index as adding each, with one stable sort
  // instead of an insert (which moves every entry after it) per range.
  void assign(const std::vector<Range>& ranges) {
    items_.clear();
    items_.reserve(ranges.size());
    for (const Range& r : ranges) {
      items_.push_back(Item{r.begin, r.begin + std::max<std::size_t>(r.size, 1), 0, r.value});
    }
    std::stable_sort(items_.begin(), items_.end(),
                     [](const Item& a, const Item& b) { return a.begin < b.begin; });
    reach_from(0);
  }
  void add(std::uintptr_t begin, std::size_t size, const Value& value) {
    auto at = std::upper_bound(items_.begin(), items_.end(), begin,
                               [](std::uintptr_t b, const Item& i) { return b < i.begin; });
    const std::size_t p = static_cast<std::size_t>(at - items_.begin());
    items_.insert(at, Item{begin, begin + std::max<std::size_t>(size, 1), 0, value});
    reach_from(p);
  }
  template <typename Match>
  bool erase_first(std::uintptr_t begin, std::size_t, Match&& match) {
    for (auto it = lower(begin); it != items_.end() && it->begin == begin; ++it) {
      if (match(it->value)) {
        const std::size_t p = static_cast<std::size_t>(it - items_.begin());
        items_.erase(it);
        reach_from(p);
        return true;
      }
    }
    return false;
  }
  bool empty() const { return items_.empty(); }
  // Calls visit(begin, value), in address order, for every range that may
  // overlap `span`: those starting before its end from the first one whose
  // reach (the furthest end so far) passes its start. `visited` counts them.
  // The caller checks the overlap itself. Stops early when visit returns
  // false.
  template <typename F>
  void for_candidates(MemorySpan span, std::uint64_t& visited, F&& visit) const {
    if (span.bytes == 0) return;
    auto it = std::partition_point(items_.begin(), items_.end(),
                                   [&](const Item& i) { return i.reach <= span.begin(); });
    for (; it != items_.end() && it->begin < span.end(); ++it) {
      ++visited;
      if (!visit(it->begin, it->value)) return;
    }
  }

 private:
  struct Item {
    std::uintptr_t begin;
    std::uintptr_t end;
    std::uintptr_t reach;  // the furthest end of the items up to this one
    Value value;
  };
  void reach_from(std::size_t p) {
    std::uintptr_t reach = p == 0 ? 0 : items_[p - 1].reach;
    for (std::size_t i = p; i < items_.size(); ++i) {
      reach = std::max(reach, items_[i].end);
      items_[i].reach = reach;
    }
  }
  auto lower(std::uintptr_t begin) {
    return std::lower_bound(items_.begin(), items_.end(), begin,
                            [](const Item& i, std::uintptr_t b) { return i.begin < b; });
  }
  std::vector<Item> items_;
};

}  // namespace capalloc::detail

#endif  // CAPALLOC_CAPTURE_SPAN_INDEX_HPP_
