// graph_pool_lifetime_test.cpp: when a graph pool goes back to the runtime
// (DESIGN.md section 5), on the host runtime: an invalidated capture's pool
// once its last block is freed; a private pool once its graph is destroyed
// and its blocks freed, in either order; a pool whose graph was launched
// into another capture only once the runtime no longer holds the graph's
// nodes; a pool left without references during a capture only after it;
// and the device's counters across the release. Split out of
// capture_lifecycle_test.cpp; graph_in_capture_test.cpp has the nested
// launches. Each test checks the stats and CheckInvariants, not only the
// status codes: a pool released too early is a wild write on a device.
#include <string>
#include <vector>

#include "capture_test_support.hpp"
#include "tools/scenarios/kernels.hpp"

using namespace capalloc;
using namespace capalloc::testing;
using capalloc::scenarios::fill_kernel;

namespace {

constexpr std::size_t N = 4096;  // floats per tensor: 16 KiB, a small-segment request

// A graph captured into a private pool that fills a block it allocated,
// the block then freed: the pool holds only free memory the graph writes.
struct PrivateGraph {
  GraphHandle graph = 0;
  PoolHandle pool = kDefaultPool;
};
PrivateGraph capture_private_graph(World& w) {
  float* b = nullptr;
  const CaptureResult g = w.capture(kDefaultPool, "private", [&] {
    b = w.tensor(N, w.side, "B");
    w.launch(w.side, fill_kernel(b, N, 1.0f));
  });
  const PoolHandle pool = w.alloc->block_info(b)->pool;
  w.free(b);
  return {g.graph, pool};
}

}  // namespace

TEST_CASE("an invalidated capture's private pool goes away with its last block",
          "[capture][abort]") {
  World w;
  REQUIRE_OK(w.tracker->begin_capture(0, w.side, {.label = "aborted"}));
  float* t = w.tensor(N, w.side, "T");
  CHECK_FALSE(w.rt->synchronize_stream(w.side).ok());
  CHECK_FALSE(w.tracker->end_capture(w.side).ok());
  const PoolHandle pool = w.alloc->block_info(t)->pool;
  REQUIRE(pool != kDefaultPool);
  CHECK(w.alloc->pool_stats(pool)->allocated_blocks.current == 1);
  const std::int64_t reserved_before = w.reserved();
  w.free(t);
  CHECK_FALSE(w.pool_exists(pool));
  CHECK(w.reserved() < reserved_before);
  REQUIRE_OK(w.alloc->CheckInvariants());
}

TEST_CASE("a private graph pool is released once its graph is destroyed and its blocks freed",
          "[capture][pool-lifetime]") {
  World w;
  float* b = nullptr;
  const CaptureResult g = w.capture(kDefaultPool, "private", [&] {
    b = w.tensor(N, w.side, "B");
    w.launch(w.side, fill_kernel(b, N, 1.0f));
  });
  CHECK(g.new_findings.empty());
  const PoolHandle pool = w.alloc->block_info(b)->pool;
  REQUIRE(pool != kDefaultPool);
  CHECK(w.tracker->write_record(g.graph)->pool == pool);
  const std::int64_t pool_reserved = w.alloc->pool_stats(pool)->reserved_bytes.current;
  const std::int64_t reserved_before = w.reserved();
  REQUIRE(pool_reserved > 0);

  SECTION("graph destroyed first") {
    REQUIRE_OK(w.tracker->destroy_graph(g.graph));
    CHECK(w.tracker->write_record(g.graph).status().code() == absl::StatusCode::kNotFound);
    REQUIRE(w.pool_exists(pool));  // B is live
    CHECK(w.alloc->pool_stats(pool)->allocated_blocks.current == 1);
    CHECK(w.reserved() == reserved_before);
    w.free(b);
    CHECK_FALSE(w.pool_exists(pool));
    CHECK(w.reserved() == reserved_before - pool_reserved);
  }
  SECTION("block freed first") {
    w.free(b);
    REQUIRE(w.pool_exists(pool));  // the graph may replay into it
    CHECK(w.alloc->pool_stats(pool)->allocated_blocks.current == 0);
    // Not even empty_cache hands a segment a live graph writes back to the device.
    REQUIRE_OK(w.alloc->empty_cache(0));
    CHECK(w.reserved() == reserved_before);
    REQUIRE_OK(w.tracker->destroy_graph(g.graph));
    CHECK_FALSE(w.pool_exists(pool));
    CHECK(w.reserved() == reserved_before - pool_reserved);
  }
  REQUIRE_OK(w.alloc->CheckInvariants());
}

// Found by the C ABI fuzzer in CI (scripts/fuzz.sh on 0b299cb): a graph
// replayed into a stream that was capturing became part of that capture's
// graph; destroying the first graph's handle released its private pool at
// once, and the outer graph's replay then wrote unmapped memory (a SEGV on
// the host runtime, a wild write on a device). The pool now stays while the
// runtime still holds the graph's nodes.
TEST_CASE("a graph launched into another capture keeps its pool after its handle is destroyed",
          "[capture][pool-lifetime][fuzz]") {
  World w;
  float* scratch = nullptr;
  PoolHandle pool = kDefaultPool;
  const CaptureResult inner = w.capture(kDefaultPool, "inner", [&] {
    scratch = w.tensor(N, w.side, "scratch");
    pool = w.alloc->block_info(scratch)->pool;
    w.launch(w.side, fill_floats(scratch, N, 7.0f));
    w.free(scratch);  // the graph's scratch: free in its pool after the capture
  });
  REQUIRE(pool != kDefaultPool);
  const std::int64_t pool_reserved = w.alloc->pool_stats(pool)->reserved_bytes.current;
  const std::int64_t reserved_before = w.reserved();
  REQUIRE(pool_reserved > 0);
  const StreamHandle outer = w.stream();

  // The outer graph's replay writes the inner graph's scratch: it must still
  // be the inner pool's memory, mapped and handed to nobody else.
  auto replay_outer = [&](GraphHandle g) {
    REQUIRE_OK(w.rt->launch_graph(g, kDefaultStream));
    REQUIRE_OK(w.rt->synchronize_stream(kDefaultStream));
    CHECK(w.read(scratch, 1)[0] == 7.0f);
  };
  SECTION("into a capture begun on the runtime, which capalloc never sees") {
    REQUIRE_OK(w.rt->begin_capture(outer, CaptureMode::kGlobal));
    REQUIRE_OK(w.tracker->replay(inner.graph, outer));
    auto outer_graph = w.rt->end_capture(outer);
    REQUIRE_OK(outer_graph);
    REQUIRE_OK(w.tracker->destroy_graph(inner.graph));
    REQUIRE_OK(w.alloc->empty_cache(0));
    CHECK(w.pool_exists(pool));
    CHECK(w.reserved() == reserved_before);
    replay_outer(*outer_graph);
    REQUIRE_OK(w.alloc->CheckInvariants());
    REQUIRE_OK(w.rt->destroy_graph(*outer_graph));
  }
  SECTION("into a capture begun through the tracker, ended after the destroy") {
    REQUIRE_OK(w.tracker->begin_capture(0, outer, {.label = "outer"}));
    REQUIRE_OK(w.tracker->replay(inner.graph, outer));
    REQUIRE_OK(w.tracker->destroy_graph(inner.graph));
    CHECK(w.pool_exists(pool));
    CHECK(w.reserved() == reserved_before);
    auto ended = w.tracker->end_capture(outer);
    REQUIRE_OK(ended);
    REQUIRE_OK(w.alloc->empty_cache(0));
    CHECK(w.pool_exists(pool));
    CHECK(w.reserved() == reserved_before);
    replay_outer(ended->graph);
    REQUIRE_OK(w.alloc->CheckInvariants());
    REQUIRE_OK(w.tracker->destroy_graph(ended->graph));
  }
  // Once the outer graph is gone, so is the inner pool.
  REQUIRE_OK(w.alloc->empty_cache(0));
  CHECK_FALSE(w.pool_exists(pool));
  CHECK(w.reserved() <= reserved_before - pool_reserved);
  REQUIRE_OK(w.alloc->CheckInvariants());
}

// Freeing device memory during a capture is illegal on CUDA, and a graph
// launched into the capture may write what would be freed: a pool that
// loses its last reference while a capture is routed on its device keeps
// its segments until empty_cache after the capture.
TEST_CASE("a graph pool left without references during a capture goes only after it",
          "[capture][pool-lifetime]") {
  World w;
  const auto [graph, pool] = capture_private_graph(w);
  const std::int64_t reserved_before = w.reserved();
  const StreamHandle other = w.stream();
  REQUIRE_OK(w.tracker->begin_capture(0, other, {.label = "during"}));
  float* during = w.tensor(N, other, "during");  // the capture is routed
  REQUIRE_OK(w.tracker->destroy_graph(graph));
  CHECK(w.pool_exists(pool));
  CHECK(w.reserved() >= reserved_before);
  REQUIRE_OK(w.alloc->CheckInvariants());
  w.free(during);
  auto ended = w.tracker->end_capture(other);
  REQUIRE_OK(ended);
  CHECK(w.pool_exists(pool));
  REQUIRE_OK(w.alloc->empty_cache(0));
  CHECK_FALSE(w.pool_exists(pool));
  REQUIRE_OK(w.tracker->destroy_graph(ended->graph));
  REQUIRE_OK(w.alloc->CheckInvariants());
}

// Found by `capalloc stress` (seed 1): the device's cumulative counters lost
// a destroyed graph pool's allocations and frees, so they went back.
TEST_CASE("a device's allocation and free counts survive the release of a graph pool",
          "[capture][pool-lifetime]") {
  World w;
  const auto [graph, pool] = capture_private_graph(w);
  const AllocatorStats before = *w.alloc->stats(0);
  CHECK(before.allocations >= 1);
  CHECK(before.frees >= 1);
  REQUIRE_OK(w.tracker->destroy_graph(graph));
  REQUIRE_FALSE(w.pool_exists(pool));
  const AllocatorStats after = *w.alloc->stats(0);
  CHECK(after.allocations == before.allocations);
  CHECK(after.frees == before.frees);
  CHECK(after.ooms == before.ooms);
  CHECK(after.allocated_bytes.peak == before.allocated_bytes.peak);
  CHECK(after.allocated_bytes.current == before.allocated_bytes.current);
  REQUIRE_OK(w.alloc->CheckInvariants());
}
