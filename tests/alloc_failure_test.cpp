// alloc_failure_test.cpp: the allocator's own structures when the host runs
// out of memory mid-way (std::bad_alloc from their bookkeeping, not the
// device): the pointer table keeps every entry when it cannot grow, and a
// pool whose split cannot get a block, or whose new segment cannot be
// filed, is as it was.
//
// This program replaces the global operator new with one that throws
// std::bad_alloc at the k-th allocation of the calling thread while armed.
//
// Not claimed: that every failed request through Allocator::allocate
// changes no state. A probe of that (each host allocation on a request's
// path failed in turn) found Abseil's hash tables, which the allocator uses
// for streams, interned tags and graph pools, not exception-safe on a failed
// rehash (it frees an invalid pointer). Allocator::allocate turns what
// throws into kResourceExhausted; the structures below are capalloc's own.
#include <cstdlib>
#include <new>
#include <string>
#include <vector>

#include "allocator/block_table.hpp"
#include "allocator/pool.hpp"
#include "test_support.hpp"

namespace {

// Per thread, so that the host runtime's stream workers never see a failure.
thread_local long t_countdown = 0;  // armed while > 0: fail when it reaches 1
thread_local bool t_fired = false;

bool fail_now() {
  if (t_countdown > 0 && --t_countdown == 0) {
    t_fired = true;
    return true;
  }
  return false;
}

void* failing_new(std::size_t size) {
  if (fail_now()) throw std::bad_alloc();
  if (void* p = std::malloc(size == 0 ? 1 : size)) return p;
  throw std::bad_alloc();
}

void* failing_aligned_new(std::size_t size, std::align_val_t align) {
  const auto a = static_cast<std::size_t>(align);
  if (fail_now()) throw std::bad_alloc();
  if (void* p = std::aligned_alloc(a, (size + a - 1) / a * a)) return p;
  throw std::bad_alloc();
}

// Arms the failure at the k-th allocation of this thread.
void arm(long k) {
  t_countdown = k;
  t_fired = false;
}
// Disarms; whether the failure was injected.
bool disarm() {
  t_countdown = 0;
  return t_fired;
}

}  // namespace

void* operator new(std::size_t size) { return failing_new(size); }
void* operator new[](std::size_t size) { return failing_new(size); }
void* operator new(std::size_t size, const std::nothrow_t&) noexcept {
  try {
    return failing_new(size);
  } catch (...) {
    return nullptr;
  }
}
void* operator new(std::size_t size, std::align_val_t a) { return failing_aligned_new(size, a); }
void* operator new[](std::size_t size, std::align_val_t a) { return failing_aligned_new(size, a); }
// These pair with failing_new's malloc; see steady_state_test.cpp.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
void operator delete(void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete(void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }
#pragma GCC diagnostic pop

namespace capalloc::detail {
namespace {

TEST_CASE("a pointer table that cannot grow keeps every entry", "[alloc-failure]") {
  BlockTable table;
  std::vector<Block> blocks(3000);
  auto addr = [](std::size_t i) { return std::uintptr_t{0x10000} + i * 512; };
  int failed_growths = 0;
  for (std::size_t i = 0; i < blocks.size(); ++i) {
    arm(1);
    try {
      table.insert(addr(i), &blocks[i]);
      disarm();
    } catch (const std::bad_alloc&) {
      REQUIRE(disarm());
      ++failed_growths;
      CHECK(table.size() == i);
      CHECK(table.find(addr(i)) == nullptr);
      table.insert(addr(i), &blocks[i]);  // unarmed: it grows now
    }
    REQUIRE(table.size() == i + 1);
  }
  CHECK(failed_growths >= 3);  // 3000 entries: several growths
  for (std::size_t i = 0; i < blocks.size(); ++i) CHECK(table.find(addr(i)) == &blocks[i]);
}

SizePolicy test_policy() { return SizePolicy::from(AllocatorOptions{}); }

// Takes every block on the arena's free list, so that its next make()
// allocates a chunk; the caller recycles them.
std::vector<Block*> drain(BlockArena& arena) {
  std::vector<Block*> drained;
  drained.reserve(4096);  // so that only the arena can fail below
  for (;;) {
    arm(1);
    try {
      drained.push_back(arena.make());
      disarm();
    } catch (const std::bad_alloc&) {
      disarm();
      return drained;
    }
  }
}

TEST_CASE("a pool whose split cannot get a block is as it was", "[alloc-failure]") {
  const SizePolicy policy = test_policy();
  BlockArena arena;
  Pool pool(0, kDefaultPool, policy, arena);
  const std::size_t rounded = policy.granularity * 4;
  const std::size_t segment_bytes = policy.segment_bytes_for(rounded);
  std::vector<char> memory(segment_bytes);  // the pool never touches it
  Block* first = pool.take_from_new_segment(memory.data(), segment_bytes, kDefaultStream, rounded,
                                            rounded);
  REQUIRE(first != nullptr);
  // Empty the arena's free list, so that the next split needs a new chunk.
  std::vector<Block*> drained = drain(arena);
  const AllocatorStats before = pool.stats();
  arm(1);
  CHECK_THROWS_AS(pool.take(kDefaultStream, rounded, rounded), std::bad_alloc);
  REQUIRE(disarm());
  CHECK(testing::same_state(before, pool.stats()));
  REQUIRE(pool.check_invariants().ok());
  Block* second = pool.take(kDefaultStream, rounded, rounded);  // unarmed: it splits now
  REQUIRE(second != nullptr);
  CHECK(second->addr == first->addr + rounded);
  REQUIRE(pool.check_invariants().ok());
  for (Block* b : drained) arena.recycle(b);
  pool.give_back(second);
  pool.give_back(first);
  REQUIRE(pool.check_invariants().ok());
  CHECK(pool.stats().allocated_blocks.current == 0);
}

TEST_CASE("a pool that cannot file a new segment is as it was", "[alloc-failure]") {
  const SizePolicy policy = test_policy();
  BlockArena arena;
  Pool pool(0, kDefaultPool, policy, arena);
  const std::size_t rounded = policy.granularity;
  const std::size_t segment_bytes = policy.segment_bytes_for(rounded);
  // The stream's index first, unarmed: it lives in an Abseil hash map (see
  // the file's comment).
  std::vector<char> warm_memory(segment_bytes);
  Block* warm = pool.take_from_new_segment(warm_memory.data(), segment_bytes, kDefaultStream,
                                           rounded, rounded);
  std::vector<char> memory(segment_bytes);
  // One block left on the arena's free list: the segment's first block
  // takes it, and the split's needs a new chunk.
  std::vector<Block*> drained = drain(arena);
  arena.recycle(drained.back());
  drained.pop_back();
  int failures = 0;
  Block* block = nullptr;
  for (long k = 1; block == nullptr; ++k) {
    const AllocatorStats before = pool.stats();
    arm(k);
    try {
      block = pool.take_from_new_segment(memory.data(), segment_bytes, kDefaultStream, rounded,
                                         rounded);
      disarm();
    } catch (const std::bad_alloc&) {
      REQUIRE(disarm());
      ++failures;
      CHECK(testing::same_state(before, pool.stats()));
      CHECK(pool.segments().size() == 1);
      REQUIRE(pool.check_invariants().ok());
    }
  }
  CHECK(failures >= 3);  // the segment, the split's block, room in the segment list
  CHECK(pool.segments().size() == 2);
  for (Block* b : drained) arena.recycle(b);
  pool.give_back(block);
  pool.give_back(warm);
  REQUIRE(pool.check_invariants().ok());
}

}  // namespace
}  // namespace capalloc::detail
