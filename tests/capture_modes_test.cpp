// capture_modes_test.cpp: how access modes decide a finding's severity
// (issue 9: a clobber is a hazard when any graph that uses the victim reads it
// before writing it, or when no graph writes it; the lower severity only when
// every graph that uses it writes it whole first). Each case replays the
// graphs on the host runtime and checks that the harm the severity claims is
// the harm the replay does.
#include <string>
#include <tuple>
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

// x[i] += 1: reads x, then writes it (an in-place update).
KernelLaunch add_one_kernel(float* x, std::size_t n) {
  KernelLaunch k;
  k.name = "add_one";
  k.updates = {{x, n * sizeof(float)}};
  k.host_body = [x, n] {
    for (std::size_t i = 0; i < n; ++i) x[i] += 1.0f;
  };
  return k;
}


// The producer: T = src * 2 in a shared pool, T freed in the capture, so
// the next capture's block lands on T's address and producer's replays
// write 6.0 there.
struct Producer {
  CaptureResult result;
  float* t = nullptr;
};
Producer capture_producer(World& w, PoolHandle pool, float* src) {
  Producer p;
  p.result = w.capture(pool, "producer", [&] {
    p.t = w.tensor(N, w.side, "T");
    w.launch(w.side, scale_kernel(p.t, src, N, 2.0f));
    w.free(p.t);
  });
  return p;
}


}  // namespace

TEST_CASE("a block its graph updates in place is a hazard when another graph clobbers it",
          "[capture][modes]") {
  World w;
  const PoolHandle pool = *w.alloc->create_graph_pool(0);
  float* src = w.tensor(N, kDefaultStream, "src");
  w.run_now(fill_kernel(src, N, 3.0f));
  const Producer p = capture_producer(w, pool, src);
  float* acc = nullptr;
  const CaptureResult c = w.capture(pool, "accumulate", [&] {
    acc = w.tensor(N, w.side, "ACC");  // the program fills it, the graph adds to it
    w.launch(w.side, add_one_kernel(acc, N));
  });
  REQUIRE(acc == p.t);
  const Finding* f = find_finding(c.new_findings, "producer", "ACC");
  REQUIRE(f != nullptr);
  CHECK(f->severity == Severity::kHazard);
  CHECK(f->write_mode == AccessMode::kWrite);
  CHECK_THAT(f->severity_reason,
             Catch::Contains("accumulate may read the victim before writing it") &&
                 Catch::Contains("read_write"));
  // The replay proves it: ACC = 10, producer's replay, then the update gives
  // 7 (6 + 1), not 11.
  w.run_now(fill_kernel(acc, N, 10.0f));
  w.replay(p.result.graph);
  w.replay(c.graph);
  CHECK(all_equal(w.read(acc, N), 7.0f));
}

TEST_CASE("one graph reading another graph's output makes the clobber of it a hazard",
          "[capture][modes]") {
  World w;
  const PoolHandle pool = *w.alloc->create_graph_pool(0);
  float* src = w.tensor(N, kDefaultStream, "src");
  w.run_now(fill_kernel(src, N, 3.0f));
  const Producer p = capture_producer(w, pool, src);
  float* out = nullptr;
  const CaptureResult writer = w.capture(pool, "writer", [&] {
    out = w.tensor(N, w.side, "OUT");
    w.launch(w.side, fill_kernel(out, N, 5.0f));  // writes OUT whole first
  });
  REQUIRE(out == p.t);
  // With only its writer using OUT, the producer's clobber is the lower
  // severity (another graph's output, rewritten at each of its replays).
  const Finding* before = find_finding(writer.new_findings, "producer", "OUT");
  REQUIRE(before != nullptr);
  CHECK(before->severity == Severity::kCrossGraphOutput);
  CHECK_THAT(before->severity_reason, Catch::Contains("(writer) writes them whole"));

  // A third graph reads OUT: the producer's replay between writer's and
  // reader's changes what reader computes. Reported again, as a hazard, at
  // the reader's capture end, before any replay.
  float* copy = w.tensor(N, kDefaultStream, "COPY");
  const CaptureResult reader = w.capture(kDefaultPool, "reader", [&] {
    w.launch(w.side, copy_kernel(copy, out, N));
  });
  const Finding* after = find_finding(reader.new_findings, "producer", "OUT");
  REQUIRE(after != nullptr);
  CHECK(after->severity == Severity::kHazard);
  CHECK_THAT(after->severity_reason, Catch::Contains("reader may read the victim before writing it"));
  // check() reports the pair once, at its current severity.
  int pairs = 0;
  for (const Finding& f : w.tracker->check()) {
    if (f.graph_label == "producer" && f.victim.tag == "OUT") {
      ++pairs;
      CHECK(f.severity == Severity::kHazard);
    }
  }
  CHECK(pairs == 1);
  // The replays: writer, producer, reader: reader copies 6.0, not 5.0.
  w.replay(writer.graph);
  w.replay(p.result.graph);
  w.replay(reader.graph);
  CHECK(all_equal(w.read(copy, N), 6.0f));
}

TEST_CASE("a graph's own update of a clobbered block does not restore it", "[capture][modes]") {
  // Same graph: T written and freed, X allocated at T's address and updated
  // in place. An update reads the clobbered bytes first, so unlike a whole
  // write it does not count as the victim rewriting them.
  World w;
  const PoolHandle pool = *w.alloc->create_graph_pool(0);
  float* src = w.tensor(N, kDefaultStream, "src");
  w.run_now(fill_kernel(src, N, 3.0f));
  float* x = nullptr;
  float* t = nullptr;
  const CaptureResult g = w.capture(pool, "g", [&] {
    t = w.tensor(N, w.side, "T");
    w.launch(w.side, scale_kernel(t, src, N, 2.0f));
    w.free(t);
    x = w.tensor(N, w.side, "X");
    w.launch(w.side, add_one_kernel(x, N));
  });
  REQUIRE(x == t);
  const Finding* f = find_finding(g.new_findings, "g", "X");
  REQUIRE(f != nullptr);
  CHECK(f->severity == Severity::kHazard);
  CHECK_THAT(f->severity_reason, Catch::Contains("g itself uses the victim"));
  w.run_now(fill_kernel(x, N, 100.0f));
  w.replay(g.graph);
  CHECK(all_equal(w.read(x, N), 7.0f));  // 6 + 1, not 101
}

TEST_CASE("findings come out in a fixed order: by capture, graph, then victim",
          "[capture][modes]") {
  World w;
  const PoolHandle pool = *w.alloc->create_graph_pool(0);
  float* src = w.tensor(N, kDefaultStream, "src");
  w.run_now(fill_kernel(src, N, 3.0f));
  // One graph frees three transients; the next capture leaves three blocks
  // live on their addresses.
  const CaptureResult first = w.capture(pool, "first", [&] {
    float* t[3];
    for (float*& ti : t) {
      ti = w.tensor(N, w.side, "T");
      w.launch(w.side, scale_kernel(ti, src, N, 2.0f));
    }
    for (float* ti : t) w.free(ti);
  });
  const CaptureResult second = w.capture(pool, "second", [&] {
    for (int i = 0; i < 3; ++i) w.tensor(N, w.side, "LIVE");
  });
  (void)first;
  const std::vector<Finding> all = w.tracker->check();
  REQUIRE(all.size() == 3);
  REQUIRE(second.new_findings.size() == 3);
  for (std::size_t i = 1; i < all.size(); ++i) {
    CHECK(std::tie(all[i - 1].capture, all[i - 1].graph, all[i - 1].victim.sequence) <
          std::tie(all[i].capture, all[i].graph, all[i].victim.sequence));
  }
  for (std::size_t i = 1; i < second.new_findings.size(); ++i) {
    CHECK(second.new_findings[i - 1].victim.sequence < second.new_findings[i].victim.sequence);
  }
}

// Issue 9, class 7: a graph that outlives a tensor it reads. The input X is
// allocated before the capture, read by the graph, freed after it, and its
// address handed to a new live block V: each replay computes from V's data.
TEST_CASE("a graph reading a freed input whose memory a live block now holds is a stale read",
          "[capture][modes][stale]") {
  World w;
  float* x = w.tensor(N, kDefaultStream, "X");
  w.run_now(fill_kernel(x, N, 3.0f));
  float* out = w.tensor(N, kDefaultStream, "OUT");
  const CaptureResult g = w.capture(kDefaultPool, "g", [&] {
    w.launch(w.side, copy_kernel(out, x, N));
  });
  CHECK(g.new_findings.empty());  // X is live: nothing stale yet
  w.free(x);
  float* v = w.tensor(N, kDefaultStream, "V");
  REQUIRE(v == x);
  w.run_now(fill_kernel(v, N, 9.0f));

  auto checked = w.tracker->check_graph(g.graph);
  REQUIRE_OK(checked);
  const std::vector<Finding> found = *checked;
  REQUIRE(found.size() == 1);
  const Finding& f = found[0];
  CHECK(f.harm == Harm::kStaleRead);
  CHECK(f.severity == Severity::kHazard);
  CHECK(f.victim.tag == "V");
  CHECK(f.writer.tag == "X");
  CHECK(f.write_mode == AccessMode::kRead);
  CHECK(f.overlap.ptr == v);
  CHECK(f.overlap.bytes == kBytes);
  CHECK_THAT(f.fix, Catch::Contains("keep 'X'"));
  CHECK_THAT(findings_to_json(found), Catch::Contains("\"harm\":\"stale_read\""));

  // The replay computes from V's data, as the finding says.
  w.replay(g.graph);
  CHECK(all_equal(w.read(out, N), 9.0f));
  // Strict mode refuses the replay.
  w.tracker->set_strict(true);
  w.run_now(fill_kernel(out, N, 0.0f));
  CHECK(w.tracker->replay(g.graph, kDefaultStream).code() ==
        absl::StatusCode::kFailedPrecondition);
  REQUIRE_OK(w.rt->synchronize_stream(kDefaultStream));
  CHECK(all_equal(w.read(out, N), 0.0f));
}

TEST_CASE("a graph reading its own data of the same replay is no stale read",
          "[capture][modes][stale]") {
  // T is written, then read, inside the graph, and freed in the capture; a
  // block left live on T's address is clobbered (T's write), but the read
  // of T reads this replay's own data: no stale read.
  World w;
  const PoolHandle pool = *w.alloc->create_graph_pool(0);
  float* src = w.tensor(N, kDefaultStream, "src");
  w.run_now(fill_kernel(src, N, 3.0f));
  float* out = w.tensor(N, kDefaultStream, "OUT");
  float* t = nullptr;
  float* live = nullptr;
  const CaptureResult g = w.capture(pool, "g", [&] {
    t = w.tensor(N, w.side, "T");
    w.launch(w.side, scale_kernel(t, src, N, 2.0f));
    w.launch(w.side, copy_kernel(out, t, N));
    w.free(t);
    live = w.tensor(N, w.side, "LIVE");
  });
  REQUIRE(live == t);
  int clobbers = 0;
  auto found = w.tracker->check_graph(g.graph);
  REQUIRE_OK(found);
  for (const Finding& f : *found) {
    CHECK(f.harm == Harm::kClobber);
    clobbers += f.victim.tag == "LIVE" ? 1 : 0;
  }
  CHECK(clobbers == 1);
  w.replay(g.graph);
  CHECK(all_equal(w.read(out, N), 6.0f));
}

// Issue 9, class 6: the harmed bytes as an exact set of ranges, not one
// bounding range, and a victim that rewrites part of a clobbered range.
TEST_CASE("two disjoint writes clobber exactly their two ranges", "[capture][modes][ranges]") {
  World w;
  const PoolHandle pool = *w.alloc->create_graph_pool(0);
  constexpr std::size_t kQuarter = N / 4;  // 4 KiB
  float* t = nullptr;
  float* v = nullptr;
  const CaptureResult g = w.capture(pool, "g", [&] {
    t = w.tensor(N, w.side, "T");
    w.launch(w.side, fill_kernel(t, kQuarter, 6.0f));
    w.launch(w.side, fill_kernel(t + 3 * kQuarter, kQuarter, 6.0f));
    w.free(t);
    v = w.tensor(N, w.side, "V");
  });
  REQUIRE(v == t);
  const Finding* f = find_finding(g.new_findings, "g", "V");
  REQUIRE(f != nullptr);
  CHECK(f->ranges_exact);
  REQUIRE(f->ranges.size() == 2);
  CHECK(f->ranges[0].ptr == v);
  CHECK(f->ranges[0].bytes == kQuarter * sizeof(float));
  CHECK(f->ranges[1].ptr == v + 3 * kQuarter);
  CHECK(f->ranges[1].bytes == kQuarter * sizeof(float));
  CHECK(f->harmed_bytes() == 2 * kQuarter * sizeof(float));
  CHECK(f->overlap.bytes == kBytes);  // the bound, for the reuse chain
  CHECK(f->clobbering_writes == 2);
  const std::string json = findings_to_json({*f});
  CHECK_THAT(json, Catch::Contains("\"bytes\":8192,\"exact\":true,\"ranges\":[{"));
  // The replay changes exactly those bytes.
  w.run_now(fill_kernel(v, N, kCanary));
  w.replay(g.graph);
  const std::vector<float> after = w.read(v, N);
  for (std::size_t i = 0; i < N; ++i) {
    const bool harmed = i < kQuarter || i >= 3 * kQuarter;
    if (after[i] != (harmed ? 6.0f : kCanary)) FAIL("element " << i << " is " << after[i]);
  }
}

TEST_CASE("a victim that rewrites half of a clobbered range leaves the other half clobbered",
          "[capture][modes][ranges]") {
  World w;
  const PoolHandle pool = *w.alloc->create_graph_pool(0);
  float* t = nullptr;
  float* v = nullptr;
  const CaptureResult g = w.capture(pool, "g", [&] {
    t = w.tensor(N, w.side, "T");
    w.launch(w.side, fill_kernel(t, N, 6.0f));
    w.free(t);
    v = w.tensor(N, w.side, "V");
    w.launch(w.side, fill_kernel(v, N / 2, 7.0f));  // V's own write, first half only
  });
  REQUIRE(v == t);
  const Finding* f = find_finding(g.new_findings, "g", "V");
  REQUIRE(f != nullptr);
  REQUIRE(f->ranges.size() == 1);
  CHECK(f->ranges[0].ptr == v + N / 2);
  CHECK(f->ranges[0].bytes == kBytes / 2);
  w.run_now(fill_kernel(v, N, kCanary));
  w.replay(g.graph);
  const std::vector<float> after = w.read(v, N);
  CHECK(after.front() == 7.0f);
  CHECK(after.back() == 6.0f);  // T's data where V did not rewrite
}

// Issue 9: a waiver marks a finding the user judged benign; strict mode then
// replays the graph, and the finding is still listed, apart.
TEST_CASE("a waived hazard is listed with its reason and strict mode replays the graph",
          "[capture][waive][strict]") {
  World w;
  const PoolHandle pool = *w.alloc->create_graph_pool(0);
  float* t = nullptr;
  float* ws = nullptr;
  const CaptureResult g = w.capture(pool, "g", [&] {
    t = w.tensor(N, w.side, "T");
    w.launch(w.side, fill_kernel(t, N, 6.0f));
    w.free(t);
    ws = w.tensor(N, w.side, "WS");
  });
  REQUIRE(ws == t);
  w.tracker->set_strict(true);
  CHECK(w.tracker->replay(g.graph, kDefaultStream).code() == absl::StatusCode::kFailedPrecondition);

  // Bad waivers are errors and change nothing.
  CHECK(w.tracker->waive(g.graph, ws, "", "").code() == absl::StatusCode::kInvalidArgument);
  CHECK(w.tracker->waive(g.graph, nullptr, "", "why").code() == absl::StatusCode::kInvalidArgument);
  CHECK(w.tracker->waive(g.graph + 999, ws, "", "why").code() == absl::StatusCode::kNotFound);
  int on_stack = 0;
  CHECK(w.tracker->waive(g.graph, &on_stack, "", "why").code() == absl::StatusCode::kNotFound);
  CHECK_FALSE(w.tracker->check().front().waived);
  CHECK(w.tracker->replay(g.graph, kDefaultStream).code() == absl::StatusCode::kFailedPrecondition);

  // Waived by a pointer into the victim (its middle will do).
  REQUIRE_OK(w.tracker->waive(g.graph, ws + N / 2, "", "WS is scratch the program rewrites"));
  const std::vector<Finding> found = w.tracker->check();
  REQUIRE(found.size() == 1);
  CHECK(found[0].waived);
  CHECK(found[0].severity == Severity::kHazard);  // still what it is
  CHECK(found[0].waiver_reason == "WS is scratch the program rewrites");
  CHECK_THAT(findings_to_json(found),
             Catch::Contains("\"waived\":{\"reason\":\"WS is scratch the program rewrites\"}"));
  REQUIRE_OK(w.tracker->replay(g.graph, kDefaultStream));
  REQUIRE_OK(w.rt->synchronize_stream(kDefaultStream));

  // Destroying the graph takes its waivers along.
  REQUIRE_OK(w.tracker->destroy_graph(g.graph));
  CHECK(w.tracker->waive(g.graph, ws, "", "why").code() == absl::StatusCode::kNotFound);
}

TEST_CASE("a waiver by tag covers every block with that tag", "[capture][waive]") {
  World w;
  const PoolHandle pool = *w.alloc->create_graph_pool(0);
  float* t = nullptr;
  const CaptureResult g = w.capture(pool, "g", [&] {
    t = w.tensor(N, w.side, "T");
    w.launch(w.side, fill_kernel(t, N, 6.0f));
    w.free(t);
    w.tensor(N, w.side, "kv");
  });
  REQUIRE_OK(w.tracker->waive(g.graph, nullptr, "kv", "the KV block is refilled before use"));
  for (const Finding& f : w.tracker->check()) CHECK(f.waived == (f.victim.tag == "kv"));
  CHECK(w.tracker->check().size() == 1);
}
