// alloc_failure_test.cpp: the allocator's own structures when the host runs
// out of memory mid-way (std::bad_alloc from their bookkeeping, not the
// device): the pointer table keeps every entry when it cannot grow, and a
// pool whose split cannot get a block, or whose new segment cannot be
// filed, is as it was.
//
// This program replaces the global operator new (replaced_operator_new.hpp)
// with one that throws std::bad_alloc at the k-th allocation of the calling
// thread while armed.
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
#include <utility>
#include <vector>

#include "allocator/allocator_impl.hpp"
#include "allocator/block_table.hpp"
#include "allocator/observation.hpp"
#include "allocator/trace_hooks.hpp"
#include "allocator/pool.hpp"
#include "replaced_operator_new.hpp"
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

// Where the failure is injected (replaced_operator_new.hpp).
void capalloc_test::before_operator_new() {
  if (fail_now()) throw std::bad_alloc();
}

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

// Allocates `bytes` on the default stream, failing the k-th host allocation
// of this thread for k = 1, 2, ... until one succeeds. Each failure must be
// kResourceExhausted and leave the allocator as it was (its stats and
// invariants; the block may come back merged). The pointer it finally gets, and the number of failures.
std::pair<void*, int> allocate_through_failures(Allocator& a, std::size_t bytes) {
  for (long k = 1;; ++k) {
    const AllocatorStats before = *a.stats(0);
    arm(k);
    auto p = a.allocate(bytes, 0, kDefaultStream);
    if (!disarm()) {
      REQUIRE(p.ok());
      return {*p, static_cast<int>(k - 1)};
    }
    INFO("host allocation " << k << " failed");
    REQUIRE_FALSE(p.ok());
    CHECK(p.status().code() == absl::StatusCode::kResourceExhausted);
    // As testing::same_state, but the free block count may drop: a block
    // taken from the quick cache goes back merged with its free neighbours.
    const AllocatorStats after = *a.stats(0);
    AllocatorStats merged = before;
    merged.free_blocks = after.free_blocks;
    CHECK(after.free_blocks <= before.free_blocks);
    CHECK(testing::same_state(merged, after));
    REQUIRE(a.CheckInvariants().ok());
  }
}

// The steady-state path (a block popped from the quick cache) takes room in
// the pointer table before the block: growing the table can fail, and a
// block taken first would then be lost to both the pool and the table.
TEST_CASE("a cached block stays in the pool when the pointer table cannot grow",
          "[alloc-failure][steady-state]") {
  auto a = testing::make_allocator(testing::host_runtime());
  // The table holds 256 slots and grows past half full: 128 live blocks
  // (of another size class) and a cached one the next request takes. The
  // cached block is made first, so that the table never held 129.
  void* cached = *a->allocate(512, 0, kDefaultStream);
  std::vector<void*> held;
  for (int i = 0; i < 127; ++i) held.push_back(*a->allocate(4096, 0, kDefaultStream));
  REQUIRE_OK(a->deallocate(cached));
  held.push_back(*a->allocate(4096, 0, kDefaultStream));
  const auto [p, failures] = allocate_through_failures(*a, 512);
  CHECK(failures >= 1);   // the table's new slots
  CHECK(p == cached);     // the block the failures left in the cache
  REQUIRE_OK(a->deallocate(p));
  for (void* h : held) REQUIRE_OK(a->deallocate(h));
  REQUIRE_OK(a->CheckInvariants());
}

// An observer (the retention audit, the event trace) that throws at its
// next on_allocate once armed, as Observation does when it cannot get host
// memory. (Failing the host allocations of the real Observation is not
// possible here: it interns call sites in an Abseil hash table, which a
// failed rehash corrupts; see the file's comment.)
class ThrowingObserver final : public AllocatorObserver {
 public:
  bool armed = false;
  int allocations = 0;
  int frees = 0;
  const void* refused = nullptr;  // the address of the block it threw for
  void on_allocate(Block& block) override {
    if (armed) {
      armed = false;
      refused = block.ptr();
      throw std::bad_alloc();
    }
    ++allocations;
  }
  void on_free(std::uint64_t) override { ++frees; }
  void on_record_stream(const Block&, StreamHandle) override {}
};

// The observer hears of a block after it was taken and entered in the
// pointer table: if it throws, the block goes back, on the steady-state path
// (an untagged request) and on the general path (a tagged one), for a
// request the block just freed serves (512 bytes) and one it does not
// (1 MiB, split off memory never handed out). The pool's
// counters and peaks are as before, memory never handed out is not taken
// for a double free, and the next request gets the same block.
TEST_CASE("a block goes back to the pool when the observer throws", "[alloc-failure]") {
  auto a = testing::make_allocator(testing::host_runtime());
  ThrowingObserver observer;
  AllocatorAccess::impl(*a).observer = &observer;
  const bool tagged = GENERATE(false, true);
  const bool reused = GENERATE(true, false);
  const std::size_t bytes = reused ? 512 : std::size_t{1} << 20;
  INFO((tagged ? "general path (a tagged request)" : "steady-state path") << ", " << bytes
                                                                          << " bytes");
  // A segment first (kept), so that the request only takes a block: a
  // block just freed (reused), or a split of memory never handed out.
  void* held = *a->allocate(512, 0, kDefaultStream);
  if (reused) REQUIRE_OK(a->deallocate(*a->allocate(512, 0, kDefaultStream)));
  AllocOptions options;
  if (tagged) options.tag = "tagged";
  const AllocatorStats before = *a->stats(0);
  const int observed = observer.allocations;
  observer.armed = true;
  auto failed = a->allocate(bytes, 0, kDefaultStream, options);
  REQUIRE_FALSE(failed.ok());
  CHECK(failed.status().code() == absl::StatusCode::kResourceExhausted);
  CHECK(observer.allocations == observed);
  const AllocatorStats after = *a->stats(0);
  AllocatorStats merged = before;
  merged.free_blocks = after.free_blocks;  // the block may come back merged
  CHECK(testing::same_state(merged, after));
  CHECK(after.allocated_bytes.peak == before.allocated_bytes.peak);
  CHECK(after.requested_bytes.peak == before.requested_bytes.peak);
  CHECK(after.allocated_blocks.peak == before.allocated_blocks.peak);
  REQUIRE_OK(a->CheckInvariants());
  REQUIRE(observer.refused != nullptr);
  if (!reused) {
    const absl::Status never = a->deallocate(const_cast<void*>(observer.refused));
    INFO(never.ToString());
    CHECK(never.code() == absl::StatusCode::kNotFound);
  }
  auto p = a->allocate(bytes, 0, kDefaultStream, options);
  REQUIRE_OK(p);
  CHECK(*p == observer.refused);
  REQUIRE_OK(a->deallocate(*p));
  REQUIRE_OK(a->deallocate(held));
  REQUIRE_OK(a->CheckInvariants());
  AllocatorAccess::impl(*a).observer = nullptr;
}

}  // namespace
}  // namespace capalloc::detail
