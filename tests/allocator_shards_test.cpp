// The stream shards (allocator/stream_shards.hpp): each stream's
// steady-state requests run in a shard of its own, and what a user reads
// must not tell: peaks stay exact, checkpoints still order every later
// block after them, record_stream still holds a free, a destroyed stream's
// blocks can still be freed, and two threads on two streams leave the
// counters and the invariants as one thread would. White-box where it must
// show that the shards served (Allocator::Impl::shards). Shards are made
// only once a second thread uses the allocator (share_with_a_second_thread).
#include <algorithm>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include "allocator/allocator_impl.hpp"
#include "allocator/trace_hooks.hpp"
#include "test_support.hpp"

using namespace capalloc;
using capalloc::testing::host_runtime;
using capalloc::testing::make_allocator;

namespace {

// Allocates `count` blocks of `bytes` on `stream` and frees them: the
// pool's peaks are where the test's requests will stay, so that a shard
// serves them (an allocation that would pass a peak takes the general path,
// which raises it).
void warm(Allocator& a, StreamHandle stream, int count, std::size_t bytes) {
  std::vector<void*> held;
  for (int i = 0; i < count; ++i) held.push_back(*a.allocate(bytes, 0, stream));
  for (void* p : held) REQUIRE_OK(a.deallocate(p));
}

// Shards are made once a second thread uses the allocator: one allocates
// on a stream of its own (a new segment: the general path) and frees.
void share_with_a_second_thread(Allocator& a, DeviceRuntime& rt) {
  std::thread([&] {
    const StreamHandle own = *rt.create_stream(0);
    REQUIRE_OK(a.deallocate(*a.allocate(4096, 0, own)));
  }).join();
}

// Shards of `a` in use, and the blocks their tables hold now.
struct ShardCensus {
  std::size_t in_use = 0;
  std::size_t blocks = 0;
};
ShardCensus census(const Allocator& a) {
  auto& m = detail::AllocatorAccess::impl(a);
  std::lock_guard lock(m.mu);
  ShardCensus c;
  for (const auto& shard : m.shards) {
    c.in_use += shard->in_use ? 1 : 0;
    c.blocks += shard->live.size();
  }
  return c;
}

}  // namespace

TEST_CASE("shards: two streams taking turns keep the peaks and counts exact", "[shards]") {
  auto rt = host_runtime();
  auto alloc = make_allocator(rt);
  share_with_a_second_thread(*alloc, *rt);
  const StreamHandle streams[2] = {*rt->create_stream(0), *rt->create_stream(0)};
  std::mt19937_64 rng(7);
  struct Held {
    void* p;
    std::size_t bytes;
  };
  std::vector<Held> held[2];
  std::int64_t requested = 0, requested_peak = 0, blocks = 0, blocks_peak = 0;
  std::uint64_t allocations = alloc->stats(0)->allocations;  // the second thread's
  std::size_t most_in_shards = 0;
  for (int op = 0; op < 40000; ++op) {
    const int s = static_cast<int>(rng() % 2);
    // Bursts that grow one stream's working set while the other's shrinks,
    // so that each shard's share of the room runs out now and then.
    const bool grow = ((op / 500) % 2 == s) ? rng() % 8 < 6 : rng() % 8 < 2;
    if ((grow && held[s].size() < 200) || held[s].empty()) {
      const std::size_t bytes = 512 + rng() % (64 << 10);
      held[s].push_back({*alloc->allocate(bytes, 0, streams[s]), bytes});
      requested += static_cast<std::int64_t>(bytes);
      ++blocks;
      ++allocations;
      requested_peak = std::max(requested_peak, requested);
      blocks_peak = std::max(blocks_peak, blocks);
    } else {
      const std::size_t k = rng() % held[s].size();
      REQUIRE_OK(alloc->deallocate(held[s][k].p));
      requested -= static_cast<std::int64_t>(held[s][k].bytes);
      --blocks;
      held[s][k] = held[s].back();
      held[s].pop_back();
    }
    if (op % 4000 == 3999) {
      most_in_shards = std::max(most_in_shards, census(*alloc).blocks);
      const AllocatorStats st = *alloc->stats(0);
      CHECK(st.requested_bytes.current == requested);
      CHECK(st.requested_bytes.peak == requested_peak);
      CHECK(st.allocated_blocks.current == blocks);
      CHECK(st.allocated_blocks.peak == blocks_peak);
      REQUIRE_OK(alloc->CheckInvariants());
    }
  }
  // Both streams had shards, and they served: most of the live blocks were
  // in their tables, not the allocator's.
  CHECK(census(*alloc).in_use == 2);
  CHECK(most_in_shards > 100);
  const AllocatorStats st = *alloc->stats(0);
  CHECK(st.requested_bytes.peak == requested_peak);
  CHECK(st.allocated_blocks.peak == blocks_peak);
  CHECK(st.allocations == allocations);
  CHECK(static_cast<std::int64_t>(st.allocations - st.frees) == blocks);
  // The allocated bytes' peak never passes what the blocks' sizes summed
  // to at any moment; at least the requests' peak.
  CHECK(st.allocated_bytes.peak >= requested_peak);
  for (auto& h : held) {
    for (const Held& b : h) REQUIRE_OK(alloc->deallocate(b.p));
  }
  CHECK(alloc->stats(0)->allocated_blocks.current == 0);
  REQUIRE_OK(alloc->CheckInvariants());
}

TEST_CASE("shards: a checkpoint orders every later shard allocation after it", "[shards]") {
  auto rt = host_runtime();
  auto alloc = make_allocator(rt);
  share_with_a_second_thread(*alloc, *rt);
  const StreamHandle stream = *rt->create_stream(0);
  warm(*alloc, stream, 40, 4096);
  std::vector<void*> before;
  for (int i = 0; i < 20; ++i) before.push_back(*alloc->allocate(4096, 0, stream));
  REQUIRE(census(*alloc).blocks > 0);
  const AuditCheckpoint since = alloc->checkpoint();
  std::vector<void*> after;
  for (int i = 0; i < 10; ++i) after.push_back(*alloc->allocate(4096, 0, stream));
  for (void* p : after) CHECK(alloc->block_info(p)->sequence > since.sequence);
  for (void* p : before) CHECK(alloc->block_info(p)->sequence <= since.sequence);
  const LiveSince live = alloc->live_since(since);
  CHECK(live.blocks == after.size());
  for (void* p : before) REQUIRE_OK(alloc->deallocate(p));
  for (void* p : after) REQUIRE_OK(alloc->deallocate(p));
  CHECK(alloc->live_since(since).blocks == 0);
  REQUIRE_OK(alloc->CheckInvariants());
}

TEST_CASE("shards: a block recorded on another stream waits for it, whichever table holds it",
          "[shards]") {
  auto rt = host_runtime();
  auto alloc = make_allocator(rt);
  share_with_a_second_thread(*alloc, *rt);
  const StreamHandle owner = *rt->create_stream(0);
  const StreamHandle reader = *rt->create_stream(0);
  warm(*alloc, owner, 4, 4096);
  void* p = *alloc->allocate(4096, 0, owner);
  REQUIRE(census(*alloc).blocks == 1);  // handed out by the shard
  // Work on the reader stream that has not run yet: the free must wait.
  std::atomic<bool> release{false};
  KernelLaunch k;
  k.name = "held_reader";
  k.reads = {{p, 4096}};
  k.host_body = [&release] {
    while (!release.load()) std::this_thread::yield();
  };
  REQUIRE_OK(rt->launch_kernel(reader, k));
  REQUIRE_OK(alloc->record_stream(p, reader));
  REQUIRE_OK(alloc->deallocate(p));
  CHECK(alloc->stats(0)->pending_free_blocks == 1);
  for (int i = 0; i < 8; ++i) {
    void* q = *alloc->allocate(4096, 0, owner);
    CHECK(q != p);  // never while the reader may still read it
    REQUIRE_OK(alloc->deallocate(q));
  }
  release.store(true);
  REQUIRE_OK(rt->synchronize_stream(reader));
  REQUIRE_OK(alloc->deallocate(*alloc->allocate(4096, 0, owner)));  // polls the event
  CHECK(alloc->stats(0)->pending_free_blocks == 0);
  REQUIRE_OK(alloc->CheckInvariants());
}

TEST_CASE("shards: a destroyed stream's blocks are freed after it, its handle served anew",
          "[shards]") {
  auto rt = host_runtime();
  auto alloc = make_allocator(rt);
  share_with_a_second_thread(*alloc, *rt);
  const StreamHandle stream = *rt->create_stream(0);
  warm(*alloc, stream, 40, 8192);
  std::vector<void*> held;
  for (int i = 0; i < 30; ++i) held.push_back(*alloc->allocate(8192, 0, stream));
  REQUIRE(census(*alloc).blocks > 0);
  REQUIRE_OK(rt->destroy_stream(stream));
  // Any call under the allocator's lock applies the report.
  REQUIRE_OK(alloc->deallocate(*alloc->allocate(64, 0, kDefaultStream)));
  CHECK(alloc->allocate(4096, 0, stream).status().code() == absl::StatusCode::kInvalidArgument);
  REQUIRE_OK(alloc->CheckInvariants());
  for (void* p : held) REQUIRE_OK(alloc->deallocate(p));
  // Each was freed once: a second free is refused and changes nothing.
  const AllocatorStats before = *alloc->stats(0);
  CHECK_FALSE(alloc->deallocate(held.front()).ok());
  CHECK(capalloc::testing::same_state(before, *alloc->stats(0)));
  const StreamHandle next = *rt->create_stream(0);
  for (int i = 0; i < 30; ++i) REQUIRE_OK(alloc->deallocate(*alloc->allocate(8192, 0, next)));
  CHECK(alloc->stats(0)->allocated_blocks.current == 0);
  REQUIRE_OK(alloc->CheckInvariants());
  REQUIRE_OK(rt->destroy_stream(next));
}

TEST_CASE("shards: a free naming the wrong device, or twice, is refused and changes nothing",
          "[shards]") {
  auto rt = host_runtime(std::size_t{16} << 30, 2);
  auto alloc = make_allocator(rt);
  share_with_a_second_thread(*alloc, *rt);
  const StreamHandle stream = *rt->create_stream(0);
  warm(*alloc, stream, 4, 4096);
  void* p = *alloc->allocate(4096, 0, stream);
  REQUIRE(census(*alloc).blocks == 1);
  const AllocatorStats before = *alloc->stats(0);
  CHECK(alloc->deallocate(p, 1).code() == absl::StatusCode::kInvalidArgument);
  CHECK(capalloc::testing::same_state(before, *alloc->stats(0)));
  CHECK(census(*alloc).blocks == 1);  // still the shard's: a refused free moves nothing
  REQUIRE_OK(alloc->deallocate(p, 0));
  CHECK_FALSE(alloc->deallocate(p).ok());
  REQUIRE_OK(alloc->CheckInvariants());
}

TEST_CASE("shards: two threads on two streams, frees across threads, a reader of the stats",
          "[shards][threads]") {
  auto rt = host_runtime();
  auto alloc = make_allocator(rt);
  share_with_a_second_thread(*alloc, *rt);
  const StreamHandle streams[2] = {*rt->create_stream(0), *rt->create_stream(0)};
  constexpr int kOps = 20000;
  std::mutex handoff_mu;
  std::vector<void*> handoff;  // blocks thread 0 leaves for thread 1 to free
  std::atomic<bool> done{false};
  std::atomic<int> failures{0};
  auto worker = [&](int t) {
    std::mt19937_64 rng(static_cast<std::uint64_t>(t) + 1);
    std::vector<void*> held;
    for (int op = 0; op < kOps; ++op) {
      if (held.size() < 64 && (held.empty() || rng() % 2 == 0)) {
        auto p = alloc->allocate(512 + rng() % (64 << 10), 0, streams[t]);
        if (!p.ok()) {
          ++failures;
          continue;
        }
        held.push_back(*p);
      } else {
        const std::size_t k = rng() % held.size();
        void* p = held[k];
        held[k] = held.back();
        held.pop_back();
        if (t == 0 && rng() % 16 == 0) {
          std::lock_guard lock(handoff_mu);
          handoff.push_back(p);
          continue;
        }
        if (!alloc->deallocate(p).ok()) ++failures;
      }
      if (t == 1 && op % 64 == 0) {
        std::vector<void*> theirs;
        {
          std::lock_guard lock(handoff_mu);
          theirs.swap(handoff);
        }
        for (void* p : theirs) {
          if (!alloc->deallocate(p).ok()) ++failures;
        }
      }
    }
    for (void* p : held) {
      if (!alloc->deallocate(p).ok()) ++failures;
    }
  };
  std::thread reader([&] {
    while (!done.load()) {
      auto st = alloc->stats(0);
      if (!st.ok() || st->allocated_blocks.current > st->allocated_blocks.peak ||
          st->requested_bytes.current > st->requested_bytes.peak) {
        ++failures;
      }
      if (!alloc->CheckInvariants().ok()) ++failures;
      std::this_thread::yield();
    }
  });
  std::thread t0(worker, 0), t1(worker, 1);
  t0.join();
  t1.join();
  done.store(true);
  reader.join();
  for (void* p : handoff) REQUIRE_OK(alloc->deallocate(p));
  CHECK(failures.load() == 0);
  const AllocatorStats st = *alloc->stats(0);
  CHECK(st.allocated_blocks.current == 0);
  CHECK(st.requested_bytes.current == 0);
  CHECK(st.allocations == st.frees);
  REQUIRE_OK(alloc->CheckInvariants());
}
