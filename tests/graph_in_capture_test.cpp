// graph_in_capture_test.cpp: graphs launched into other captures, and the
// lifetime of their pools (found by the C ABI fuzzer in CI of 0b299cb; see
// capture_lifecycle_test.cpp for the first case). A graph's pool outlives
// its handle while the runtime still holds the graph's nodes (an outer graph,
// a replay in flight), and goes, every byte, once nothing does. Written as
// an adversarial review of the fix: nested launches, one graph in two
// captures, failed outer captures, destroys through the runtime, the tracker
// gone first, shared pools, graphs that allocate nothing, threads.
#include <atomic>
#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "capture_test_support.hpp"

using namespace capalloc;
using namespace capalloc::testing;

namespace {

constexpr std::size_t N = 4096;  // 16 KiB

struct Scratch {
  GraphHandle graph = 0;
  float* p = nullptr;
  PoolHandle pool = kDefaultPool;
};

// A capture on w.side that allocates a scratch tensor, fills it with
// `value` and frees it inside the capture (the graph's private scratch);
// `extra` runs inside the capture too (e.g. a replay of another graph).
Scratch capture_scratch(World& w, const std::string& label, float value,
                        PoolHandle pool = kDefaultPool,
                        const std::function<void()>& extra = nullptr) {
  Scratch s;
  const CaptureResult r = w.capture(pool, label, [&] {
    s.p = w.tensor(N, w.side, label);
    s.pool = w.alloc->block_info(s.p)->pool;
    w.launch(w.side, fill_floats(s.p, N, value));
    if (extra) extra();
    w.free(s.p);
  });
  s.graph = r.graph;
  return s;
}

// Zeroes p (free pool memory; the host runtime maps it) so that a read after
// a replay shows the replay wrote it.
void zero(World& w, float* p) {
  REQUIRE_OK(w.rt->memset_async(p, 0, N * sizeof(float), kDefaultStream));
  REQUIRE_OK(w.rt->synchronize_stream(kDefaultStream));
}

void replay_native(World& w, GraphHandle g) {
  REQUIRE_OK(w.rt->launch_graph(g, kDefaultStream));
  REQUIRE_OK(w.rt->synchronize_stream(kDefaultStream));
}

// Replays `g` natively after zeroing `p`: `value` in p then shows that the
// replay wrote it, into memory its pool still held.
void expect_native_replay_writes(World& w, GraphHandle g, float* p, float value) {
  zero(w, p);
  replay_native(w, g);
  const std::vector<float> got = w.read(p, N);
  CHECK(got[0] == value);
  CHECK(got[N - 1] == value);
}

// Everything destroyed: two empty_caches give every byte back.
void expect_no_leak(World& w, std::int64_t baseline) {
  REQUIRE_OK(w.alloc->empty_cache(0));
  REQUIRE_OK(w.alloc->empty_cache(0));
  CHECK(w.reserved() == baseline);
  REQUIRE_OK(w.alloc->CheckInvariants());
}

// Everything destroyed: every byte back, and `pool` gone with it.
void expect_pool_gone(World& w, std::int64_t baseline, PoolHandle pool) {
  expect_no_leak(w, baseline);
  CHECK_FALSE(w.pool_exists(pool));
}

}  // namespace

TEST_CASE("graph in capture: nested launches A into B into C, destroyed in various orders",
          "[graph-in-capture][pool-lifetime]") {
  World w;
  const std::int64_t baseline = w.reserved();
  const Scratch a = capture_scratch(w, "A", 7.0f);
  const Scratch b =
      capture_scratch(w, "B", 8.0f, kDefaultPool, [&] { REQUIRE_OK(w.tracker->replay(a.graph, w.side)); });
  REQUIRE(a.pool != b.pool);
  const bool tracker_outer = GENERATE(false, true);
  INFO("outer C begun " << (tracker_outer ? "through the tracker" : "on the runtime"));
  GraphHandle c = 0;
  const StreamHandle outer = w.stream();
  if (tracker_outer) {
    REQUIRE_OK(w.tracker->begin_capture(0, outer, {.label = "C"}));
    REQUIRE_OK(w.tracker->replay(b.graph, outer));
    auto ended = w.tracker->end_capture(outer);
    REQUIRE_OK(ended);
    c = ended->graph;
  } else {
    REQUIRE_OK(w.rt->begin_capture(outer, CaptureMode::kGlobal));
    REQUIRE_OK(w.tracker->replay(b.graph, outer));
    auto ended = w.rt->end_capture(outer);
    REQUIRE_OK(ended);
    c = *ended;
  }
  auto destroy_c = [&] {
    if (tracker_outer) {
      REQUIRE_OK(w.tracker->destroy_graph(c));
    } else {
      REQUIRE_OK(w.rt->destroy_graph(c));
    }
  };
  auto check_c = [&] {
    zero(w, a.p);
    zero(w, b.p);
    replay_native(w, c);
    CHECK(w.read(a.p, N)[N - 1] == 7.0f);
    CHECK(w.read(b.p, N)[N - 1] == 8.0f);
  };
  SECTION("A, then B, then C") {
    REQUIRE_OK(w.tracker->destroy_graph(a.graph));
    REQUIRE_OK(w.alloc->empty_cache(0));
    CHECK(w.pool_exists(a.pool));
    REQUIRE_OK(w.tracker->destroy_graph(b.graph));
    REQUIRE_OK(w.alloc->empty_cache(0));
    REQUIRE(w.pool_exists(a.pool));
    REQUIRE(w.pool_exists(b.pool));
    check_c();
    REQUIRE_OK(w.alloc->CheckInvariants());
    destroy_c();
  }
  SECTION("B, then A, then C") {
    REQUIRE_OK(w.tracker->destroy_graph(b.graph));
    REQUIRE_OK(w.tracker->destroy_graph(a.graph));
    REQUIRE_OK(w.alloc->empty_cache(0));
    REQUIRE(w.pool_exists(a.pool));
    REQUIRE(w.pool_exists(b.pool));
    check_c();
    destroy_c();
  }
  SECTION("C first: A and B still replay on their own") {
    destroy_c();
    REQUIRE_OK(w.alloc->empty_cache(0));
    REQUIRE(w.pool_exists(a.pool));
    REQUIRE(w.pool_exists(b.pool));
    zero(w, a.p);
    zero(w, b.p);
    w.replay(b.graph);
    CHECK(w.read(a.p, N)[0] == 7.0f);
    CHECK(w.read(b.p, N)[0] == 8.0f);
    REQUIRE_OK(w.tracker->destroy_graph(a.graph));
    REQUIRE_OK(w.alloc->empty_cache(0));
    REQUIRE(w.pool_exists(a.pool));  // B holds A's nodes
    zero(w, a.p);
    w.replay(b.graph);
    CHECK(w.read(a.p, N)[0] == 7.0f);
    REQUIRE_OK(w.tracker->destroy_graph(b.graph));
  }
  expect_pool_gone(w, baseline, a.pool);
  CHECK_FALSE(w.pool_exists(b.pool));
}

TEST_CASE("graph in capture: the same graph launched into two captures", "[graph-in-capture][pool-lifetime]") {
  World w;
  const std::int64_t baseline = w.reserved();
  const Scratch a = capture_scratch(w, "A", 7.0f);
  const StreamHandle s1 = w.stream();
  const StreamHandle s2 = w.stream();
  REQUIRE_OK(w.rt->begin_capture(s1, CaptureMode::kGlobal));
  REQUIRE_OK(w.tracker->replay(a.graph, s1));
  auto c1 = w.rt->end_capture(s1);
  REQUIRE_OK(c1);
  REQUIRE_OK(w.tracker->begin_capture(0, s2, {.label = "C2"}));
  REQUIRE_OK(w.tracker->replay(a.graph, s2));
  auto c2 = w.tracker->end_capture(s2);
  REQUIRE_OK(c2);
  REQUIRE_OK(w.tracker->destroy_graph(a.graph));
  REQUIRE_OK(w.alloc->empty_cache(0));
  REQUIRE(w.pool_exists(a.pool));
  SECTION("native outer destroyed first") {
    REQUIRE_OK(w.rt->destroy_graph(*c1));
    REQUIRE_OK(w.alloc->empty_cache(0));
    REQUIRE(w.pool_exists(a.pool));
    expect_native_replay_writes(w, c2->graph, a.p, 7.0f);
    REQUIRE_OK(w.tracker->destroy_graph(c2->graph));
  }
  SECTION("tracked outer destroyed first") {
    REQUIRE_OK(w.tracker->destroy_graph(c2->graph));
    REQUIRE_OK(w.alloc->empty_cache(0));
    REQUIRE(w.pool_exists(a.pool));
    expect_native_replay_writes(w, *c1, a.p, 7.0f);
    REQUIRE_OK(w.rt->destroy_graph(*c1));
  }
  expect_pool_gone(w, baseline, a.pool);
}

TEST_CASE("graph in capture: an outer capture invalidated after a graph was launched into it",
          "[graph-in-capture][pool-lifetime]") {
  World w;
  const std::int64_t baseline = w.reserved();
  const Scratch a = capture_scratch(w, "A", 7.0f);
  const StreamHandle outer = w.stream();
  SECTION("tracker outer, A destroyed before the failed end") {
    REQUIRE_OK(w.tracker->begin_capture(0, outer, {.label = "C"}));
    float* own = w.tensor(N, outer, "own");  // the outer capture is routed and watched
    REQUIRE_OK(w.tracker->replay(a.graph, outer));
    CHECK_FALSE(w.rt->synchronize_stream(outer).ok());  // invalidates
    REQUIRE_OK(w.tracker->destroy_graph(a.graph));
    CHECK(w.pool_exists(a.pool));
    w.free(own);
    CHECK_FALSE(w.tracker->end_capture(outer).ok());
  }
  SECTION("native outer, A destroyed before the failed end") {
    REQUIRE_OK(w.rt->begin_capture(outer, CaptureMode::kGlobal));
    REQUIRE_OK(w.tracker->replay(a.graph, outer));
    CHECK_FALSE(w.rt->synchronize_stream(outer).ok());
    REQUIRE_OK(w.tracker->destroy_graph(a.graph));
    CHECK(w.pool_exists(a.pool));
    CHECK_FALSE(w.rt->end_capture(outer).ok());
  }
  SECTION("tracker outer, A destroyed after the failed end") {
    REQUIRE_OK(w.tracker->begin_capture(0, outer, {.label = "C"}));
    REQUIRE_OK(w.tracker->replay(a.graph, outer));
    CHECK_FALSE(w.rt->synchronize_stream(outer).ok());
    CHECK_FALSE(w.tracker->end_capture(outer).ok());
    zero(w, a.p);
    w.replay(a.graph);  // A itself is fine
    CHECK(w.read(a.p, N)[0] == 7.0f);
    REQUIRE_OK(w.tracker->destroy_graph(a.graph));
  }
  expect_pool_gone(w, baseline, a.pool);
}

TEST_CASE("graph in capture: a tracker-captured outer graph destroyed through the runtime",
          "[graph-in-capture][pool-lifetime]") {
  World w;
  const std::int64_t baseline = w.reserved();
  const Scratch a = capture_scratch(w, "A", 7.0f);
  const StreamHandle outer = w.stream();
  const bool outer_allocates = GENERATE(true, false);
  const bool tracker_call_before_empty = GENERATE(true, false);
  INFO("outer allocates: " << outer_allocates
                           << "; a tracker call before empty_cache: " << tracker_call_before_empty);
  REQUIRE_OK(w.tracker->begin_capture(0, outer, {.label = "C"}));
  if (outer_allocates) {
    float* own = w.tensor(N, outer, "own");
    w.launch(outer, fill_floats(own, N, 3.0f));
    w.free(own);
  }
  REQUIRE_OK(w.tracker->replay(a.graph, outer));
  auto c = w.tracker->end_capture(outer);
  REQUIRE_OK(c);
  REQUIRE_OK(w.tracker->destroy_graph(a.graph));
  REQUIRE(w.pool_exists(a.pool));
  expect_native_replay_writes(w, c->graph, a.p, 7.0f);
  REQUIRE_OK(w.rt->destroy_graph(c->graph));  // bypassing the tracker
  if (tracker_call_before_empty) (void)w.tracker->check();
  expect_pool_gone(w, baseline, a.pool);
}

TEST_CASE("graph in capture: destroying a graph while its replay is in flight keeps its pool",
          "[graph-in-capture][pool-lifetime]") {
  World w;
  const std::int64_t baseline = w.reserved();
  std::atomic<bool> go{false};
  std::atomic<bool> started{false};
  Scratch s;
  const CaptureResult r = w.capture(kDefaultPool, "slow", [&] {
    s.p = w.tensor(N, w.side, "slow");
    s.pool = w.alloc->block_info(s.p)->pool;
    KernelLaunch k;
    k.name = "wait";
    k.writes = {{s.p, N * sizeof(float)}};
    float* p = s.p;
    k.host_body = [&started, &go, p] {
      started = true;
      while (!go.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      for (std::size_t i = 0; i < N; ++i) p[i] = 5.0f;
    };
    w.launch(w.side, std::move(k));
    w.free(s.p);
  });
  const StreamHandle run = w.stream();
  REQUIRE_OK(w.tracker->replay(r.graph, run));
  while (!started.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  // Safety net: a wrong release would wait for the stream (host release
  // waits for queued work) and deadlock without it.
  std::thread release([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    go = true;
  });
  REQUIRE_OK(w.tracker->destroy_graph(r.graph));
  const bool kept_during = !go.load() && w.pool_exists(s.pool);
  release.join();
  REQUIRE_OK(w.rt->synchronize_stream(run));
  REQUIRE(kept_during);
  CHECK(w.read(s.p, N)[N - 1] == 5.0f);
  expect_pool_gone(w, baseline, s.pool);
}

TEST_CASE("graph in capture: the tracker destroyed while an outer graph holds a graph's nodes",
          "[graph-in-capture][pool-lifetime]") {
  World w;
  const std::int64_t baseline = w.reserved();
  const Scratch a = capture_scratch(w, "A", 7.0f);
  const StreamHandle outer = w.stream();
  REQUIRE_OK(w.rt->begin_capture(outer, CaptureMode::kGlobal));
  REQUIRE_OK(w.tracker->replay(a.graph, outer));
  auto c = w.rt->end_capture(outer);
  REQUIRE_OK(c);
  w.tracker.reset();  // destroys A through the runtime and drops its hold
  REQUIRE_OK(w.alloc->empty_cache(0));
  REQUIRE(w.pool_exists(a.pool));
  expect_native_replay_writes(w, *c, a.p, 7.0f);
  REQUIRE_OK(w.alloc->CheckInvariants());
  REQUIRE_OK(w.rt->destroy_graph(*c));
  expect_pool_gone(w, baseline, a.pool);
}

TEST_CASE("graph in capture: a shared user pool used by several captures, launched into an outer graph",
          "[graph-in-capture][pool-lifetime]") {
  World w;
  const std::int64_t baseline = w.reserved();
  const PoolHandle pool = *w.alloc->create_graph_pool(0);
  const Scratch a = capture_scratch(w, "A", 7.0f, pool);
  const Scratch b = capture_scratch(w, "B", 8.0f, pool);
  CHECK(a.pool == pool);
  CHECK(b.pool == pool);
  REQUIRE_OK(w.alloc->release_graph_pool(pool));
  const StreamHandle outer = w.stream();
  REQUIRE_OK(w.rt->begin_capture(outer, CaptureMode::kGlobal));
  REQUIRE_OK(w.tracker->replay(a.graph, outer));
  auto c = w.rt->end_capture(outer);
  REQUIRE_OK(c);
  REQUIRE_OK(w.tracker->destroy_graph(b.graph));
  REQUIRE_OK(w.tracker->destroy_graph(a.graph));
  REQUIRE_OK(w.alloc->empty_cache(0));
  REQUIRE(w.pool_exists(pool));
  expect_native_replay_writes(w, *c, a.p, 7.0f);
  REQUIRE_OK(w.rt->destroy_graph(*c));
  expect_pool_gone(w, baseline, pool);
}

// A graph that writes its shared pool's memory without allocating during its
// capture (an in-place update of another capture's output) is never watched
// (route_for watches at the first allocation): its hold goes at destroy_graph
// even though an outer graph still runs its nodes.
TEST_CASE("graph in capture: a non-allocating graph writing its shared pool, launched into an outer graph",
          "[graph-in-capture][pool-lifetime]") {
  World w;
  const std::int64_t baseline = w.reserved();
  const PoolHandle pool = *w.alloc->create_graph_pool(0);
  float* out = nullptr;
  const CaptureResult a = w.capture(pool, "A", [&] {
    out = w.tensor(N, w.side, "out");  // A's output, left live
    w.launch(w.side, fill_floats(out, N, 1.0f));
  });
  const bool b_allocates = GENERATE(false, true);
  INFO("B allocates (and so is watched): " << b_allocates);
  const CaptureResult b = w.capture(pool, "B", [&] {
    if (b_allocates) w.free(w.tensor(1, w.side, "tiny"));
    w.launch(w.side, fill_floats(out, N, 9.0f));  // in place
  });
  const StreamHandle outer = w.stream();
  REQUIRE_OK(w.rt->begin_capture(outer, CaptureMode::kGlobal));
  REQUIRE_OK(w.tracker->replay(b.graph, outer));
  auto c = w.rt->end_capture(outer);
  REQUIRE_OK(c);
  REQUIRE_OK(w.tracker->destroy_graph(a.graph));
  w.free(out);  // B (and C) may still write it: the pool keeps it for them
  REQUIRE_OK(w.alloc->release_graph_pool(pool));
  REQUIRE(w.pool_exists(pool));  // B's hold
  REQUIRE_OK(w.tracker->destroy_graph(b.graph));
  REQUIRE_OK(w.alloc->empty_cache(0));
  REQUIRE(w.pool_exists(pool));  // C still runs B's nodes (else its replay writes unmapped memory)
  expect_native_replay_writes(w, *c, out, 9.0f);
  REQUIRE_OK(w.rt->destroy_graph(*c));
  expect_no_leak(w, baseline);
}

TEST_CASE("graph in capture: threads capturing, launching into outer captures and destroying concurrently",
          "[graph-in-capture][pool-lifetime][threads]") {
  World w;
  const std::int64_t baseline = w.reserved();
  constexpr int kThreads = 3;
  constexpr int kRounds = 30;
  std::vector<StreamHandle> inner(kThreads), outer(kThreads);
  for (int t = 0; t < kThreads; ++t) {
    inner[t] = w.stream();
    outer[t] = w.stream();
  }
  std::atomic<int> failures{0};
  std::atomic<int> wrong_values{0};
  std::vector<std::string> first_error(kThreads);
  auto fail = [&](int t, const absl::Status& s) {
    if (first_error[t].empty()) first_error[t] = s.ToString();
    ++failures;
  };
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int round = 0; round < kRounds; ++round) {
        const float value = static_cast<float>(t * 1000 + round);
        auto id = w.tracker->begin_capture(0, inner[t], {.mode = CaptureMode::kThreadLocal, .label = "in"});
        if (!id.ok()) { fail(t, id.status()); continue; }
        auto p = w.alloc->allocate(N * sizeof(float), 0, inner[t]);
        if (!p.ok()) { fail(t, p.status()); (void)w.tracker->end_capture(inner[t]); continue; }
        float* f = static_cast<float*>(*p);
        if (auto s = w.rt->launch_kernel(inner[t], fill_floats(f, N, value)); !s.ok()) fail(t, s);
        if (auto s = w.alloc->deallocate(f); !s.ok()) fail(t, s);
        auto g = w.tracker->end_capture(inner[t]);
        if (!g.ok()) { fail(t, g.status()); continue; }
        auto oid = w.rt->begin_capture(outer[t], CaptureMode::kThreadLocal);
        if (!oid.ok()) { fail(t, oid.status()); continue; }
        if (auto s = w.tracker->replay(g->graph, outer[t]); !s.ok()) fail(t, s);
        auto c = w.rt->end_capture(outer[t]);
        if (!c.ok()) { fail(t, c.status()); continue; }
        if (auto s = w.tracker->destroy_graph(g->graph); !s.ok()) fail(t, s);
        if (auto s = w.alloc->empty_cache(0); !s.ok()) fail(t, s);
        std::memset(f, 0, sizeof(float));  // free pool memory, still mapped if kept
        if (auto s = w.rt->launch_graph(*c, outer[t]); !s.ok()) fail(t, s);
        if (auto s = w.rt->synchronize_stream(outer[t]); !s.ok()) fail(t, s);
        if (f[0] != value) ++wrong_values;
        if (auto s = w.rt->destroy_graph(*c); !s.ok()) fail(t, s);
      }
    });
  }
  for (auto& th : threads) th.join();
  for (int t = 0; t < kThreads; ++t) INFO("thread " << t << ": " << first_error[t]);
  std::string errors;
  for (int t = 0; t < kThreads; ++t) errors += first_error[t] + "\n";
  INFO(errors);
  CHECK(failures == 0);
  CHECK(wrong_values == 0);
  expect_no_leak(w, baseline);
}

