// The tracker's block history on its own: a prune keeps what it keeps in
// the orders queries rely on (frees in tick order, live blocks by address)
// without re-sorting, and SortedSpans::assign builds the index that adding
// the same ranges one by one builds.
#include <cstdint>
#include <random>
#include <stdexcept>
#include <utility>
#include <vector>

#include "capture/block_history.hpp"
#include "common/chunked_vector.hpp"
#include "capture/graph_order.hpp"
#include "capture/span_index.hpp"
#include "test_support.hpp"

using capalloc::BlockRef;
using capalloc::GraphDependencies;
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

// GraphOrder (capture/graph_order.hpp) answers a chain, one stream's capture,
// by comparing positions: the answers must be those of the same order given
// with redundant edges, which takes the general path (ancestor sets).
TEST_CASE("graph order: a chain answers as the same order built from ancestor sets",
          "[graph_order]") {
  const std::size_t n = 40;
  GraphDependencies chain, redundant;
  for (std::size_t i = 0; i < n; ++i) {
    if (i == 0) {
      chain.add_node({});
    } else {
      chain.add_node({i - 1});
    }
    std::vector<std::size_t> d;
    if (i >= 1) d.push_back(i - 1);
    if (i >= 2) d.push_back(i - 2);  // implied by the chain: not a chain's shape
    redundant.add_node(d);
  }
  auto fast = capalloc::detail::GraphOrder::from_edges(chain);
  auto general = capalloc::detail::GraphOrder::from_edges(redundant);
  REQUIRE_OK(fast);
  REQUIRE_OK(general);
  CHECK(fast->from_edges());
  CHECK(fast->node_count() == n);
  for (std::size_t a = 0; a < n + 2; ++a) {
    for (std::size_t b = 0; b < n + 2; ++b) {
      INFO(a << " before " << b);
      CHECK(fast->before(a, b) == general->before(a, b));
      CHECK(fast->unordered(a, b) == general->unordered(a, b));
    }
  }
  // The path follows the chain's edges one node at a time.
  CHECK(fast->path(3, 7) == std::vector<std::size_t>{3, 4, 5, 6, 7});
  CHECK(fast->path(7, 3).empty());
}

TEST_CASE("graph order: only a chain takes the chain's answers", "[graph_order]") {
  // 0 <- 1, 0 <- 2: a fork; 1 and 2 are unordered though 1 < 2.
  const auto fork = GraphDependencies::from_lists({{}, {0}, {0}});
  auto order = capalloc::detail::GraphOrder::from_edges(fork);
  REQUIRE_OK(order);
  CHECK(order->before(0, 2));
  CHECK_FALSE(order->before(1, 2));
  CHECK(order->unordered(1, 2));
  // A chain's shape with a bad edge is refused, not taken as a chain.
  const auto bad = GraphDependencies::from_lists({{}, {0}, {5}});
  CHECK(capalloc::detail::GraphOrder::from_edges(bad).status().code() ==
        absl::StatusCode::kInvalidArgument);
}

TEST_CASE("graph order: a chain longer than the dense limit answers without walking",
          "[graph_order]") {
  // Past kDenseLimit the general path walks the edges per question (O(n));
  // a chain answers at once, so a million questions stay cheap.
  const std::size_t n = capalloc::detail::GraphOrder::kDenseLimit * 3;
  GraphDependencies chain;
  chain.reserve(n, n - 1);
  for (std::size_t i = 0; i < n; ++i) {
    if (i == 0) {
      chain.add_node({});
    } else {
      chain.add_node({i - 1});
    }
  }
  auto order = capalloc::detail::GraphOrder::from_edges(std::move(chain));
  REQUIRE_OK(order);
  std::size_t before = 0, expected = 0;
  for (std::size_t q = 0; q < 1'000'000; ++q) {
    const std::size_t a = q % n, b = n - 1 - q % n;
    before += order->before(a, b) ? 1 : 0;
    expected += a < b ? 1 : 0;
  }
  CHECK(before == expected);
  CHECK(order->path(0, 2) == std::vector<std::size_t>{0, 1, 2});
}

TEST_CASE("block history: a negative device is refused and changes nothing",
          "[capture][history]") {
  BlockHistory history;
  history.note(0, block(1, 0x100000, 0x800), 1);
  CHECK_THROWS_AS(history.note(-1, block(2, 0x200000, 0x800), 2), std::invalid_argument);
  CHECK_THROWS_AS(history.freed(-3, block(3, 0x300000, 0x800), 3, 0, 0), std::invalid_argument);
  CHECK(history.size() == 1);
  CHECK(history.find(2) == nullptr);
  CHECK(history.find(3) == nullptr);
  std::vector<const Occupant*> live;
  history.live_overlapping(0, MemorySpan{reinterpret_cast<const void*>(0x100000), 0x10}, live);
  CHECK(sequences(live) == std::vector<std::uint64_t>{1});
  live.clear();
  history.live_overlapping(-1, MemorySpan{reinterpret_cast<const void*>(0x200000), 0x10}, live);
  CHECK(live.empty());
}

TEST_CASE("chunked vector: elements never move, and a move takes them whole", "[common]") {
  capalloc::detail::ChunkedVector<int, 4> v;
  std::vector<int*> addresses;
  for (int i = 0; i < 10; ++i) {
    int& slot = v.emplace_back();
    CHECK(slot == 0);  // default-constructed, never used before
    slot = i;
    addresses.push_back(&slot);
  }
  for (int i = 0; i < 10; ++i) {
    CHECK(&v[static_cast<std::size_t>(i)] == addresses[static_cast<std::size_t>(i)]);
    CHECK(v[static_cast<std::size_t>(i)] == i);
  }
  auto& self = v;
  v = std::move(self);  // a self-move keeps everything
  CHECK(v.size() == 10);
  CHECK(&v[9] == addresses[9]);
  capalloc::detail::ChunkedVector<int, 4> w(std::move(v));
  CHECK(v.empty());  // NOLINT(bugprone-use-after-move): moved-from is empty
  CHECK(w.size() == 10);
  CHECK(&w[5] == addresses[5]);
  v.push_back(42);  // a moved-from one is usable again
  CHECK(v.size() == 1);
  CHECK(v[0] == 42);
}
