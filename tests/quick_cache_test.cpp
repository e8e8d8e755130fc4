// The quick cache of freed small blocks (allocator/quick_cache.hpp) through
// the Allocator: a freed block serves the next request of its size class,
// cached blocks never make the allocator reserve a segment they could have
// served merged, and everything that needs whole free segments sees through
// the cache. Every case ends with CheckInvariants.
#include <random>
#include <vector>

#include "allocator/quick_cache.hpp"
#include "test_support.hpp"

using namespace capalloc;
using capalloc::testing::host_runtime;
using capalloc::testing::make_allocator;

namespace {

// `count` blocks of `bytes` each, in allocation order.
std::vector<void*> allocate_blocks(Allocator& alloc, int count, std::size_t bytes) {
  std::vector<void*> blocks;
  for (int i = 0; i < count; ++i) {
    auto p = alloc.allocate(bytes);
    REQUIRE_OK(p);
    blocks.push_back(*p);
  }
  return blocks;
}

}  // namespace

TEST_CASE("quick cache: a freed small block serves the next request of its class",
          "[quick_cache]") {
  auto alloc = make_allocator(host_runtime());
  auto a = alloc->allocate(40 << 10);
  REQUIRE_OK(a);
  REQUIRE_OK(alloc->deallocate(*a));
  // 39.5 KiB is in the class above 39 KiB's; the 40 KiB block (the
  // smallest size of its class) fits it: same address, no split.
  auto b = alloc->allocate((39 << 10) + 512);
  REQUIRE_OK(b);
  CHECK(*b == *a);
  auto info = alloc->block_info(*b);
  REQUIRE_OK(info);
  CHECK(info->size == std::size_t{40} << 10);
  CHECK(info->requested == (std::size_t{39} << 10) + 512);
  REQUIRE_OK(alloc->deallocate(*b));
  // A double free of a cached block is still a double free.
  CHECK(alloc->deallocate(*b).code() == absl::StatusCode::kFailedPrecondition);
  REQUIRE_OK(alloc->CheckInvariants());
}

TEST_CASE("quick cache: cached blocks are merged before a new segment is reserved",
          "[quick_cache]") {
  auto alloc = make_allocator(host_runtime());
  // Fill one small segment (2 MiB) with 64 KiB blocks. Free the last eight
  // first (512 KiB, a quarter of the segment: from then on free memory is
  // not scarce, and freed blocks beside free ones are cached), then the
  // first eight: all cached and unmerged.
  const std::vector<void*> blocks = allocate_blocks(*alloc, 32, 64 << 10);
  const auto before = alloc->stats(0);
  REQUIRE_OK(before);
  REQUIRE(before->segments.current == 1);
  for (int i = 24; i < 32; ++i) REQUIRE_OK(alloc->deallocate(blocks[i]));
  for (int i = 0; i < 8; ++i) REQUIRE_OK(alloc->deallocate(blocks[i]));
  REQUIRE_OK(alloc->CheckInvariants());
  const auto freed = alloc->stats(0);
  REQUIRE_OK(freed);
  // The first eight cached apart; the last eight merged into one run as
  // the first of them found a scarce index.
  CHECK(freed->free_blocks == 9);
  // The last eight's place serves a 512 KiB request; the next one fits only
  // in the first eight merged: no second segment.
  auto tail = alloc->allocate(512 << 10);
  REQUIRE_OK(tail);
  CHECK(*tail == blocks[24]);
  auto big = alloc->allocate(512 << 10);
  REQUIRE_OK(big);
  CHECK(*big == blocks[0]);
  CHECK(alloc->stats(0)->segments.current == 1);
  CHECK(alloc->stats(0)->reserved_bytes.peak == before->reserved_bytes.peak);
  REQUIRE_OK(alloc->CheckInvariants());
  REQUIRE_OK(alloc->deallocate(*big));
  REQUIRE_OK(alloc->deallocate(*tail));
  for (int i = 8; i < 24; ++i) REQUIRE_OK(alloc->deallocate(blocks[i]));
  REQUIRE_OK(alloc->CheckInvariants());
}

TEST_CASE("quick cache: while its index is scarce, a block freed beside a free one merges",
          "[quick_cache]") {
  // FreeIndex::scarce: under a quarter of the index's segment bytes free.
  SECTION("scarce: a full segment") {
    auto alloc = make_allocator(host_runtime());
    const std::vector<void*> blocks = allocate_blocks(*alloc, 32, 64 << 10);
    REQUIRE(alloc->stats(0)->segments.current == 1);
    REQUIRE_OK(alloc->deallocate(blocks[31]));  // no free neighbour: cached
    CHECK(alloc->stats(0)->free_blocks == 1);
    REQUIRE_OK(alloc->deallocate(blocks[29]));  // no free neighbour: cached
    CHECK(alloc->stats(0)->free_blocks == 2);
    // Beside both, in a scarce index: merges with them into one run.
    REQUIRE_OK(alloc->deallocate(blocks[30]));
    CHECK(alloc->stats(0)->free_blocks == 1);
    REQUIRE_OK(alloc->CheckInvariants());
    auto run = alloc->allocate(192 << 10);
    REQUIRE_OK(run);
    CHECK(*run == blocks[29]);
    REQUIRE_OK(alloc->deallocate(*run));
    for (int i = 0; i < 29; ++i) REQUIRE_OK(alloc->deallocate(blocks[i]));
    REQUIRE_OK(alloc->CheckInvariants());
  }
  SECTION("not scarce: most of the segment free") {
    auto alloc = make_allocator(host_runtime());
    const std::vector<void*> blocks = allocate_blocks(*alloc, 8, 64 << 10);
    REQUIRE(alloc->stats(0)->segments.current == 1);
    REQUIRE(alloc->stats(0)->free_blocks == 1);  // the segment's free tail
    // Beside the tail, but 1.5 MiB of 2 is free: cached, unmerged.
    REQUIRE_OK(alloc->deallocate(blocks[7]));
    CHECK(alloc->stats(0)->free_blocks == 2);
    REQUIRE_OK(alloc->deallocate(blocks[6]));
    CHECK(alloc->stats(0)->free_blocks == 3);
    REQUIRE_OK(alloc->CheckInvariants());
    // The cache serves its own size back, the block freed last first.
    auto again = alloc->allocate(64 << 10);
    REQUIRE_OK(again);
    CHECK(*again == blocks[6]);
    REQUIRE_OK(alloc->deallocate(*again));
    for (int i = 0; i < 6; ++i) REQUIRE_OK(alloc->deallocate(blocks[i]));
    REQUIRE_OK(alloc->CheckInvariants());
  }
}

TEST_CASE("quick cache: a cache holds at most its share of the pool, and the rest merge at once",
          "[quick_cache]") {
  auto alloc = make_allocator(host_runtime());
  const std::vector<void*> blocks = allocate_blocks(*alloc, 32, 64 << 10);
  // Every other block: no two freed blocks touch, so each free block left
  // is one the cache holds or one that merged with nothing.
  for (int i = 0; i < 32; i += 2) REQUIRE_OK(alloc->deallocate(blocks[i]));
  CHECK(alloc->stats(0)->free_blocks == 16);
  // Then their neighbours: the cached ones stay apart, the others merge.
  for (int i = 1; i < 32; i += 2) REQUIRE_OK(alloc->deallocate(blocks[i]));
  const auto after = alloc->stats(0);
  REQUIRE_OK(after);
  CHECK(after->free_blocks < 32);
  REQUIRE_OK(alloc->CheckInvariants());
  REQUIRE_OK(alloc->empty_cache());
  CHECK(alloc->stats(0)->reserved_bytes.current == 0);
}

TEST_CASE("quick cache: empty_cache gives back a segment whose blocks are all cached",
          "[quick_cache]") {
  auto alloc = make_allocator(host_runtime());
  std::vector<void*> blocks;
  for (int i = 0; i < 10; ++i) {
    auto p = alloc->allocate((1 + i) << 10);
    REQUIRE_OK(p);
    blocks.push_back(*p);
  }
  for (void* p : blocks) REQUIRE_OK(alloc->deallocate(p));
  REQUIRE(alloc->stats(0)->reserved_bytes.current > 0);
  REQUIRE_OK(alloc->empty_cache());
  CHECK(alloc->stats(0)->reserved_bytes.current == 0);
  CHECK(alloc->stats(0)->free_blocks == 0);
  REQUIRE_OK(alloc->CheckInvariants());
}

TEST_CASE("quick cache: a merge runs through cached neighbours to every free block beyond",
          "[quick_cache]") {
  // Blocks A B C D E in address order. C goes to the cache; B and D are
  // freed, cached too; a large request drains them into one free run with
  // the segment's tail; A and E are then freed through the merging path.
  auto alloc = make_allocator(host_runtime());
  const std::vector<void*> p = allocate_blocks(*alloc, 5, 256 << 10);  // too big to cache
  const std::vector<void*> small = allocate_blocks(*alloc, 5, 8 << 10);
  // Cache small[1] and small[3], merge-free big block 2 between nothing
  // cached, then free the rest in an order that puts cached blocks between
  // free ones.
  REQUIRE_OK(alloc->deallocate(small[1]));
  REQUIRE_OK(alloc->deallocate(small[3]));
  REQUIRE_OK(alloc->deallocate(small[2]));
  REQUIRE_OK(alloc->CheckInvariants());
  REQUIRE_OK(alloc->deallocate(p[4]));
  REQUIRE_OK(alloc->deallocate(small[0]));
  REQUIRE_OK(alloc->deallocate(small[4]));
  REQUIRE_OK(alloc->CheckInvariants());
  for (int i = 0; i < 4; ++i) REQUIRE_OK(alloc->deallocate(p[i]));
  REQUIRE_OK(alloc->CheckInvariants());
  REQUIRE_OK(alloc->empty_cache());
  CHECK(alloc->stats(0)->reserved_bytes.current == 0);
}

TEST_CASE("quick cache: random small churn on two streams keeps every invariant",
          "[quick_cache]") {
  auto rt = host_runtime();
  auto alloc = make_allocator(rt);
  auto side = rt->create_stream(0);
  REQUIRE_OK(side);
  std::mt19937_64 rng(7);
  std::vector<std::pair<void*, StreamHandle>> live;
  for (int i = 0; i < 20000; ++i) {
    if (live.empty() || rng() % 2 == 0) {
      const std::size_t size = 1 + rng() % (300 << 10);  // around the cached limit
      const StreamHandle stream = rng() % 3 == 0 ? *side : kDefaultStream;
      auto p = alloc->allocate(size, 0, stream);
      REQUIRE_OK(p);
      live.emplace_back(*p, stream);
    } else {
      const std::size_t k = rng() % live.size();
      REQUIRE_OK(alloc->deallocate(live[k].first));
      live[k] = live.back();
      live.pop_back();
    }
    if (i % 997 == 0) REQUIRE_OK(alloc->CheckInvariants());
  }
  for (auto& [p, s] : live) REQUIRE_OK(alloc->deallocate(p));
  REQUIRE_OK(alloc->CheckInvariants());
  REQUIRE_OK(alloc->empty_cache());
  CHECK(alloc->stats(0)->reserved_bytes.current == 0);
  REQUIRE_OK(rt->destroy_stream(*side));
}

TEST_CASE("quick cache: a request is served only by a class whose every block fits it",
          "[quick_cache]") {
  capalloc::detail::QuickCache cache(9);
  std::vector<capalloc::detail::Block> blocks(600);
  std::mt19937_64 rng(11);
  for (auto& b : blocks) {
    b.size = (1 + rng() % 511) * 512;
    if (cache.caches(b.size)) cache.push(&b);
  }
  for (int i = 0; i < 20000; ++i) {
    const std::size_t want = (1 + rng() % 520) * 512;
    capalloc::detail::Block* got = cache.caches(want) ? cache.pop(want) : nullptr;
    if (got == nullptr) continue;
    CHECK(got->size >= want);
    CHECK(got->size <= want + want / 4);  // two classes above the request at most
    cache.push(got);
  }
}

TEST_CASE("quick cache: the class tables file every size where its requests look",
          "[quick_cache]") {
  // Exhaustive over every cached size in granules: a request of g granules
  // pops from class fitting[g], else from class second[g] when it has one;
  // every block size h filed in the first (class_of[h]) holds the request
  // and is at most 1/8 larger, every one in the second at most 1/4 (so, for
  // 2 granules, whose class above holds only 3, there is no second class);
  // the first is g's own class or the next; and requests of the largest
  // classes' sizes find no class.
  namespace qc = capalloc::detail::quick_classes;
  const auto& t = qc::kTables;
  CHECK(t.class_of[0] == qc::kBins);
  CHECK(t.fitting[0] == qc::kBins);
  CHECK(t.second[0] == qc::kBins);
  CHECK(t.second[2] == qc::kBins);  // the review's case: 3 granules is +50%
  int served = 0;
  int with_second = 0;
  for (std::size_t g = 1; g < qc::kTableGranules; ++g) {
    REQUIRE(t.class_of[g] < qc::kBins);
    CHECK((t.fitting[g] == t.class_of[g] || t.fitting[g] == t.class_of[g] + 1));
    if (t.fitting[g] >= qc::kBins) {
      CHECK(g > capalloc::detail::QuickCache::kMaxCachedGranules);
      CHECK(t.second[g] == qc::kBins);
      continue;
    }
    ++served;
    if (t.second[g] < qc::kBins) {
      ++with_second;
      CHECK(t.second[g] == t.fitting[g] + 1);
    }
    for (std::size_t h = 1; h < qc::kTableGranules; ++h) {
      if (t.class_of[h] == t.fitting[g]) {
        CHECK(h >= g);
        CHECK(8 * h <= 9 * g);
      } else if (t.second[g] < qc::kBins && t.class_of[h] == t.second[g]) {
        CHECK(h > g);
        CHECK(4 * h <= 5 * g);
      }
    }
  }
  CHECK(static_cast<std::size_t>(served) == capalloc::detail::QuickCache::kMaxCachedGranules);
  CHECK(with_second > 400);  // the second try exists for most sizes
}

TEST_CASE("quick cache: a request never gets a block more than 1/4 larger",
          "[quick_cache]") {
  // The review's case through the cache itself: only a 3-granule block
  // cached, a 2-granule request must not take it; a 5-granule one may
  // serve 4 granules (exactly 1/4 more).
  capalloc::detail::QuickCache cache(9);
  capalloc::detail::Block three;
  three.size = 3 * 512;
  cache.push(&three);
  CHECK(cache.pop(2 * 512) == nullptr);
  CHECK(cache.pop(3 * 512) == &three);
  capalloc::detail::Block five;
  five.size = 5 * 512;
  cache.push(&five);
  CHECK(cache.pop(4 * 512) == &five);
}
