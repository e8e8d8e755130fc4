// The TLSF free index on its own: every block found fits, exact fits are
// preferred, and insert/remove keep the count and the bins consistent.
#include <random>
#include <vector>

#include "allocator/free_index.hpp"
#include "test_support.hpp"

using capalloc::detail::Block;
using capalloc::detail::FreeIndex;

TEST_CASE("free index: finds a fitting block, preferring the exact size", "[free_index]") {
  FreeIndex index(9);  // 512 B granules
  std::vector<Block> blocks(4);
  const std::size_t sizes[] = {512, 4096, 1 << 20, (1 << 20) + 512};
  for (std::size_t i = 0; i < 4; ++i) {
    blocks[i].addr = 0x100000 * (i + 1);
    blocks[i].size = sizes[i];
    index.insert(&blocks[i]);
  }
  CHECK(index.count() == 4);
  CHECK(index.find(512) == &blocks[0]);
  CHECK(index.find(1024)->size >= 1024);
  CHECK(index.find(1 << 20) == &blocks[2]);
  CHECK(index.find((1 << 20) + 512) == &blocks[3]);
  CHECK(index.find((1 << 20) + 1024) == nullptr);
  index.remove(&blocks[2]);
  CHECK(index.find(1 << 20) == &blocks[3]);
  CHECK_FALSE(index.contains(&blocks[2]));
  CHECK(index.contains(&blocks[3]));
  CHECK(index.count() == 3);
}

TEST_CASE("free index: random sizes, every find fits and no smaller-bin block is skipped",
          "[free_index]") {
  FreeIndex index(9);
  std::mt19937_64 rng(3);
  std::vector<Block> blocks(2000);
  for (auto& b : blocks) {
    b.size = (1 + rng() % 40000) * 512;
    index.insert(&b);
  }
  for (int i = 0; i < 5000; ++i) {
    const std::size_t want = (1 + rng() % 40000) * 512;
    Block* found = index.find(want);
    std::size_t largest = 0;
    index.for_each([&](const Block* b) { largest = std::max(largest, b->size); });
    if (found == nullptr) {
      // Only acceptable when nothing can be proven to fit in O(1): no block
      // from a higher bin, and the request's own bin beyond the probe.
      CHECK(largest < want + want / 8);
    } else {
      CHECK(found->size >= want);
      index.remove(found);
      index.insert(found);
    }
  }
  for (auto& b : blocks) index.remove(&b);
  CHECK(index.empty());
}

TEST_CASE("free index: the search above a request's bin crosses to the next power of two",
          "[free_index]") {
  // 16 granules and up: 16 bins per power of two. A request in the last
  // bin of its power of two (second level 15) must find a block of the
  // next power of two, and one in a lower bin a block later in its own.
  FreeIndex index(9);
  std::vector<Block> blocks(2);
  blocks[0].size = 64 * 512;  // first bin of [64, 128) granules
  index.insert(&blocks[0]);
  CHECK(index.find(63 * 512) == &blocks[0]);  // last bin of [32, 64)
  CHECK(index.find(33 * 512) == &blocks[0]);
  blocks[1].size = 40 * 512;  // a later bin of [32, 64)
  index.insert(&blocks[1]);
  CHECK(index.find(33 * 512) == &blocks[1]);
  CHECK(index.find(63 * 512) == &blocks[0]);
  CHECK(index.find(65 * 512) == nullptr);  // own bin's block too small, nothing above
  index.remove(&blocks[0]);
  index.remove(&blocks[1]);
  CHECK(index.empty());
}

TEST_CASE("free index: a block resized while filed fails contains()", "[free_index]") {
  // remove() trusts the bin the block was filed in; the pool unfiles a
  // block before it resizes it, and its invariant check (contains) catches
  // a resize that did not.
  FreeIndex index(9);
  Block block;
  block.size = 4096;
  index.insert(&block);
  CHECK(index.contains(&block));
  block.size = 1 << 20;
  CHECK_FALSE(index.contains(&block));
  block.size = 4096;
  index.remove(&block);
  CHECK(index.empty());
}
