// capture_lifecycle_test.cpp: what captures do to the allocator's state on
// the host runtime (DESIGN.md sections 4 and 5): persistent requests refused
// while a capture is active (device or stream scope), a capture invalidated
// mid-way (its blocks stay live and accounted), blocks freed after their
// capture whose
// memory a later capture reuses (the tracker must not keep blaming them),
// frees deferred by a capture until its end and the stream's work, and the
// persistent cache around captures.
// These are the paths a wrong answer or a leak would hide in, so each test
// checks the stats and CheckInvariants, not just the status codes.
#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "capalloc/persistent_cache.hpp"
#include "capture_test_support.hpp"
#include "tools/scenarios/kernels.hpp"

using namespace capalloc;
using namespace capalloc::testing;
using capalloc::scenarios::fill_kernel;
using capalloc::scenarios::scale_kernel;

namespace {

constexpr std::size_t N = 4096;  // floats per tensor: 16 KiB, a small-segment request
constexpr std::size_t kBytes = N * sizeof(float);

// Every finding in one string, for INFO.
std::string summaries(const std::vector<Finding>& findings) {
  std::string out;
  for (const Finding& f : findings) out += f.summary() + "\n";
  return out;
}

constexpr AllocOptions kPersistentWs{.lifetime = Lifetime::kPersistent, .tag = "ws"};

}  // namespace

TEST_CASE("a persistent request is refused on every stream of a device while it captures",
          "[capture][persistent]") {
  World w;
  const StreamHandle other = w.stream();
  const PoolHandle pool = *w.alloc->create_graph_pool(0);
  auto began = w.tracker->begin_capture(0, w.side, {.pool = pool, .label = "g"});
  REQUIRE_OK(began);
  const AllocatorStats before = *w.alloc->stats(0);
  const AllocatorStats pool_before = *w.alloc->pool_stats(pool);

  // Device scope (the default): the request need not be on the capturing
  // stream, since the capture may still allocate where the block would land.
  for (const StreamHandle s : {kDefaultStream, other, w.side}) {
    auto p = w.alloc->allocate(kBytes, 0, s, kPersistentWs);
    REQUIRE_FALSE(p.ok());
    CHECK(p.status().code() == absl::StatusCode::kFailedPrecondition);
    const std::string message(p.status().message());
    CHECK_THAT(message, Catch::Contains("'ws'"));
    CHECK_THAT(message, Catch::Contains(absl::StrCat("capture ", *began)));
    CHECK_THAT(message, Catch::Contains("preallocate"));
  }
  CHECK(same_state(before, *w.alloc->stats(0)));
  CHECK(same_state(pool_before, *w.alloc->pool_stats(pool)));
  // A transient request elsewhere is not refused.
  float* transient = w.tensor(N, other, "transient");
  CHECK(w.alloc->block_info(transient)->pool == kDefaultPool);
  REQUIRE_OK(w.tracker->end_capture(w.side));

  // After the capture the same request is served.
  auto p = w.alloc->allocate(kBytes, 0, kDefaultStream, kPersistentWs);
  REQUIRE_OK(p);
  CHECK(w.alloc->block_info(*p)->lifetime == Lifetime::kPersistent);
  CHECK(w.alloc->block_info(*p)->pool == kDefaultPool);
  w.free(*p);
  w.free(transient);
  REQUIRE_OK(w.alloc->CheckInvariants());
}

TEST_CASE("with stream scope a persistent request is refused only on the capturing stream",
          "[capture][persistent]") {
  AllocatorOptions options;
  options.capture_guard_scope = CaptureGuardScope::kStream;
  World w(options);
  auto began = w.tracker->begin_capture(0, w.side, {.label = "g"});
  REQUIRE_OK(began);
  auto p = w.alloc->allocate(kBytes, 0, kDefaultStream, kPersistentWs);
  REQUIRE_OK(p);
  const BlockInfo info = *w.alloc->block_info(*p);
  CHECK(info.pool == kDefaultPool);  // persistent blocks never come from a graph pool
  CHECK(info.capture == 0);
  CHECK(info.lifetime == Lifetime::kPersistent);

  auto refused = w.alloc->allocate(kBytes, 0, w.side, kPersistentWs);
  REQUIRE_FALSE(refused.ok());
  CHECK(refused.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK_THAT(std::string(refused.status().message()),
             Catch::Contains(absl::StrCat("capture ", *began)));
  auto done = w.tracker->end_capture(w.side);
  REQUIRE_OK(done);
  CHECK(done->new_findings.empty());
  w.free(*p);
  REQUIRE_OK(w.alloc->CheckInvariants());
}

TEST_CASE("an invalidated capture fails to end and its blocks stay live and accounted",
          "[capture][abort]") {
  World w;
  const PoolHandle pool = *w.alloc->create_graph_pool(0);
  float* src = w.tensor(N, kDefaultStream, "src");
  auto began = w.tracker->begin_capture(0, w.side, {.pool = pool, .label = "aborted"});
  REQUIRE_OK(began);
  float* t = w.tensor(N, w.side, "T");
  w.launch(w.side, scale_kernel(t, src, N, 2.0f));
  // Synchronizing a capturing stream is illegal and invalidates the capture.
  CHECK_FALSE(w.rt->synchronize_stream(w.side).ok());
  CHECK(w.rt->capture_info(w.side)->status == CaptureStatus::kInvalidated);
  float* late = w.tensor(N, w.side, "late");  // still routed to the capture's pool
  auto ended = w.tracker->end_capture(w.side);
  REQUIRE_FALSE(ended.ok());
  CHECK(ended.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK_THAT(std::string(ended.status().message()), Catch::Contains("invalidated"));

  REQUIRE_OK(w.alloc->CheckInvariants());
  for (const float* p : {t, late}) {
    const BlockInfo info = *w.alloc->block_info(p);
    CHECK(info.state == BlockState::kAllocated);
    CHECK(info.pool == pool);
    CHECK(info.capture == *began);
  }
  const AllocatorStats ps = *w.alloc->pool_stats(pool);
  CHECK(ps.allocated_blocks.current == 2);
  CHECK(ps.allocated_bytes.current == static_cast<std::int64_t>(2 * kBytes));
  const std::int64_t pool_reserved = ps.reserved_bytes.current;
  CHECK(pool_reserved > 0);
  const std::int64_t reserved_before = w.reserved();

  w.free(t);
  w.free(late);
  REQUIRE_OK(w.alloc->CheckInvariants());
  CHECK(w.pool_exists(pool));  // the caller's handle still holds it
  CHECK(w.reserved() == reserved_before);
  REQUIRE_OK(w.alloc->release_graph_pool(pool));
  CHECK_FALSE(w.pool_exists(pool));
  CHECK(w.reserved() == reserved_before - pool_reserved);

  // The stream captures normally again, and X (which may land where T was,
  // if the runtime maps the released segment there again) is not blamed on
  // the aborted capture's T, freed since.
  const CaptureResult again = w.capture(kDefaultPool, "again", [&] {
    float* x = w.tensor(N, w.side, "X");
    w.launch(w.side, fill_kernel(x, N, 1.0f));
  });
  INFO(summaries(again.new_findings));
  CHECK(again.new_findings.empty());
  REQUIRE_OK(w.alloc->CheckInvariants());
}

TEST_CASE("an output freed after its capture is not blamed when a later capture reuses its memory",
          "[capture][shared-pool]") {
  // vLLM's pattern: g1's output is read, then freed outside any capture; g2
  // (same pool) allocates X where it was and writes all of X. The only real
  // overwrite is g1's replay writing into X (cross-graph). g2 writes X only
  // through X, so it must not be a hazard, or strict mode would refuse a
  // perfectly safe replay.
  World w;
  const PoolHandle pool = *w.alloc->create_graph_pool(0);
  float* out1 = nullptr;
  const CaptureResult g1 = w.capture(pool, "g1", [&] {
    out1 = w.tensor(N, w.side, "OUT1");
    w.launch(w.side, fill_kernel(out1, N, 1.0f));
  });
  CHECK(g1.new_findings.empty());
  w.free(out1);  // outside any capture
  float* x = nullptr;
  const CaptureResult g2 = w.capture(pool, "g2", [&] {
    x = w.tensor(N, w.side, "X");
    w.launch(w.side, fill_kernel(x, N, 2.0f));
  });
  REQUIRE(x == out1);
  INFO(summaries(g2.new_findings));
  const WriteRecord r2 = *w.tracker->write_record(g2.graph);
  CHECK(r2.writes.size() == 1);
  for (const RecordedWrite& rw : r2.writes) CHECK(rw.writer.tag == "X");  // not OUT1, long freed
  CHECK(g2.new_findings.size() == 1);
  for (const Finding& f : g2.new_findings) {
    CHECK(f.graph == g1.graph);  // g1 still writes X through OUT1: that one is real
    CHECK(f.severity == Severity::kCrossGraphOutput);
  }
  const std::vector<ChainLink> chain = w.tracker->reuse_chain(0, {x, kBytes});
  REQUIRE(chain.size() == 2);
  CHECK_FALSE(chain[0].live);  // OUT1
  w.tracker->set_strict(true);
  CHECK_OK(w.tracker->replay(g2.graph, kDefaultStream));
  REQUIRE_OK(w.rt->synchronize_stream(kDefaultStream));
  CHECK(all_equal(w.read(x, N), 2.0f));
}

TEST_CASE("a block freed outside captures is not blamed when its memory is reused",
          "[capture][default-pool]") {
  // The same question for a block allocated outside any capture: the tracker
  // meets B because g1 writes it; B is freed outside captures; during g2, C
  // takes B's address in the default pool (allocated on the default stream,
  // as the capture allows) and g2 writes C, through C only.
  World w;
  float* b = w.tensor(N, kDefaultStream, "B");
  const CaptureResult g1 = w.capture(kDefaultPool, "g1", [&] {
    w.launch(w.side, fill_kernel(b, N, 1.0f));
  });
  CHECK(g1.new_findings.empty());
  REQUIRE_OK(w.tracker->destroy_graph(g1.graph));
  w.free(b);  // outside any capture
  float* c = nullptr;
  const CaptureResult g2 = w.capture(kDefaultPool, "g2", [&] {
    c = w.tensor(N, kDefaultStream, "C");
    w.launch(w.side, fill_kernel(c, N, 2.0f));
  });
  REQUIRE(c == b);
  INFO(summaries(g2.new_findings));
  const WriteRecord r2 = *w.tracker->write_record(g2.graph);
  CHECK(r2.writes.size() == 1);
  for (const RecordedWrite& rw : r2.writes) CHECK(rw.writer.tag == "C");  // not B, freed
  CHECK(g2.new_findings.empty());
}

TEST_CASE("a free deferred by a capture waits for its end and the stream's work",
          "[capture][deferred]") {
  World w;
  const StreamHandle owner = w.stream();
  float* b = w.tensor(N, owner, "B");
  // B is in use on the side stream: a kernel there reads it and is held by
  // the gate until the test says so.
  Gate gate;
  w.launch(w.side, gate.kernel(b, kBytes));
  REQUIRE_OK(w.alloc->record_stream(b, w.side));

  const CaptureResult g = w.capture(kDefaultPool, "defers", [&] {
    float* t = w.tensor(N, w.side, "T");
    w.launch(w.side, fill_kernel(t, N, 1.0f));
    // The side stream is capturing: an event recorded there would join the
    // graph, so the free is deferred, not recorded.
    w.free(b);
    CHECK(w.alloc->block_info(b)->state == BlockState::kPendingFree);
    CHECK(w.alloc->stats(0)->pending_free_blocks == 1);
    // An allocation polls pending frees; it must neither query nor record.
    float* u = w.tensor(N, w.side, "U");
    w.free(u);
  });  // end_capture succeeding proves no event broke the capture
  CHECK(g.new_findings.empty());

  // The capture is over but the side stream has not reached the free yet.
  CHECK(w.alloc->block_info(b)->state == BlockState::kPendingFree);
  float* q = w.tensor(N, owner, "Q");
  CHECK(q != b);
  w.free(q);

  gate.open();
  REQUIRE_OK(w.rt->synchronize_stream(w.side));
  float* again = w.tensor(N, owner, "again");
  CHECK(again == b);  // reusable on its own stream now
  CHECK(w.alloc->block_info(again)->state == BlockState::kAllocated);
  CHECK(w.alloc->stats(0)->pending_free_blocks == 0);
  REQUIRE_OK(w.alloc->CheckInvariants());
  w.free(again);
}

TEST_CASE("the persistent cache is warmed before captures and never allocates in one",
          "[capture][persistent-cache]") {
  World w;
  PersistentCache cache(*w.alloc);
  auto ws = cache.preallocate(0, "splitk.workspace", 64 * 1024);
  REQUIRE_OK(ws);
  CHECK(*cache.get(0, "splitk.workspace") == *ws);
  CHECK(w.alloc->block_info(*ws)->lifetime == Lifetime::kPersistent);

  const PoolHandle pool = *w.alloc->create_graph_pool(0);
  auto began = w.tracker->begin_capture(0, w.side, {.pool = pool, .label = "g"});
  REQUIRE_OK(began);
  const AllocatorStats before = *w.alloc->stats(0);
  const AllocatorStats pool_before = *w.alloc->pool_stats(pool);
  CHECK(*cache.get(0, "splitk.workspace") == *ws);  // warm: fine inside a capture
  auto cold = cache.get(0, "splitk.semaphore");
  REQUIRE_FALSE(cold.ok());
  CHECK(cold.status().code() == absl::StatusCode::kNotFound);
  CHECK_THAT(std::string(cold.status().message()), Catch::Contains("preallocate"));
  CHECK_THAT(std::string(cold.status().message()), Catch::Contains("splitk.semaphore"));
  auto late = cache.preallocate(0, "splitk.semaphore", 1024);
  REQUIRE_FALSE(late.ok());
  CHECK(late.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK_THAT(std::string(late.status().message()), Catch::Contains("splitk.semaphore"));
  CHECK_THAT(std::string(late.status().message()), Catch::Contains("preallocate"));
  CHECK(same_state(before, *w.alloc->stats(0)));
  CHECK(same_state(pool_before, *w.alloc->pool_stats(pool)));
  CHECK(cache.entries().size() == 1);
  REQUIRE_OK(w.tracker->end_capture(w.side));

  // Growing a key would move a buffer graphs point at; same or smaller is a get.
  auto bigger = cache.preallocate(0, "splitk.workspace", 128 * 1024);
  REQUIRE_FALSE(bigger.ok());
  CHECK(bigger.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK(*cache.preallocate(0, "splitk.workspace", 64 * 1024) == *ws);
  CHECK(*cache.preallocate(0, "splitk.workspace", 1024) == *ws);
  CHECK(w.alloc->stats(0)->allocated_blocks.current == 1);

  REQUIRE_OK(cache.release(0, "splitk.workspace"));
  CHECK(cache.get(0, "splitk.workspace").status().code() == absl::StatusCode::kNotFound);
  CHECK(cache.entries().empty());
  CHECK(w.alloc->stats(0)->allocated_blocks.current == 0);
  REQUIRE_OK(w.alloc->release_graph_pool(pool));
  REQUIRE_OK(w.alloc->CheckInvariants());
}

// The tracker's event log is guarded by the allocator's lock (the listener
// appends under it; drain_log swaps under it, lent through
// with_listener_lock): draining on one thread while another allocates and
// frees in the capture must lose no event and race on nothing (run under
// the tsan preset too).
TEST_CASE("the event log is drained while another thread allocates in the capture",
          "[capture][threads]") {
  World w;
  const PoolHandle pool = *w.alloc->create_graph_pool(0);
  auto began = w.tracker->begin_capture(0, w.side, {.pool = pool, .label = "g"});
  REQUIRE_OK(began);
  constexpr int kPairs = 3000;
  std::atomic<bool> done{false};
  std::atomic<int> failures{0};
  std::thread worker([&] {
    for (int i = 0; i < kPairs; ++i) {
      auto p = w.alloc->allocate(kBytes, 0, w.side);
      if (!p.ok() || !w.alloc->deallocate(*p).ok()) ++failures;
    }
    done = true;
  });
  std::size_t drains = 0;
  while (!done) {
    // reuse_chain drains the log first; its answer is not checked here.
    w.tracker->reuse_chain(0, MemorySpan{nullptr, 1});
    ++drains;
  }
  worker.join();
  INFO("drains during the allocations: " << drains);
  CHECK(failures == 0);
  auto ended = w.tracker->end_capture(w.side);
  REQUIRE_OK(ended);
  CHECK(ended->new_findings.empty());
  // Every allocation of the capture was logged and noted: the record holds
  // the capture's blocks (all freed), and the pool is empty.
  CHECK(w.alloc->pool_stats(pool)->allocated_blocks.current == 0);
  CHECK(w.tracker->work().blocks >= static_cast<std::uint64_t>(2 * kPairs));
  REQUIRE_OK(w.alloc->CheckInvariants());
  REQUIRE_OK(w.tracker->destroy_graph(ended->graph));
  REQUIRE_OK(w.alloc->release_graph_pool(pool));
}
