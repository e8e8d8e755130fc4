// Captures the tracker did not begin, as a PyTorch process makes them
// (torch.cuda.graph calls the native capture API; capalloc sees only malloc
// and free): the allocator routes their allocations to a private pool by
// capture id, and the tracker records them with footprint evidence once their
// stream has left the capture. Seed 003's arm A through that path.
#include "capalloc/capalloc.h"
#include "c_api/global.hpp"
#include "capture/tracker_impl.hpp"
#include "test_support.hpp"
#include "tools/scenarios/kernels.hpp"

using namespace capalloc;

TEST_CASE("a capture begun outside the tracker is found by check with footprint evidence",
          "[capture][discovered][seed003]") {
  auto rt = capalloc::testing::host_runtime();
  auto alloc = capalloc::testing::make_allocator(rt);
  auto tracker = CaptureTracker::create(*alloc);
  REQUIRE_OK(tracker);
  const StreamHandle s = *rt->create_stream(0);
  constexpr std::size_t kBytes = std::size_t{1} << 20;

  // The host application captures through the runtime directly.
  auto id = rt->begin_capture(s, CaptureMode::kGlobal);
  REQUIRE_OK(id);
  void* t = *alloc->allocate(kBytes, 0, s, {.tag = "T"});
  void* sink = *alloc->allocate(4, 0, s, {.tag = "sink"});
  REQUIRE_OK(rt->launch_kernel(s, scenarios::fill_kernel(static_cast<float*>(t), kBytes / 4, 6.0f)));
  REQUIRE_OK(alloc->deallocate(t));
  void* ws = *alloc->allocate(kBytes, 0, s, {.tag = "WS"});
  CHECK(ws == t);
  // Its allocations went to a private graph pool, not the default pool.
  CHECK(alloc->block_info(ws)->pool != kDefaultPool);
  CHECK(alloc->block_info(ws)->capture == *id);
  // While the capture runs, check() has nothing to say about it.
  CHECK((*tracker)->check().empty());
  auto graph = rt->end_capture(s);
  REQUIRE_OK(graph);

  const std::vector<Finding> findings = (*tracker)->check();
  REQUIRE(findings.size() == 1);
  const Finding& f = findings[0];
  CHECK(f.victim.tag == "WS");
  CHECK(f.writer.tag == "T");
  CHECK(f.evidence == WriteEvidence::kFootprint);
  CHECK(f.severity == Severity::kPossible);  // footprint: what the graph writes is not known
  CHECK(f.capture == *id);
  CHECK((f.graph & detail::kDiscoveredGraph) != 0);
  CHECK(f.graph_label == "capture " + std::to_string(*id));
  auto record = (*tracker)->write_record(f.graph);
  REQUIRE_OK(record);
  CHECK(record->precision == WriteEvidence::kFootprint);

  REQUIRE_OK(alloc->deallocate(ws));
  REQUIRE_OK(alloc->deallocate(sink));
  REQUIRE_OK(alloc->CheckInvariants());
  REQUIRE_OK(rt->destroy_graph(*graph));
  REQUIRE_OK(rt->destroy_stream(s));
}

TEST_CASE("the PyTorch entry points on a capturing stream: routed, recorded and checked",
          "[c_api][torch][discovered][seed003]") {
  ::setenv("CAPALLOC_RUNTIME", "host", 1);
  auto global = detail::global_capalloc();
  REQUIRE_OK(global);
  DeviceRuntime& rt = *global->allocator->device_runtime();
  void* stream = nullptr;
  REQUIRE(capalloc_stream_create(0, &stream) == CAPALLOC_OK);
  const auto s = reinterpret_cast<StreamHandle>(stream);
  constexpr std::size_t kBytes = std::size_t{1} << 20;

  // torch.cuda.graph: begin capture natively, then PyTorch's calls only.
  REQUIRE_OK(rt.begin_capture(s, CaptureMode::kGlobal));
  void* t = capalloc_torch_malloc(kBytes, 0, stream);
  REQUIRE(t != nullptr);
  capalloc_torch_free(t, kBytes, 0, stream);
  void* ws = capalloc_torch_malloc(kBytes, 0, stream);
  CHECK(ws == t);
  REQUIRE_OK(rt.end_capture(s));

  const char* json = nullptr;
  REQUIRE(capalloc_check(&json) == CAPALLOC_OK);
  const std::string findings = json;
  CHECK(findings.find("\"evidence\":\"footprint\"") != std::string::npos);
  CHECK(findings.find("\"severity\":\"possible\"") != std::string::npos);
  capalloc_torch_free(ws, kBytes, 0, stream);
  CHECK(capalloc_check_invariants() == CAPALLOC_OK);
  REQUIRE(capalloc_stream_destroy(stream) == CAPALLOC_OK);
}

// Issue 9, class 3a: several native captures checked once. The first makes
// thousands of allocations, enough to prune the tracker's history while its
// record is built; the second's frees must survive that prune, or its hazard
// is lost.
TEST_CASE("native captures checked once: a busy capture does not prune the next one's history",
          "[capture][discovered][prune]") {
  auto rt = capalloc::testing::host_runtime();
  auto alloc = capalloc::testing::make_allocator(rt);
  auto tracker = CaptureTracker::create(*alloc);
  REQUIRE_OK(tracker);
  const StreamHandle s = *rt->create_stream(0);
  constexpr std::size_t kBytes = std::size_t{1} << 16;

  REQUIRE_OK(rt->begin_capture(s, CaptureMode::kGlobal));
  for (int i = 0; i < 6000; ++i) {
    void* p = *alloc->allocate(512, 0, s, {.tag = "busy"});
    REQUIRE_OK(alloc->deallocate(p));
  }
  auto busy = rt->end_capture(s);
  REQUIRE_OK(busy);

  auto id = rt->begin_capture(s, CaptureMode::kGlobal);
  REQUIRE_OK(id);
  void* t = *alloc->allocate(kBytes, 0, s, {.tag = "T"});
  REQUIRE_OK(alloc->deallocate(t));
  void* ws = *alloc->allocate(kBytes, 0, s, {.tag = "WS"});
  REQUIRE(ws == t);
  auto second = rt->end_capture(s);
  REQUIRE_OK(second);

  const std::vector<Finding> findings = (*tracker)->check();
  int on_ws = 0;
  for (const Finding& f : findings) {
    if (f.victim.tag == "WS" && f.writer.tag == "T" && f.capture == *id) ++on_ws;
  }
  CHECK(on_ws == 1);

  REQUIRE_OK(alloc->deallocate(ws));
  REQUIRE_OK(rt->destroy_graph(*busy));
  REQUIRE_OK(rt->destroy_graph(*second));
  REQUIRE_OK(rt->destroy_stream(s));
}

// Issue 9, class 4, and graph lifetime on the PyTorch path: a native capture
// that ends without a graph leaves no finding, and its pool goes back once its
// blocks are freed; a native graph that is destroyed takes its record and
// findings with it, and its pool goes back too.
TEST_CASE("an invalidated native capture leaves no finding and its pool goes back",
          "[capture][discovered][lifetime]") {
  auto rt = capalloc::testing::host_runtime();
  auto alloc = capalloc::testing::make_allocator(rt);
  auto tracker = CaptureTracker::create(*alloc);
  REQUIRE_OK(tracker);
  const StreamHandle s = *rt->create_stream(0);
  constexpr std::size_t kBytes = std::size_t{1} << 16;

  REQUIRE_OK(rt->begin_capture(s, CaptureMode::kGlobal));
  void* t = *alloc->allocate(kBytes, 0, s, {.tag = "T"});
  REQUIRE_OK(alloc->deallocate(t));
  void* ws = *alloc->allocate(kBytes, 0, s, {.tag = "WS"});
  REQUIRE(ws == t);
  const PoolHandle pool = alloc->block_info(ws)->pool;
  CHECK(rt->synchronize_stream(s).code() == absl::StatusCode::kFailedPrecondition);
  CHECK_FALSE(rt->end_capture(s).ok());  // no graph

  CHECK((*tracker)->check().empty());
  CHECK(alloc->pool_stats(pool).ok());  // WS still lives there
  REQUIRE_OK(alloc->deallocate(ws));
  CHECK(alloc->pool_stats(pool).status().code() == absl::StatusCode::kNotFound);
  CHECK((*tracker)->check().empty());
  REQUIRE_OK(alloc->CheckInvariants());
  REQUIRE_OK(rt->destroy_stream(s));
}

TEST_CASE("a destroyed native graph takes its record and findings with it",
          "[capture][discovered][lifetime]") {
  auto rt = capalloc::testing::host_runtime();
  auto alloc = capalloc::testing::make_allocator(rt);
  auto tracker = CaptureTracker::create(*alloc);
  REQUIRE_OK(tracker);
  const StreamHandle s = *rt->create_stream(0);
  constexpr std::size_t kBytes = std::size_t{1} << 16;

  auto id = rt->begin_capture(s, CaptureMode::kGlobal);
  REQUIRE_OK(id);
  void* t = *alloc->allocate(kBytes, 0, s, {.tag = "T"});
  REQUIRE_OK(alloc->deallocate(t));
  void* ws = *alloc->allocate(kBytes, 0, s, {.tag = "WS"});
  const PoolHandle pool = alloc->block_info(ws)->pool;
  auto graph = rt->end_capture(s);
  REQUIRE_OK(graph);
  REQUIRE((*tracker)->check().size() == 1);
  const GraphHandle record_handle = detail::kDiscoveredGraph | *id;
  CHECK((*tracker)->write_record(record_handle).ok());

  REQUIRE_OK(rt->destroy_graph(*graph));
  CHECK((*tracker)->check().empty());
  CHECK((*tracker)->write_record(record_handle).status().code() == absl::StatusCode::kNotFound);
  REQUIRE_OK(alloc->deallocate(ws));
  CHECK(alloc->pool_stats(pool).status().code() == absl::StatusCode::kNotFound);
  REQUIRE_OK(alloc->CheckInvariants());
  REQUIRE_OK(rt->destroy_stream(s));
}

