// The tracker's block history on its own: a prune keeps what it keeps in
// the orders queries rely on (frees in tick order, live blocks by address)
// without re-sorting, and SortedSpans::assign builds the index that adding
// the same ranges one by one builds.
#include <cstdint>
#include <random>
#include <utility>
#include <vector>

#include "capture/block_history.hpp"
#include "capture/span_index.hpp"
#include "test_support.hpp"

using capalloc::BlockRef;
using capalloc::MemorySpan;
using capalloc::detail::BlockHistory;
using capalloc::detail::Occupant;
using capalloc::detail::SortedSpans;

namespace {

BlockRef block(std::uint64_t sequence, std::uintptr_t addr, std::size_t size,
               capalloc::CaptureId capture = 0) {
  BlockRef b;
  b.sequence = sequence;
  b.ptr = reinterpret_cast<const void*>(addr);
  b.size = size;
  b.capture = capture;
  return b;
}

std::vector<std::uint64_t> sequences(const std::vector<const Occupant*>& occupants) {
  std::vector<std::uint64_t> out;
  for (const Occupant* o : occupants) out.push_back(o->block.sequence);
  return out;
}

// Every (begin, value) for_candidates visits for `span`, in its order.
std::vector<std::pair<std::uintptr_t, int>> candidates(const SortedSpans<int>& spans,
                                                       MemorySpan span) {
  std::vector<std::pair<std::uintptr_t, int>> out;
  std::uint64_t visited = 0;
  spans.for_candidates(span, visited, [&](std::uintptr_t begin, int value) {
    out.emplace_back(begin, value);
    return true;
  });
  return out;
}

}  // namespace

TEST_CASE("block history: a prune keeps the frees in tick order and the live blocks indexed",
          "[capture][history][prune]") {
  BlockHistory history;
  // Allocated in sequence order, freed in another: 3 (tick 10), 1 (11),
  // 4 (12), 2 (13); 5 and 6 stay live; 7 is forgotten (its free never
  // reported: tick 1, kept out of the freed list until a prune).
  for (std::uint64_t s = 1; s <= 7; ++s) {
    history.note(0, block(s, 0x100000 + 0x1000 * (s % 3), 0x800, s <= 4 ? 9 : 0), s);
  }
  history.freed(0, block(3, 0x100000, 0x800, 9), 10, 9, 3);
  history.freed(0, block(1, 0x101000, 0x800, 9), 11, 9, 4);
  history.freed(0, block(4, 0x101000, 0x800, 9), 12, 9, 5);
  history.freed(0, block(2, 0x102000, 0x800, 9), 13, 9, 6);
  history.forget_live(0, 7);
  CHECK(sequences(history.freed_since(0, 0)) == std::vector<std::uint64_t>{3, 1, 4, 2});

  // Drop block 1; keep the rest.
  CHECK(history.prune([](const Occupant& o) { return o.block.sequence != 1; }) == 6);
  CHECK(history.find(1) == nullptr);
  // The forgotten block's tick (1) is before every other free.
  CHECK(sequences(history.freed_since(0, 0)) == std::vector<std::uint64_t>{7, 3, 4, 2});
  CHECK(sequences(history.freed_since(0, 11)) == std::vector<std::uint64_t>{4, 2});

  // The live ones (5 at 0x102000, 6 at 0x100000) are found by address.
  std::vector<const Occupant*> live;
  history.live_overlapping(0, MemorySpan{reinterpret_cast<const void*>(0x100000), 0x3000}, live);
  CHECK(sequences(live) == std::vector<std::uint64_t>{6, 5});
  live.clear();
  history.live_outside_overlapping(0, MemorySpan{reinterpret_cast<const void*>(0x102400), 0x100},
                                   live);
  CHECK(sequences(live) == std::vector<std::uint64_t>{5});

  // A second prune (the freed list now starts with the formerly forgotten
  // block) keeps the order again, and frees after it append.
  CHECK(history.prune([](const Occupant& o) { return o.block.sequence != 4; }) == 5);
  history.freed(0, block(5, 0x102000, 0x800), 20, 0, 0);
  CHECK(sequences(history.freed_since(0, 0)) == std::vector<std::uint64_t>{7, 3, 2, 5});
  // The whole history of a range, for reuse chains: 3 and 6 at 0x100000.
  CHECK(sequences(history.overlapping(0, MemorySpan{reinterpret_cast<const void*>(0x100000),
                                                    0x10})) == std::vector<std::uint64_t>{3, 6});
}

TEST_CASE("sorted spans: assign builds what adding one by one builds",
          "[capture][history][span]") {
  std::mt19937_64 rng(7);
  for (int round = 0; round < 50; ++round) {
    SortedSpans<int> added, assigned;
    std::vector<SortedSpans<int>::Range> ranges;
    const int n = static_cast<int>(rng() % 200);
    for (int i = 0; i < n; ++i) {
      // Few distinct starts, so that equal starts keep their insertion order.
      const std::uintptr_t begin = 0x10000 + 0x100 * (rng() % 64);
      const std::size_t size = rng() % 4 == 0 ? 0 : 0x80 * (1 + rng() % 40);
      ranges.push_back({begin, size, i});
      added.add(begin, size, i);
    }
    assigned.assign(ranges);
    for (int q = 0; q < 40; ++q) {
      const MemorySpan span{reinterpret_cast<const void*>(0x10000 + 0x40 * (rng() % 300)),
                            1 + rng() % 0x2000};
      REQUIRE(candidates(assigned, span) == candidates(added, span));
    }
  }
}
