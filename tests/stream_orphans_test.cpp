// A destroyed stream's segments (docs/design.md "Stream lifetimes"): kept
// as orphans in indexes no stream allocates from, adopted by the next
// stream that needs a segment of their class and size (best fit, an
// oversize one at most 1/8 larger), given back by empty_cache and the
// out-of-memory retry, never released inside an allocation or a free. Cases
// from an adversarial review of the first version (2026-12-07), which let a
// new stream given the dead one's handle keep allocating from the orphans,
// let a small request pin a huge orphan, and counted orphans in the
// oversize cached-share rule.
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "capalloc/allocator.hpp"
#include "capalloc/capture.hpp"
#include "forwarding_runtime.hpp"
#include "test_support.hpp"

using namespace capalloc;
using capalloc::testing::host_runtime;
using capalloc::testing::overlaps;
using capalloc::testing::make_allocator;
using capalloc::testing::slow_fill;

namespace {
constexpr std::size_t MiB = std::size_t{1} << 20;
}  // namespace

TEST_CASE("orphans: a small oversize request leaves a huge orphan for the out-of-memory retry",
          "[orphan]") {
  auto rt = host_runtime((std::size_t{1} << 30) + 64 * MiB);
  auto alloc = make_allocator(rt);
  StreamHandle x = *rt->create_stream(0), z = *rt->create_stream(0), w = *rt->create_stream(0);
  auto big = alloc->allocate(std::size_t{1} << 30, 0, x);
  REQUIRE_OK(big);
  REQUIRE_OK(alloc->deallocate(*big));
  REQUIRE_OK(rt->destroy_stream(x));
  auto small = alloc->allocate(3 * MiB, 0, z);  // oversize class (> 2 MiB)
  REQUIRE_OK(small);
  // A 4 MiB segment of its own: the 1 GiB orphan stays whole.
  CHECK(alloc->block_info(*small)->size == 3 * MiB);
  CHECK(alloc->stats(0)->reserved_bytes.current == std::int64_t{(1 << 30) + (4 << 20)});
  REQUIRE_OK(alloc->CheckInvariants());
  // Another stream's 512 MiB: the device has 1 GiB + 64 MiB, so the
  // out-of-memory retry gives the orphan back and the request fits.
  auto mid = alloc->allocate(512 * MiB, 0, w);
  CHECK_OK(mid);
  CHECK(alloc->stats(0)->retries == 1);
  REQUIRE_OK(alloc->empty_cache());
  INFO("reserved after empty_cache: " << alloc->stats(0)->reserved_bytes.current);
  CHECK(alloc->stats(0)->reserved_bytes.current <= std::int64_t{600} << 20);
  REQUIRE_OK(alloc->CheckInvariants());
}

TEST_CASE("orphans: the smallest orphan that fits is adopted", "[orphan]") {
  auto rt = host_runtime();
  auto alloc = make_allocator(rt);
  StreamHandle x = *rt->create_stream(0), y = *rt->create_stream(0), z = *rt->create_stream(0);
  auto huge = alloc->allocate(256 * MiB, 0, x);
  auto fit = alloc->allocate(4 * MiB, 0, y);
  REQUIRE_OK(huge);
  REQUIRE_OK(fit);
  REQUIRE_OK(alloc->deallocate(*huge));
  REQUIRE_OK(alloc->deallocate(*fit));
  REQUIRE_OK(rt->destroy_stream(x));
  REQUIRE_OK(rt->destroy_stream(y));
  auto p = alloc->allocate(4 * MiB, 0, z);
  REQUIRE_OK(p);
  CHECK(*p == *fit);  // the 4 MiB orphan, not a 4 MiB piece of the 256 MiB one
  REQUIRE_OK(alloc->CheckInvariants());
}

TEST_CASE("orphans: a pending free on a live stream holds its orphan until the event", "[orphan]") {
  auto rt = host_runtime();
  auto alloc = make_allocator(rt);
  StreamHandle x = *rt->create_stream(0), b = *rt->create_stream(0), z = *rt->create_stream(0);
  for (std::size_t bytes : {std::size_t{4096}, 1536 * 1024ul, 4 * MiB}) {
    auto p = alloc->allocate(bytes, 0, x);
    REQUIRE_OK(p);
    REQUIRE_OK(alloc->record_stream(*p, b));
    auto flag = std::make_shared<std::atomic<bool>>(false);
    KernelLaunch k = slow_fill(*p, bytes, 7, std::chrono::milliseconds(200));
    auto body = k.host_body;
    k.host_body = [body, flag] { body(); flag->store(true); };
    REQUIRE_OK(rt->launch_kernel(b, k));
    const bool free_after = bytes == 4096;
    if (!free_after) REQUIRE_OK(alloc->deallocate(*p));
    REQUIRE_OK(rt->destroy_stream(x));
    if (free_after) REQUIRE_OK(alloc->deallocate(*p));
    REQUIRE_OK(alloc->CheckInvariants());
    auto q = alloc->allocate(bytes, 0, z);
    REQUIRE_OK(q);
    INFO("bytes " << bytes);
    if (!flag->load()) CHECK_FALSE(overlaps(*p, bytes, *q, bytes));
    REQUIRE_OK(rt->synchronize_stream(b));
    REQUIRE_OK(alloc->deallocate(*q));
    REQUIRE_OK(alloc->CheckInvariants());
    x = *rt->create_stream(0);
  }
}

TEST_CASE("orphans: a dead stream's quick-cached blocks are merged and adopted",
          "[orphan]") {
  auto rt = host_runtime();
  auto alloc = make_allocator(rt);
  StreamHandle x = *rt->create_stream(0), z = *rt->create_stream(0);
  std::vector<void*> ps;
  for (int i = 0; i < 64; ++i) ps.push_back(*alloc->allocate(4096 + 512 * (i % 7), 0, x));
  for (void* p : ps) REQUIRE_OK(alloc->deallocate(p));
  const auto before = *alloc->stats(0);
  REQUIRE_OK(rt->destroy_stream(x));
  REQUIRE_OK(alloc->CheckInvariants());
  auto q = alloc->allocate(4096, 0, z);
  REQUIRE_OK(q);
  const auto after = *alloc->stats(0);
  CHECK(after.reserved_bytes.current == before.reserved_bytes.current);
  CHECK(after.segments.current == before.segments.current);
  CHECK(after.free_blocks == 1);
  REQUIRE_OK(alloc->CheckInvariants());
  REQUIRE_OK(alloc->deallocate(*q));
  REQUIRE_OK(alloc->empty_cache());
  CHECK(alloc->stats(0)->reserved_bytes.current == 0);
  CHECK(alloc->stats(0)->free_blocks == 0);
  REQUIRE_OK(alloc->CheckInvariants());
}

TEST_CASE("orphans: several streams destroyed at once, every size class", "[orphan]") {
  auto rt = host_runtime();
  auto alloc = make_allocator(rt);
  std::vector<StreamHandle> dead;
  std::vector<void*> held;
  for (int i = 0; i < 6; ++i) {
    StreamHandle s = *rt->create_stream(0);
    dead.push_back(s);
    // Small, large and oversize (a small oversize request would not adopt a
    // 40 MiB orphan: the first case).
    for (std::size_t bytes : {std::size_t{1000}, 1500 * 1024ul, 40 * MiB}) {
      auto p = alloc->allocate(bytes, 0, s);
      REQUIRE_OK(p);
      if (i % 2) held.push_back(*p); else REQUIRE_OK(alloc->deallocate(*p));
    }
  }
  for (StreamHandle s : dead) REQUIRE_OK(rt->destroy_stream(s));
  REQUIRE_OK(alloc->CheckInvariants());
  const auto reserved = alloc->stats(0)->reserved_bytes.current;
  StreamHandle z = *rt->create_stream(0);
  std::vector<void*> zs;
  for (std::size_t bytes : {std::size_t{1000}, 1500 * 1024ul, 40 * MiB}) {
    auto p = alloc->allocate(bytes, 0, z);
    REQUIRE_OK(p);
    zs.push_back(*p);
    REQUIRE_OK(alloc->CheckInvariants());
  }
  CHECK(alloc->stats(0)->reserved_bytes.current == reserved);
  for (void* p : held) REQUIRE_OK(alloc->deallocate(p));
  REQUIRE_OK(alloc->CheckInvariants());
  for (void* p : zs) REQUIRE_OK(alloc->deallocate(p));
  REQUIRE_OK(alloc->empty_cache());
  REQUIRE_OK(alloc->CheckInvariants());
  CHECK(alloc->stats(0)->reserved_bytes.current == 0);
  CHECK(alloc->stats(0)->segments.current == 0);
}

TEST_CASE("orphans: a device's orphans serve only that device", "[orphan]") {
  auto rt = host_runtime(std::size_t{16} << 30, 2);
  auto alloc = make_allocator(rt);
  StreamHandle x1 = *rt->create_stream(1), z0 = *rt->create_stream(0), z1 = *rt->create_stream(1);
  auto p = alloc->allocate(4 * MiB, 1, x1);
  REQUIRE_OK(p);
  REQUIRE_OK(alloc->deallocate(*p));
  REQUIRE_OK(rt->destroy_stream(x1));
  auto q0 = alloc->allocate(4 * MiB, 0, z0);
  REQUIRE_OK(q0);
  CHECK(*q0 != *p);
  auto q1 = alloc->allocate(4 * MiB, 1, z1);
  REQUIRE_OK(q1);
  CHECK(*q1 == *p);
  CHECK(alloc->stats(1)->reserved_bytes.current == 4 * MiB);
  REQUIRE_OK(alloc->CheckInvariants());
  REQUIRE_OK(alloc->deallocate(*q1));
  REQUIRE_OK(alloc->deallocate(*q0));
  REQUIRE_OK(alloc->empty_cache(1));
  CHECK(alloc->stats(1)->reserved_bytes.current == 0);
  CHECK(alloc->stats(0)->reserved_bytes.current == 4 * MiB);
  REQUIRE_OK(alloc->CheckInvariants());
}

TEST_CASE("orphans: a stream destroyed during a routed capture is adopted during it", "[orphan]") {
  auto rt = host_runtime();
  auto alloc = make_allocator(rt);
  auto tracker = *CaptureTracker::create(*alloc);
  StreamHandle x = *rt->create_stream(0), c = *rt->create_stream(0), z = *rt->create_stream(0);
  auto p = alloc->allocate(4 * MiB, 0, x);
  auto s = alloc->allocate(1000, 0, x);
  REQUIRE_OK(p);
  REQUIRE_OK(s);
  REQUIRE_OK(alloc->deallocate(*p));
  auto pool = alloc->create_graph_pool(0);
  REQUIRE_OK(pool);
  REQUIRE_OK(tracker->begin_capture(0, c, {.pool = *pool}));
  auto in_capture = alloc->allocate(4 * MiB, 0, c);
  REQUIRE_OK(in_capture);
  REQUIRE_OK(rt->destroy_stream(x));
  REQUIRE_OK(alloc->deallocate(*s));
  REQUIRE_OK(alloc->CheckInvariants());
  auto q = alloc->allocate(4 * MiB, 0, z);  // adopts during the capture
  REQUIRE_OK(q);
  CHECK(*q == *p);
  auto qs = alloc->allocate(1000, 0, z);
  REQUIRE_OK(qs);
  CHECK(*qs == *s);
  REQUIRE_OK(alloc->CheckInvariants());
  auto in_capture2 = alloc->allocate(4 * MiB, 0, c);
  REQUIRE_OK(in_capture2);
  CHECK(alloc->block_info(*in_capture2)->pool == *pool);
  REQUIRE_OK(alloc->deallocate(*in_capture));
  REQUIRE_OK(alloc->deallocate(*in_capture2));
  auto done = tracker->end_capture(c);
  REQUIRE_OK(done);
  REQUIRE_OK(alloc->CheckInvariants());
  REQUIRE_OK(alloc->deallocate(*q));
  REQUIRE_OK(alloc->deallocate(*qs));
  REQUIRE_OK(tracker->destroy_graph(done->graph));
  REQUIRE_OK(alloc->release_graph_pool(*pool));
  REQUIRE_OK(alloc->empty_cache());
  REQUIRE_OK(alloc->CheckInvariants());
  tracker.reset();
}

TEST_CASE("orphans: threads destroy streams while others allocate", "[orphan][threads]") {
  auto rt = host_runtime();
  auto alloc = make_allocator(rt);
  std::atomic<bool> failed{false};
  auto worker = [&](int seed) {
    for (int i = 0; i < 300 && !failed; ++i) {
      auto s = rt->create_stream(0);
      if (!s.ok()) { failed = true; return; }
      std::vector<void*> ps;
      for (std::size_t bytes : {std::size_t{1000} + seed, 700 * 1024ul, 3 * MiB}) {
        auto p = alloc->allocate(bytes, 0, *s);
        if (!p.ok()) { failed = true; return; }
        ps.push_back(*p);
      }
      if (i % 2) (void)rt->destroy_stream(*s);
      for (void* p : ps) if (!alloc->deallocate(p).ok()) { failed = true; return; }
      if (i % 2 == 0) (void)rt->destroy_stream(*s);
      if (i % 37 == 0) (void)alloc->empty_cache();
    }
  };
  std::vector<std::thread> ts;
  for (int t = 0; t < 3; ++t) ts.emplace_back(worker, t);
  for (auto& t : ts) t.join();
  CHECK_FALSE(failed);
  REQUIRE_OK(alloc->CheckInvariants());
  REQUIRE_OK(alloc->empty_cache());
  CHECK(alloc->stats(0)->reserved_bytes.current == 0);
  REQUIRE_OK(alloc->CheckInvariants());
}

TEST_CASE("orphans: they do not count in the oversize cached-share rule",
          "[orphan][share]") {
  for (bool with_orphans : {false, true}) {
    auto rt = host_runtime();
    auto alloc = make_allocator(rt);
    StreamHandle x = *rt->create_stream(0), z = *rt->create_stream(0);
    std::vector<void*> xs;
    for (int i = 0; i < 100; ++i) xs.push_back(*alloc->allocate(1536 * 1024, 0, x));  // 100 large segs
    for (void* p : xs) REQUIRE_OK(alloc->deallocate(p));
    if (with_orphans) {
      REQUIRE_OK(rt->destroy_stream(x));
    } else {
      REQUIRE_OK(alloc->empty_cache());  // what the report did before the commit
    }
    auto live = alloc->allocate(std::size_t{1} << 30, 0, z);  // z's working set
    REQUIRE_OK(live);
    auto a = alloc->allocate(10 * MiB, 0, z);
    REQUIRE_OK(a);
    REQUIRE_OK(alloc->deallocate(*a));
    const auto reserved = alloc->stats(0)->reserved_bytes.current;
    auto b = alloc->allocate(20 * MiB, 0, z);  // misses z's 10 MiB block
    REQUIRE_OK(b);
    INFO("with orphans " << with_orphans);
    // z's free 10 MiB segment stays cached (no release, no device sync):
    CHECK(alloc->stats(0)->reserved_bytes.current == reserved + std::int64_t{20 << 20});
    REQUIRE_OK(alloc->CheckInvariants());
  }
}

TEST_CASE("orphans: the default stream adopts a stream destroyed just before its request",
          "[orphan]") {
  // The default stream needs no check, and its requests once skipped the
  // destroyed streams' reports: they reserved anew beside the orphans.
  auto rt = host_runtime();
  auto alloc = make_allocator(rt);
  StreamHandle x = *rt->create_stream(0);
  const std::vector<std::size_t> sizes = {4096, 1536 * 1024, 40 * MiB};  // every class
  for (std::size_t bytes : sizes) {
    auto p = alloc->allocate(bytes, 0, x);
    REQUIRE_OK(p);
    REQUIRE_OK(alloc->deallocate(*p));
  }
  const auto reserved = alloc->stats(0)->reserved_bytes.current;
  REQUIRE_OK(rt->destroy_stream(x));
  std::vector<void*> held;
  for (std::size_t bytes : sizes) {
    auto q = alloc->allocate(bytes, 0, kDefaultStream);
    REQUIRE_OK(q);
    held.push_back(*q);
  }
  INFO("reserved before " << reserved << " after " << alloc->stats(0)->reserved_bytes.current);
  CHECK(alloc->stats(0)->reserved_bytes.current == reserved);
  REQUIRE_OK(alloc->CheckInvariants());
  for (void* q : held) REQUIRE_OK(alloc->deallocate(q));
}

namespace {
// Records every stream capture_info is asked about.
class CaptureInfoLog final : public capalloc::testing::ForwardingRuntime<DeviceRuntime> {
 public:
  using ForwardingRuntime::ForwardingRuntime;
  absl::StatusOr<CaptureInfo> capture_info(StreamHandle s) override {
    {
      std::lock_guard lock(mu);
      asked.push_back(s);
    }
    return in_->capture_info(s);
  }
  std::mutex mu;
  std::vector<StreamHandle> asked;
};
}  // namespace

TEST_CASE("orphans: freeing an orphan's block during a capture asks nothing of its dead stream",
          "[orphan]") {
  // A free the tracker must hear of asks the block's stream for its capture
  // position. An orphan's stream is gone: a CUDA call on a destroyed
  // stream's handle is undefined, and on kNoStream worse.
  auto host = host_runtime();
  auto rt = std::make_shared<CaptureInfoLog>(host);
  auto alloc = make_allocator(rt);
  auto tracker = *CaptureTracker::create(*alloc);
  StreamHandle x = *rt->create_stream(0), c = *rt->create_stream(0);
  auto p = alloc->allocate(4096, 0, x);
  REQUIRE_OK(p);
  REQUIRE_OK(rt->destroy_stream(x));
  auto pool = alloc->create_graph_pool(0);
  REQUIRE_OK(pool);
  REQUIRE_OK(tracker->begin_capture(0, c, {.pool = *pool}));  // a route: frees are told
  {
    std::lock_guard lock(rt->mu);
    rt->asked.clear();
  }
  REQUIRE_OK(alloc->deallocate(*p));
  {
    std::lock_guard lock(rt->mu);
    for (StreamHandle s : rt->asked) {
      CHECK(s != x);
      CHECK(s != kNoStream);
    }
  }
  auto done = tracker->end_capture(c);
  REQUIRE_OK(done);
  REQUIRE_OK(alloc->CheckInvariants());
  REQUIRE_OK(tracker->destroy_graph(done->graph));
  REQUIRE_OK(alloc->release_graph_pool(*pool));
}

namespace {
struct RecordingListener final : CaptureListener {
  std::vector<BlockEvent> events;
  void on_block_event(const BlockEvent& e) override { events.push_back(e); }
};
}  // namespace

TEST_CASE("orphans: a graph pool's block of a destroyed stream is freed asking that stream nothing",
          "[orphan][graph]") {
  // A graph pool keeps a dead stream's segments while a graph references
  // them; they belong to no stream from the report on, like the default
  // pool's orphans, but no capture adopts them (a graph may write there).
  auto host = host_runtime();
  auto rt = std::make_shared<CaptureInfoLog>(host);
  auto alloc = make_allocator(rt);
  RecordingListener heard;
  REQUIRE_OK(alloc->set_capture_listener(&heard));
  const StreamHandle s = *host->create_stream(0), t = *host->create_stream(0);
  auto pool = alloc->create_graph_pool(0);
  REQUIRE_OK(pool);
  auto cap = host->begin_capture(s, CaptureMode::kThreadLocal);
  REQUIRE_OK(cap);
  REQUIRE_OK(alloc->begin_allocate_to_pool(0, *cap, *pool, s));
  auto out = alloc->allocate(4096, 0, s);  // a graph output
  auto scratch = alloc->allocate(8192, 0, s);
  REQUIRE_OK(out);
  REQUIRE_OK(scratch);
  REQUIRE_OK(alloc->deallocate(*scratch));
  auto g = host->end_capture(s);
  REQUIRE_OK(g);
  REQUIRE_OK(alloc->end_allocate_to_pool(*cap));
  REQUIRE_OK(rt->destroy_stream(s));
  REQUIRE_OK(alloc->empty_cache());  // applies the report; the pool is referenced: kept
  CHECK(alloc->block_info(*out)->stream == kNoStream);
  {
    std::lock_guard lock(rt->mu);
    rt->asked.clear();
  }
  heard.events.clear();
  REQUIRE_OK(alloc->deallocate(*out));
  {
    std::lock_guard lock(rt->mu);
    for (StreamHandle asked : rt->asked) CHECK(asked != s);
  }
  REQUIRE(heard.events.size() == 1);
  CHECK(heard.events[0].capture == 0);
  REQUIRE_OK(alloc->CheckInvariants());
  // A capture on another stream into the same pool does not take the dead
  // stream's (now fully free) segment: the graph may still write there.
  const std::int64_t reserved = alloc->pool_stats(*pool)->reserved_bytes.current;
  auto cap2 = host->begin_capture(t, CaptureMode::kThreadLocal);
  REQUIRE_OK(cap2);
  REQUIRE_OK(alloc->begin_allocate_to_pool(0, *cap2, *pool, t));
  auto other = alloc->allocate(4096, 0, t);
  REQUIRE_OK(other);
  CHECK(alloc->pool_stats(*pool)->reserved_bytes.current > reserved);
  REQUIRE_OK(alloc->deallocate(*other));
  auto g2 = host->end_capture(t);
  REQUIRE_OK(g2);
  REQUIRE_OK(alloc->end_allocate_to_pool(*cap2));
  REQUIRE_OK(alloc->CheckInvariants());
  REQUIRE_OK(host->destroy_graph(*g));
  REQUIRE_OK(host->destroy_graph(*g2));
  REQUIRE_OK(alloc->release_graph_pool(*pool));
  REQUIRE_OK(alloc->set_capture_listener(nullptr));
  REQUIRE_OK(alloc->CheckInvariants());
}

TEST_CASE("orphans: a trace started after a destroy writes the orphan's blocks with kNoStream",
          "[orphan][trace]") {
  auto rt = host_runtime();
  auto alloc = make_allocator(rt);
  const StreamHandle s = *rt->create_stream(0);
  auto p = alloc->allocate(4096, 0, s);
  REQUIRE_OK(p);
  REQUIRE_OK(rt->destroy_stream(s));
  const std::string path =
      (std::filesystem::temp_directory_path() /
       ("capalloc_orphan_trace_" + std::to_string(::getpid()) + ".jsonl"))
          .string();
  REQUIRE_OK(alloc->start_trace(path));  // applies the report before writing the live blocks
  REQUIRE_OK(alloc->stop_trace());
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  std::filesystem::remove(path);
  INFO(text.str());
  CHECK(text.str().find("\"stream\": 18446744073709551615") != std::string::npos);
  REQUIRE_OK(alloc->deallocate(*p));
}
