// capture_replay_order_test.cpp: verdicts that depend on the order of
// accesses within a replay, each checked against the replay's memory. These
// are the cases an independent review of the access-mode work found wrong
// (issue 9): a victim read between a clobber and its own rewrite, a read of
// bytes the graph itself wrote through another block, stale reads of blocks
// a later capture leaves live, and which severity changes are reported again.
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "capture_test_support.hpp"
#include "tools/scenarios/kernels.hpp"

using namespace capalloc;
using namespace capalloc::testing;
using capalloc::scenarios::fill_kernel;
using capalloc::scenarios::scale_kernel;

namespace {

constexpr std::size_t N = 4096;  // floats: 16 KiB
constexpr std::size_t kBytes = N * sizeof(float);
constexpr float kCanary = 1234.5f;



// T written and freed, V allocated on T's address; then `use_v` (reads V,
// then rewrites it whole, in some form). The program fills V and replays.
CaptureResult clobber_then(World& w, float*& v, const std::function<void(float*)>& use_v) {
  float* t = nullptr;
  CaptureResult g = w.capture(kDefaultPool, "g", [&] {
    t = w.tensor(N, w.side, "T");
    w.launch(w.side, fill_kernel(t, N, 6.0f));
    w.free(t);
    v = w.tensor(N, w.side, "V");
    use_v(v);
  });
  REQUIRE(v == t);
  return g;
}

}  // namespace

TEST_CASE("a victim read between the clobber and its own rewrite is harmed",
          "[capture][order]") {
  World w;
  float* out = w.tensor(N, kDefaultStream, "OUT");
  float* v = nullptr;
  const CaptureResult g = clobber_then(w, v, [&](float* vv) {
    w.launch(w.side, copy_kernel(out, vv, N));    // reads V: the program's input
    w.launch(w.side, fill_kernel(vv, N, 7.0f));   // then rewrites V whole
  });
  const Finding* f = find_finding(g.new_findings, "g", "V");
  REQUIRE(f != nullptr);
  CHECK(f->severity == Severity::kHazard);
  CHECK(f->harmed_bytes() == kBytes);
  w.run_now(fill_kernel(v, N, kCanary));
  w.replay(g.graph);
  CHECK(all_equal(w.read(out, N), 6.0f));  // T's data, not the program's V
}

TEST_CASE("the same through a memcpy source and a memset", "[capture][order]") {
  World w;
  float* out = w.tensor(N, kDefaultStream, "OUT");
  float* v = nullptr;
  const CaptureResult g = clobber_then(w, v, [&](float* vv) {
    REQUIRE_OK(w.rt->memcpy_async(out, vv, kBytes, w.side));
    REQUIRE_OK(w.rt->memset_async(vv, 0, kBytes, w.side));
  });
  CHECK(find_finding(g.new_findings, "g", "V") != nullptr);
  w.run_now(fill_kernel(v, N, kCanary));
  w.replay(g.graph);
  CHECK(all_equal(w.read(out, N), 6.0f));
}

TEST_CASE("one kernel declaring a span as read and as written reads it first",
          "[capture][order]") {
  World w;
  float* v = nullptr;
  const CaptureResult g = clobber_then(w, v, [&](float* vv) {
    KernelLaunch k;
    k.name = "inplace";
    k.reads = {{vv, kBytes}};
    k.writes = {{vv, kBytes}};
    k.host_body = [vv] {
      for (std::size_t i = 0; i < N; ++i) vv[i] += 1.0f;
    };
    w.launch(w.side, std::move(k));
  });
  CHECK(find_finding(g.new_findings, "g", "V") != nullptr);
  w.run_now(fill_kernel(v, N, 100.0f));
  w.replay(g.graph);
  CHECK(all_equal(w.read(v, N), 7.0f));  // 6 + 1, not 101
}

TEST_CASE("reading bytes the graph wrote through another block earlier is no stale read",
          "[capture][order][stale]") {
  World w;
  const PoolHandle pool = *w.alloc->create_graph_pool(0);
  float* src = w.tensor(N, kDefaultStream, "src");
  w.run_now(fill_kernel(src, N, 3.0f));
  float* out = w.tensor(N, kDefaultStream, "OUT");
  float* t1 = nullptr;
  float* t2 = nullptr;
  const CaptureResult g = w.capture(pool, "g", [&] {
    t1 = w.tensor(N, w.side, "T1");
    w.launch(w.side, scale_kernel(t1, src, N, 2.0f));
    w.free(t1);
    t2 = w.tensor(N, w.side, "T2");  // on T1's bytes, read without being written
    w.launch(w.side, copy_kernel(out, t2, N));
    w.free(t2);
  });
  REQUIRE(t1 == t2);
  float* v = nullptr;
  w.capture(pool, "g2", [&] {
    v = w.tensor(N, w.side, "V");
    w.launch(w.side, fill_kernel(v, N, 5.0f));
  });
  REQUIRE(v == t1);
  auto found = w.tracker->check_graph(g.graph);
  REQUIRE_OK(found);
  CHECK(find_finding(*found, "g", "V", Harm::kStaleRead) == nullptr);
  CHECK(find_finding(*found, "g", "V", Harm::kClobber) != nullptr);
  // The replay reads its own T1 data: strict mode lets it run (the clobber
  // of V is another graph's output, rewritten at each of its replays).
  w.tracker->set_strict(true);
  w.run_now(fill_kernel(v, N, kCanary));
  w.replay(g.graph);
  CHECK(all_equal(w.read(out, N), 6.0f));
}

TEST_CASE("a stale read of a block a later capture leaves live is reported at that capture's end",
          "[capture][order][stale]") {
  World w;
  const PoolHandle pool = *w.alloc->create_graph_pool(0);
  float* out = w.tensor(N, kDefaultStream, "OUT");
  float* x = nullptr;
  w.capture(pool, "g0", [&] {
    x = w.tensor(N, w.side, "X");
    w.launch(w.side, fill_kernel(x, N, 2.0f));
  });
  const CaptureResult g1 = w.capture(kDefaultPool, "g1", [&] {
    w.launch(w.side, copy_kernel(out, x, N));  // reads g0's output
  });
  CHECK(g1.new_findings.empty());
  w.free(x);
  float* v = nullptr;
  const CaptureResult g2 = w.capture(pool, "g2", [&] {
    v = w.tensor(N, w.side, "V");
    w.launch(w.side, fill_kernel(v, N, 5.0f));
  });
  REQUIRE(v == x);
  const Finding* stale = find_finding(g2.new_findings, "g1", "V", Harm::kStaleRead);
  REQUIRE(stale != nullptr);
  CHECK(stale->severity == Severity::kHazard);
  w.replay(g2.graph);
  w.replay(g1.graph);
  CHECK(all_equal(w.read(out, N), 5.0f));  // V's data, not X's 2.0
}

TEST_CASE("a finding is reported again when its severity rises, not when it falls",
          "[capture][order]") {
  World w;
  const PoolHandle pool = *w.alloc->create_graph_pool(0);
  float* t = nullptr;
  w.capture(pool, "g1", [&] {
    t = w.tensor(N, w.side, "T");
    w.launch(w.side, fill_kernel(t, N, 6.0f));
    w.free(t);
  });
  float* v = nullptr;
  const CaptureResult g2 = w.capture(pool, "g2", [&] { v = w.tensor(N, w.side, "V"); });
  REQUIRE(v == t);
  const Finding* first = find_finding(g2.new_findings, "g1", "V");
  REQUIRE(first != nullptr);
  CHECK(first->severity == Severity::kHazard);  // no graph writes V
  // g3 writes V whole: the clobber falls to the lower severity; not news.
  const CaptureResult g3 = w.capture(kDefaultPool, "g3", [&] {
    w.launch(w.side, fill_kernel(v, N, 5.0f));
  });
  CHECK(find_finding(g3.new_findings, "g1", "V") == nullptr);
  const std::vector<Finding> now = w.tracker->check();
  REQUIRE(find_finding(now, "g1", "V") != nullptr);
  CHECK(find_finding(now, "g1", "V")->severity == Severity::kCrossGraphOutput);
  // g4 reads V first: back to a hazard, already reported as one.
  float* out = w.tensor(N, kDefaultStream, "OUT");
  const CaptureResult g4 = w.capture(kDefaultPool, "g4", [&] {
    w.launch(w.side, copy_kernel(out, v, N));
  });
  CHECK(find_finding(g4.new_findings, "g1", "V") == nullptr);
  CHECK(find_finding(w.tracker->check(), "g1", "V")->severity == Severity::kHazard);
}
