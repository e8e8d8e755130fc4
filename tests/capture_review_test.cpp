// capture_review_test.cpp: what an independent review of the graph model,
// touches and kept memory broke, each case named after what it found
// (issue 9's review, and issue 11's "host release waits for queued work").
#include <chrono>
#include <cstring>
#include <thread>

#include "capture_test_support.hpp"
#include "replay_orders.hpp"

namespace capalloc::testing {
namespace {

constexpr std::size_t kN = 256;
constexpr std::size_t kBig = std::size_t{16} << 20;  // a segment of its own

GraphHandle discovered(CaptureId id) { return (GraphHandle{1} << 63) | id; }

KernelLaunch fill(float* p, std::size_t n, float value) { return fill_floats(p, n, value); }

KernelLaunch slow(KernelLaunch k) {
  auto body = std::move(k.host_body);
  k.host_body = [body] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    body();
  };
  return k;
}

void join(World& w, StreamHandle from, StreamHandle to) { join_streams(w, from, to); }

TEST_CASE("review: empty_cache waits for a queued kernel that still writes freed memory",
          "[capture][review]") {
  World w;
  float* p = static_cast<float*>(*w.alloc->allocate(kBig, 0, w.side, {.tag = "P"}));
  w.launch(w.side, slow(fill(p, kBig / 4, 1.0f)));
  w.free(p);  // stream-ordered, as on CUDA
  const std::int64_t held = w.reserved();
  REQUIRE_OK(w.alloc->empty_cache());  // releases only after the kernel ran (cudaFree waits too)
  CHECK(w.reserved() < held);
  REQUIRE_OK(w.rt->synchronize_stream(w.side));
}

TEST_CASE("review: a graph destroyed right after its replay is launched replays safely",
          "[capture][review]") {
  World w;
  const CaptureResult done = w.capture(kDefaultPool, "g", [&] {
    float* t = w.tensor(kBig / 4, w.side, "T");
    w.launch(w.side, slow(fill(t, kBig / 4, 1.0f)));
    w.free(t);
  });
  REQUIRE_OK(w.tracker->replay(done.graph, kDefaultStream));
  REQUIRE_OK(w.tracker->destroy_graph(done.graph));  // legal on CUDA: the replay finishes
  REQUIRE_OK(w.rt->synchronize_stream(kDefaultStream));
}

TEST_CASE("review: a side-stream read of a freed transient races the victim's own write",
          "[capture][review][order]") {
  auto control = std::make_shared<ReplayOrder>();
  World w(*make_host_runtime(ordered_host_options(control)));
  const StreamHandle s2 = w.stream();
  float* out = w.tensor(kN, kDefaultStream, "out");
  float* v = nullptr;
  const CaptureResult done = w.capture(kDefaultPool, "sideread", [&] {
    float* t = w.tensor(kN, w.side, "T");
    w.launch(w.side, fill(t, kN, 1.0f));    // node 0
    join(w, w.side, s2);
    w.launch(s2, copy_kernel(out, t, kN));  // node 1: reads T, no record_stream
    w.free(t);
    v = w.tensor(kN, w.side, "V");
    REQUIRE(v == t);
    w.launch(w.side, fill(v, kN, 2.0f));    // node 2: unordered with node 1
    join(w, s2, w.side);
  });
  // Running node 1 last makes it copy V's 2.0.
  control->late = 1;
  w.replay(done.graph);
  control->late.reset();
  CHECK(all_equal(w.read(out, kN), 2.0f));
  const std::vector<Finding> findings = w.tracker->check();
  const Finding* f = find_finding(findings, "sideread", "V", Harm::kStaleRead);
  REQUIRE(f != nullptr);
  CHECK(f->severity == Severity::kHazard);
  CHECK_THAT(f->order, Catch::StartsWith("unordered"));
}

TEST_CASE("review: the capture-end hook before the capture's end is refused and changes nothing",
          "[capture][review][native]") {
  World w;
  auto pool = w.alloc->create_graph_pool(0);
  REQUIRE_OK(pool);
  auto id = w.rt->begin_capture(w.side, CaptureMode::kGlobal);
  REQUIRE_OK(id);
  REQUIRE_OK(w.alloc->begin_allocate_to_pool(0, *id, *pool));
  float* p = w.tensor(kN, w.side, "P");
  const absl::Status early = w.alloc->end_allocate_to_pool(*id);
  CHECK(early.code() == absl::StatusCode::kFailedPrecondition);
  // The route stays: the next allocation still goes to the pool.
  float* q = w.tensor(kN, w.side, "Q");
  CHECK(w.alloc->block_info(q)->pool == *pool);
  auto g = w.rt->end_capture(w.side);
  REQUIRE_OK(g);
  REQUIRE_OK(w.alloc->end_allocate_to_pool(*id));
  {
    auto record = w.tracker->write_record(discovered(*id));
    REQUIRE_OK(record);
    CHECK(record->precision != WriteEvidence::kFootprint);
  }
  REQUIRE_OK(w.rt->destroy_graph(*g));
  w.free(p);
  w.free(q);
  REQUIRE_OK(w.alloc->release_graph_pool(*pool));
}

TEST_CASE("review: a tracker's graph destroyed through the runtime takes its record and memory",
          "[capture][review][lifetime]") {
  World w;
  float* e = static_cast<float*>(*w.alloc->allocate(kBig, 0, w.side, {.tag = "E"}));
  float* out = w.tensor(16, kDefaultStream, "out");
  const CaptureResult done = w.capture(kDefaultPool, "g", [&] {
    float* t = w.tensor(16, w.side, "T");
    w.launch(w.side, copy_kernel(out, e, 16));
    w.free(t);
  });
  w.free(e);
  const std::int64_t held = w.reserved();
  REQUIRE_OK(w.rt->destroy_graph(done.graph));  // bypasses the tracker
  w.tracker->check();                           // learns the graph is gone
  CHECK(w.tracker->write_record(done.graph).status().code() == absl::StatusCode::kNotFound);
  REQUIRE_OK(w.alloc->empty_cache());
  CHECK(w.reserved() < held);
  // destroy_graph through the tracker afterwards: unknown now.
  CHECK(w.tracker->destroy_graph(done.graph).code() == absl::StatusCode::kNotFound);
  w.free(out);
}

TEST_CASE("review: the tracker drops the record of a graph the runtime already destroyed",
          "[capture][review][lifetime]") {
  World w;
  float* out = w.tensor(16, kDefaultStream, "out");
  float* e = w.tensor(16, kDefaultStream, "E");
  const CaptureResult done =
      w.capture(kDefaultPool, "g", [&] { w.launch(w.side, copy_kernel(out, e, 16)); });
  REQUIRE_OK(w.rt->destroy_graph(done.graph));
  REQUIRE_OK(w.tracker->destroy_graph(done.graph));  // the graph is gone either way
  CHECK(w.tracker->write_record(done.graph).status().code() == absl::StatusCode::kNotFound);
  w.free(out);
  w.free(e);
}

TEST_CASE("review: no memory goes back while a capture is routed on the device",
          "[capture][review][lifetime]") {
  SECTION("during a tracker capture, an eager input freed mid-capture") {
    World w;
    float* e = static_cast<float*>(*w.alloc->allocate(kBig, 0, w.side, {.tag = "E"}));
    float* out = w.tensor(16, w.side, "out");
    REQUIRE_OK(w.tracker->begin_capture(0, w.side, {.label = "g"}));
    w.launch(w.side, copy_kernel(out, e, 16));
    w.free(e);
    const std::int64_t held = w.reserved();
    REQUIRE_OK(w.alloc->empty_cache());
    CHECK(w.reserved() == held);
    auto done = w.tracker->end_capture(w.side);
    REQUIRE_OK(done);
    REQUIRE_OK(w.alloc->empty_cache());  // now the record keeps E's memory
    CHECK(w.reserved() == held);
    w.replay(done->graph);
    REQUIRE_OK(w.tracker->destroy_graph(done->graph));
    w.free(out);
  }
  SECTION("between a native capture's end and its capture-end hook") {
    World w;
    auto pool = w.alloc->create_graph_pool(0);
    REQUIRE_OK(pool);
    float* e = static_cast<float*>(*w.alloc->allocate(kBig, 0, w.side, {.tag = "E"}));
    auto id = w.rt->begin_capture(w.side, CaptureMode::kGlobal);
    REQUIRE_OK(id);
    REQUIRE_OK(w.alloc->begin_allocate_to_pool(0, *id, *pool));
    float* p = w.tensor(kN, w.side, "P");
    KernelLaunch k;
    k.name = "k";
    k.params.resize(16);
    std::memcpy(k.params.data(), &e, 8);
    std::memcpy(k.params.data() + 8, &p, 8);
    k.host_body = [e, p] { p[0] = e[0]; };
    w.launch(w.side, std::move(k));
    auto g = w.rt->end_capture(w.side);
    REQUIRE_OK(g);
    w.free(e);
    const std::int64_t held = w.reserved();
    REQUIRE_OK(w.alloc->empty_cache());
    CHECK(w.reserved() == held);
    REQUIRE_OK(w.alloc->end_allocate_to_pool(*id));  // inspected: the record keeps E
    REQUIRE_OK(w.alloc->empty_cache());
    CHECK(w.reserved() == held);
    REQUIRE_OK(w.rt->launch_graph(*g, kDefaultStream));
    REQUIRE_OK(w.rt->synchronize_stream(kDefaultStream));
    REQUIRE_OK(w.rt->destroy_graph(*g));
    w.free(p);
    REQUIRE_OK(w.alloc->release_graph_pool(*pool));
  }
}

TEST_CASE("review: a capture begun through the tracker is never also discovered",
          "[capture][review]") {
  // Its allocation events used to be drained after it was forgotten as
  // begun here, so check() built a second, footprint record for it.
  World w;
  float* out = w.tensor(kN, kDefaultStream, "out");
  CaptureId id = 0;
  const CaptureResult done = w.capture(
      kDefaultPool, "g",
      [&] {
        float* t = w.tensor(kN, w.side, "T");
        w.launch(w.side, fill(t, kN, 1.0f));
        w.launch(w.side, copy_kernel(out, t, kN));
        w.free(t);
      },
      &id);
  w.tracker->check();
  CHECK(w.tracker->write_record(discovered(id)).status().code() == absl::StatusCode::kNotFound);
  CHECK(w.tracker->write_record(done.graph).ok());
  REQUIRE_OK(w.tracker->destroy_graph(done.graph));
  w.free(out);
}

TEST_CASE("review: a clobber through a touch is possible, with block-granular ranges",
          "[capture][review][native]") {
  // A native (PyTorch-style) capture: a kernel that declares nothing takes a
  // transient's pointer, the transient is freed, and a block left live takes
  // its address. Whether the kernel wrote it is not known.
  World w;
  auto pool = w.alloc->create_graph_pool(0);
  REQUIRE_OK(pool);
  auto id = w.rt->begin_capture(w.side, CaptureMode::kGlobal);
  REQUIRE_OK(id);
  REQUIRE_OK(w.alloc->begin_allocate_to_pool(0, *id, *pool));
  float* t = w.tensor(kN, w.side, "T");
  KernelLaunch k;
  k.name = "elementwise";
  k.params.resize(16);
  float* inside = t + 3;  // a pointer into the block, as a view's data_ptr
  std::memcpy(k.params.data() + 8, &inside, 8);
  k.host_body = [t] { t[0] = 1.0f; };
  w.launch(w.side, std::move(k));
  w.free(t);
  float* v = w.tensor(kN, w.side, "V");
  REQUIRE(v == t);
  auto g = w.rt->end_capture(w.side);
  REQUIRE_OK(g);
  REQUIRE_OK(w.alloc->end_allocate_to_pool(*id));
  const std::vector<Finding> findings = w.tracker->check();
  const Finding* f = find_finding(findings, "capture " + std::to_string(*id), "V");
  REQUIRE(f != nullptr);
  CHECK(f->evidence == WriteEvidence::kInspected);
  CHECK(f->write_mode == AccessMode::kTouch);
  CHECK(f->mode_unknown);
  CHECK(f->severity == Severity::kPossible);
  CHECK_FALSE(f->ranges_exact);
  CHECK(f->harmed_bytes() == kN * sizeof(float));
  REQUIRE_OK(w.rt->destroy_graph(*g));
  w.free(v);
  REQUIRE_OK(w.alloc->release_graph_pool(*pool));
}

}  // namespace
}  // namespace capalloc::testing
