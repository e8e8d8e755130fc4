// A graph pool's orphans (a destroyed stream's segments, docs/design.md
// "Stream lifetimes"), which no capture adopts: when empty_cache gives them
// back from a pool that is still referenced. Cases from two reviews of
// 2026-12-07; the rest of the orphan cases are in stream_orphans_test.cpp.
#include <cstring>
#include <memory>

#include "capalloc/allocator.hpp"
#include "capalloc/capture.hpp"
#include "test_support.hpp"

using namespace capalloc;
using capalloc::testing::host_runtime;
using capalloc::testing::make_allocator;
using capalloc::testing::overlaps;

namespace {
constexpr std::size_t MiB = std::size_t{1} << 20;
}  // namespace

// A second review (helper-52, 2026-12-07): a graph pool held by its handle
// alone, captured into on short-lived streams, kept each dead stream's
// segments for good (no capture adopts a graph pool's orphans, and
// empty_cache released only unreferenced pools): 8 MiB more per stream.
TEST_CASE("orphans: a pool held by its handle alone gives its orphans back on empty_cache",
          "[orphan][graph_pool]") {
  auto rt = host_runtime();
  auto alloc = make_allocator(rt);
  auto tracker = *CaptureTracker::create(*alloc);
  const PoolHandle pool = *alloc->create_graph_pool(0);
  const StreamHandle live = *rt->create_stream(0);
  // One capture of an 8 MiB scratch block into the pool; returns its graph.
  auto capture_once = [&](StreamHandle s) {
    REQUIRE_OK(tracker->begin_capture(0, s, {.pool = pool}));
    auto p = alloc->allocate(8 * MiB, 0, s);
    REQUIRE_OK(p);
    REQUIRE_OK(alloc->deallocate(*p));
    auto g = tracker->end_capture(s);
    REQUIRE_OK(g);
    return g->graph;
  };
  auto cycle = [&](StreamHandle s) { REQUIRE_OK(tracker->destroy_graph(capture_once(s))); };
  for (int i = 0; i < 3; ++i) cycle(live);
  const std::int64_t on_live = alloc->pool_stats(pool)->reserved_bytes.current;
  CHECK(on_live == std::int64_t(8 * MiB));  // one segment, reused by each capture
  for (int i = 0; i < 5; ++i) {
    const StreamHandle s = *rt->create_stream(0);
    cycle(s);
    REQUIRE_OK(rt->destroy_stream(s));
    REQUIRE_OK(alloc->empty_cache());
    REQUIRE_OK(alloc->CheckInvariants());
    // The live stream's free segment stays for the pool's next capture.
    CHECK(alloc->pool_stats(pool)->reserved_bytes.current == on_live);
  }
  // While a graph may replay into the pool, its orphans stay.
  const StreamHandle s = *rt->create_stream(0);
  const GraphHandle graph = capture_once(s);
  REQUIRE_OK(rt->destroy_stream(s));
  REQUIRE_OK(alloc->empty_cache());
  CHECK(alloc->pool_stats(pool)->reserved_bytes.current == on_live + std::int64_t(8 * MiB));
  REQUIRE_OK(tracker->destroy_graph(graph));
  REQUIRE_OK(alloc->empty_cache());
  CHECK(alloc->pool_stats(pool)->reserved_bytes.current == on_live);
  REQUIRE_OK(alloc->release_graph_pool(pool));
  REQUIRE_OK(alloc->empty_cache());
  CHECK(alloc->stats(0)->reserved_bytes.current == 0);
}

// A fourth review (helper-53, 2026-12-07) of the case above: without a
// tracker nothing holds the pool for a graph (a caller's handle stands for
// it, as PyTorch's pool handles do), and the first version gave the orphan
// back: the next allocation got it, and the graph's replay wrote over it.
TEST_CASE("orphans: without a tracker a pool held by its handle keeps its orphans",
          "[orphan][graph_pool]") {
  auto rt = host_runtime();
  auto alloc = make_allocator(rt);
  const PoolHandle pool = *alloc->create_graph_pool(0);
  const StreamHandle s = *rt->create_stream(0);
  const StreamHandle live = *rt->create_stream(0);
  auto id = rt->begin_capture(s, CaptureMode::kGlobal);
  REQUIRE_OK(id);
  REQUIRE_OK(alloc->begin_allocate_to_pool(0, *id, pool, s));
  auto p = alloc->allocate(8 * MiB, 0, s);
  REQUIRE_OK(p);
  void* const scratch = *p;
  KernelLaunch k;
  k.name = "graph_write";
  k.writes = {MemorySpan{scratch, 8 * MiB}};
  k.host_body = [scratch] { std::memset(scratch, 0x22, 4096); };
  REQUIRE_OK(rt->launch_kernel(s, std::move(k)));
  REQUIRE_OK(alloc->deallocate(scratch));
  auto g = rt->end_capture(s);
  REQUIRE_OK(g);
  REQUIRE_OK(alloc->end_allocate_to_pool(*id));
  REQUIRE_OK(rt->destroy_stream(s));
  REQUIRE_OK(alloc->empty_cache());
  REQUIRE_OK(alloc->CheckInvariants());
  CHECK(alloc->pool_stats(pool)->reserved_bytes.current == std::int64_t(8 * MiB));
  // Another user's 8 MiB gets other memory, which the replay leaves alone.
  auto q = alloc->allocate(8 * MiB, 0, live);
  REQUIRE_OK(q);
  CHECK_FALSE(overlaps(*q, 8 * MiB, scratch, 8 * MiB));
  std::memset(*q, 0x11, 4096);
  REQUIRE_OK(rt->launch_graph(*g, live));
  REQUIRE_OK(rt->synchronize_stream(live));
  CHECK(static_cast<unsigned char*>(*q)[0] == 0x11);
  REQUIRE_OK(alloc->deallocate(*q));
  REQUIRE_OK(rt->destroy_graph(*g));
  REQUIRE_OK(alloc->release_graph_pool(pool));
  REQUIRE_OK(alloc->empty_cache());
  CHECK(alloc->stats(0)->reserved_bytes.current == 0);
}
