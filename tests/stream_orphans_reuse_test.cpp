// A destroyed stream's handle handed to a new stream (CUDA and HIP reuse
// stream handles): the new stream owns nothing of the old one's. Its
// segments are orphans, owned by no stream (kNoStream), until adopted.
// Cases from two adversarial reviews (2026-12-07): the first let the new
// stream allocate from the orphans through the old handle's index; the
// second found that the orphans still named the old handle as their stream,
// so the new stream's record_stream on an orphan's block was taken for its
// own stream's and dropped (the block was then handed out while the new
// stream's kernel wrote it), and the oversize cached-share rule, which
// releases the requesting stream's segments, released an orphan inside an
// allocation.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <memory>
#include <vector>

#include "capalloc/allocator.hpp"
#include "reusing_runtime.hpp"
#include "test_support.hpp"

using namespace capalloc;
using capalloc::testing::host_runtime;
using capalloc::testing::overlaps;
using capalloc::testing::ReusingRuntime;
using capalloc::testing::slow_fill;

namespace {
constexpr std::size_t MiB = std::size_t{1} << 20;

std::unique_ptr<Allocator> allocator_on(std::shared_ptr<MemoryRuntime> rt) {
  auto created = Allocator::create(std::move(rt));
  REQUIRE_OK(created);
  return *std::move(created);
}

// A kernel on `stream` writing [p, p + bytes) for 300 ms; `done` turns true
// when it has run.
std::shared_ptr<std::atomic<bool>> launch_slow_fill(DeviceRuntime& rt, StreamHandle stream,
                                                    void* p, std::size_t bytes) {
  auto done = std::make_shared<std::atomic<bool>>(false);
  KernelLaunch k = slow_fill(p, bytes, 9, std::chrono::milliseconds(300));
  auto body = k.host_body;
  k.host_body = [body, done] {
    body();
    done->store(true);
  };
  REQUIRE_OK(rt.launch_kernel(stream, k));
  return done;
}
}  // namespace

TEST_CASE("orphans: a new stream given a dead stream's handle never allocates from its orphans",
          "[orphan][reuse]") {
  auto host = host_runtime();
  auto rt = std::make_shared<ReusingRuntime>(host);
  auto created = Allocator::create(rt);
  REQUIRE_OK(created);
  auto alloc = *std::move(created);
  const StreamHandle h = *host->create_stream(0), w = *host->create_stream(0);
  const std::size_t bytes = 1536 * 1024;  // large class: 4 MiB segments
  auto p = alloc->allocate(bytes, 0, h);
  REQUIRE_OK(p);
  REQUIRE_OK(alloc->deallocate(*p));
  rt->retire_and_reuse(h);  // stream X destroyed; stream Y created with X's handle
  // Y allocates: adopting the orphan (it is fully free) is fine; taking it
  // through the old handle's index, still flagged an orphan, was not.
  auto q = alloc->allocate(bytes, 0, h);
  REQUIRE_OK(q);
  REQUIRE_OK(alloc->CheckInvariants());
  // Y writes q in a slow kernel and frees it stream-ordered (no
  // record_stream needed: the block is Y's own).
  auto flag = std::make_shared<std::atomic<bool>>(false);
  KernelLaunch k = slow_fill(*q, bytes, 9, std::chrono::milliseconds(300));
  auto body = k.host_body;
  k.host_body = [body, flag] { body(); flag->store(true); };
  REQUIRE_OK(host->launch_kernel(h, k));
  REQUIRE_OK(alloc->deallocate(*q));
  // Another stream needs a large segment: it must not get memory Y's
  // queued kernel is writing.
  auto r = alloc->allocate(bytes, 0, w);
  REQUIRE_OK(r);
  const bool running = !flag->load();
  INFO("q " << *q << " r " << *r << " kernel running " << running);
  CHECK_FALSE((running && overlaps(*q, bytes, *r, bytes)));
  REQUIRE_OK(alloc->CheckInvariants());
  REQUIRE_OK(host->synchronize_stream(h));
  REQUIRE_OK(alloc->deallocate(*r));
}


TEST_CASE("orphans: record_stream by the stream given a dead handle holds the orphan's block",
          "[orphan][reuse]") {
  auto host = host_runtime();
  auto rt = std::make_shared<ReusingRuntime>(host);
  auto alloc = allocator_on(rt);
  const StreamHandle h = *host->create_stream(0), w = *host->create_stream(0);
  const std::size_t bytes = 1536 * 1024;  // large class: 4 MiB segments
  auto p = alloc->allocate(bytes, 0, h);  // the old stream's block, still allocated
  REQUIRE_OK(p);
  rt->retire_and_reuse(h);  // old stream destroyed; a new one gets handle h
  // The new stream uses p and records it, as the caching-allocator contract
  // asks of a block used on a stream other than the one it came from.
  auto done = launch_slow_fill(*host, h, *p, bytes);
  REQUIRE_OK(alloc->record_stream(*p, h));  // applies the report first
  CHECK(alloc->block_info(*p)->stream == kNoStream);
  REQUIRE_OK(alloc->deallocate(*p));
  REQUIRE_OK(alloc->CheckInvariants());
  auto r = alloc->allocate(bytes, 0, w);  // a segment of the class: the orphan, once free
  REQUIRE_OK(r);
  const bool running = !done->load();
  INFO("p " << *p << " r " << *r << " kernel still running " << running);
  CHECK_FALSE((running && overlaps(*p, bytes, *r, bytes)));
  REQUIRE_OK(host->synchronize_stream(h));
  REQUIRE_OK(alloc->deallocate(*r));
  REQUIRE_OK(alloc->CheckInvariants());
}

TEST_CASE("orphans: the oversize cached-share rule never releases an orphan of a reused handle",
          "[orphan][reuse][share]") {
  auto host = host_runtime();
  auto rt = std::make_shared<ReusingRuntime>(host);
  auto alloc = allocator_on(rt);
  const StreamHandle h = *host->create_stream(0);
  auto big = alloc->allocate(40 * MiB, 0, h);
  REQUIRE_OK(big);
  REQUIRE_OK(alloc->deallocate(*big));
  rt->retire_and_reuse(h);  // the 40 MiB segment is an orphan
  auto a = alloc->allocate(10 * MiB, 0, h);  // too small to adopt 40 MiB: a segment of its own
  REQUIRE_OK(a);
  REQUIRE_OK(alloc->deallocate(*a));
  CHECK(alloc->stats(0)->reserved_bytes.current == std::int64_t{50} << 20);
  const int releases_before = rt->releases;
  // Misses the free 10 MiB block, which is past the cached share of the
  // new stream's oversize segments: the rule gives that one back. The
  // orphan is no stream's, and stays.
  auto b = alloc->allocate(20 * MiB, 0, h);
  REQUIRE_OK(b);
  INFO("releases during the allocation: " << rt->releases - releases_before);
  CHECK(rt->releases - releases_before == 1);
  CHECK(alloc->stats(0)->reserved_bytes.current == std::int64_t{60} << 20);
  REQUIRE_OK(alloc->CheckInvariants());
  REQUIRE_OK(alloc->deallocate(*b));
  REQUIRE_OK(alloc->empty_cache());  // empty_cache gives orphans back
  CHECK(alloc->stats(0)->reserved_bytes.current == 0);
}

TEST_CASE("orphans: blocks and segments report no stream until adopted", "[orphan][reuse]") {
  auto host = host_runtime();
  auto rt = std::make_shared<ReusingRuntime>(host);
  auto alloc = allocator_on(rt);
  const StreamHandle h = *host->create_stream(0), w = *host->create_stream(0);
  auto held = alloc->allocate(4096, 0, h);
  auto freed = alloc->allocate(8192, 0, h);
  REQUIRE_OK(held);
  REQUIRE_OK(freed);
  REQUIRE_OK(alloc->deallocate(*freed));
  rt->retire_and_reuse(h);
  // The new stream with the old handle gets a segment of its own (the
  // allocation applies the report, as any call but a read does).
  auto mine = alloc->allocate(4096, 0, h);
  REQUIRE_OK(mine);
  CHECK(alloc->block_info(*mine)->stream == h);
  auto segments = alloc->segments(0);
  REQUIRE(segments.size() == 2);
  const auto orphan = std::find_if(segments.begin(), segments.end(),
                                   [](const SegmentInfo& s) { return s.stream == kNoStream; });
  REQUIRE(orphan != segments.end());
  CHECK(std::count_if(segments.begin(), segments.end(),
                      [&](const SegmentInfo& s) { return s.stream == h; }) == 1);
  REQUIRE(orphan->blocks.size() == 2);  // `held`, and the free rest (`freed` merged into it)
  for (const BlockInfo& b : orphan->blocks) CHECK(b.stream == kNoStream);
  CHECK(alloc->block_info(*held)->stream == kNoStream);
  REQUIRE_OK(alloc->deallocate(*held));  // the orphan is fully free
  REQUIRE_OK(alloc->deallocate(*mine));
  // w has no segment: it adopts the orphan (the new stream's segment is
  // that stream's), which then reports w.
  auto adopted = alloc->allocate(4096, 0, w);
  REQUIRE_OK(adopted);
  CHECK(alloc->block_info(*adopted)->stream == w);
  CHECK(alloc->stats(0)->segments.current == 2);
  for (const SegmentInfo& s : alloc->segments(0)) CHECK(s.stream != kNoStream);
  REQUIRE_OK(alloc->deallocate(*adopted));
  REQUIRE_OK(alloc->CheckInvariants());
}

namespace {
struct RecordingListener final : CaptureListener {
  std::vector<BlockEvent> events;
  void on_block_event(const BlockEvent& e) override { events.push_back(e); }
};
}  // namespace

TEST_CASE("orphans: a graph output of a dead stream is not freed into a capture of its handle",
          "[orphan][reuse][graph]") {
  // The free of a capture's block tells the listener the capture position
  // of the block's stream. The stream is dead and its handle now names a
  // new stream in an unrelated capture: that capture must not be named
  // (the tracker would take the block for one freed inside it).
  auto host = host_runtime();
  auto rt = std::make_shared<ReusingRuntime>(host);
  auto alloc = allocator_on(rt);
  RecordingListener heard;
  REQUIRE_OK(alloc->set_capture_listener(&heard));
  const StreamHandle h = *host->create_stream(0);
  auto pool = alloc->create_graph_pool(0);
  REQUIRE_OK(pool);
  auto first = host->begin_capture(h, CaptureMode::kThreadLocal);
  REQUIRE_OK(first);
  REQUIRE_OK(alloc->begin_allocate_to_pool(0, *first, *pool, h));
  auto out = alloc->allocate(4096, 0, h);
  REQUIRE_OK(out);
  auto g1 = host->end_capture(h);
  REQUIRE_OK(g1);
  REQUIRE_OK(alloc->end_allocate_to_pool(*first));
  rt->retire_and_reuse(h);
  auto second = host->begin_capture(h, CaptureMode::kRelaxed);  // the new stream's, unrouted
  REQUIRE_OK(second);
  heard.events.clear();
  REQUIRE_OK(alloc->deallocate(*out));
  REQUIRE(heard.events.size() == 1);
  INFO("free reported in capture " << heard.events[0].capture << "; the new stream's is "
                                   << *second);
  CHECK(heard.events[0].capture == 0);
  CHECK(heard.events[0].block.stream == kNoStream);
  auto g2 = host->end_capture(h);
  REQUIRE_OK(alloc->CheckInvariants());
  if (g2.ok()) REQUIRE_OK(host->destroy_graph(*g2));
  REQUIRE_OK(host->destroy_graph(*g1));
  REQUIRE_OK(alloc->release_graph_pool(*pool));
  REQUIRE_OK(alloc->set_capture_listener(nullptr));
}
