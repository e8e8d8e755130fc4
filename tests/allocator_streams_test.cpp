// Stream-ordered reuse on the host runtime: a block used on another stream
// (record_stream) is not handed out again until the work enqueued on that
// stream before the free has run. Proven with a kernel that keeps checking a
// cookie in the block while the host frees and reallocates.
#include <atomic>
#include <chrono>
#include <future>
#include <thread>

#include "reusing_runtime.hpp"
#include "test_support.hpp"

using namespace capalloc;
using capalloc::testing::host_runtime;
using capalloc::testing::make_allocator;

namespace {

constexpr std::size_t kBlock = std::size_t{1} << 20;
constexpr std::uint64_t kCookie = 0xC0FFEE;

// A kernel on `stream` that reads the cookie in `p` until `stop` is set
// (or 2 s pass), counting the reads that found it damaged.
struct CookieReader {
  std::promise<void> started;
  std::atomic<bool> stop{false};
  std::atomic<int> damaged_reads{0};
  std::atomic<bool> finished{false};

  KernelLaunch kernel(void* p) {
    KernelLaunch k;
    k.name = "cookie_reader";
    k.reads = {{p, kBlock}};
    k.host_body = [this, p] {
      started.set_value();
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
      while (!stop.load() && std::chrono::steady_clock::now() < deadline) {
        if (!capalloc::testing::cookie_intact(p, 256, kCookie)) ++damaged_reads;
        std::this_thread::sleep_for(std::chrono::microseconds(200));
      }
      finished.store(true);
    };
    return k;
  }
};

// A block allocated on `owner`, read by a kernel on `reader_stream` and
// recorded on it, then freed: it stays pending while the kernel runs (the
// requests of its size on `owner` get other memory, which is scribbled
// over without reaching the reader), and is free again once the reader's
// stream has passed the free's event.
void check_free_waits_for_reader(Allocator& alloc, DeviceRuntime& rt, StreamHandle owner,
                                 StreamHandle reader_stream) {
  void* p = *alloc.allocate(kBlock, 0, owner);
  capalloc::testing::write_cookie(p, 256, kCookie);
  CookieReader reader;
  REQUIRE_OK(rt.launch_kernel(reader_stream, reader.kernel(p)));
  reader.started.get_future().wait();

  REQUIRE_OK(alloc.record_stream(p, reader_stream));
  REQUIRE_OK(alloc.deallocate(p));
  CHECK(alloc.block_info(p)->state == BlockState::kPendingFree);
  CHECK(alloc.stats(0)->pending_free_blocks == 1);

  std::vector<void*> others;
  for (int i = 0; i < 8; ++i) {
    void* q = *alloc.allocate(kBlock, 0, owner);
    CHECK(q != p);
    std::memset(q, 0x5A, kBlock);
    others.push_back(q);
  }
  reader.stop.store(true);
  REQUIRE_OK(rt.synchronize_stream(reader_stream));
  CHECK(reader.finished.load());
  CHECK(reader.damaged_reads.load() == 0);

  for (void* q : others) REQUIRE_OK(alloc.deallocate(q));
  void* again = *alloc.allocate(kBlock, 0, owner);  // processes the completed free
  CHECK(alloc.stats(0)->pending_free_blocks == 0);
  CHECK(alloc.block_info(p)->state != BlockState::kPendingFree);
  REQUIRE_OK(alloc.deallocate(again));
  REQUIRE_OK(alloc.CheckInvariants());
}

}  // namespace

TEST_CASE("record_stream: a block still read on stream B is not reused until B's kernel is done",
          "[streams]") {
  auto rt = host_runtime();
  auto alloc = make_allocator(rt);
  const StreamHandle a = *rt->create_stream(0);
  const StreamHandle b = *rt->create_stream(0);
  check_free_waits_for_reader(*alloc, *rt, a, b);
  REQUIRE_OK(rt->destroy_stream(a));
  REQUIRE_OK(rt->destroy_stream(b));
}

TEST_CASE("record_stream on another device's stream holds the free until that stream is done",
          "[streams]") {
  // PyTorch allows a tensor of device 0 to be recorded on a stream of
  // device 1; its free then waits for an event made on device 1. Before,
  // the event was made on the block's device, recording it on the other
  // device's stream failed, and every free of the block failed with it (a
  // leak behind capalloc_torch_free, which cannot report).
  auto rt = host_runtime(std::size_t{16} << 30, 2);
  auto alloc = make_allocator(rt);
  const StreamHandle a = *rt->create_stream(0);
  const StreamHandle b = *rt->create_stream(1);
  CHECK(*rt->stream_device(a) == 0);
  CHECK(*rt->stream_device(b) == 1);

  check_free_waits_for_reader(*alloc, *rt, a, b);
  REQUIRE_OK(rt->destroy_stream(a));
  REQUIRE_OK(rt->destroy_stream(b));
}

TEST_CASE("an allocation for one device on another device's stream is refused, changing nothing",
          "[streams]") {
  auto rt = host_runtime(std::size_t{16} << 30, 2);
  auto alloc = make_allocator(rt);
  const StreamHandle a = *rt->create_stream(0);
  const StreamHandle b = *rt->create_stream(1);
  // Each stream used on its own device first, so that both are known and
  // recent: the steady state must refuse them on the other device too.
  for (int round = 0; round < 2; ++round) {
    REQUIRE_OK(alloc->deallocate(*alloc->allocate(4096, 0, a)));
    REQUIRE_OK(alloc->deallocate(*alloc->allocate(4096, 1, b)));
  }
  const AllocatorStats before0 = *alloc->stats(0);
  const AllocatorStats before1 = *alloc->stats(1);
  for (std::size_t bytes : {std::size_t{4096}, kBlock, std::size_t{64} << 20}) {
    auto wrong = alloc->allocate(bytes, 1, a);
    CHECK(absl::IsInvalidArgument(wrong.status()));
    CHECK_THAT(std::string(wrong.status().message()),
               Catch::Contains("runs on device 0, not device 1"));
    CHECK(absl::IsInvalidArgument(alloc->allocate(bytes, 0, b).status()));
  }
  CHECK(capalloc::testing::same_state(before0, *alloc->stats(0)));
  CHECK(capalloc::testing::same_state(before1, *alloc->stats(1)));
  // The default stream runs on every device.
  REQUIRE_OK(alloc->deallocate(*alloc->allocate(4096, 1, kDefaultStream)));
  REQUIRE_OK(alloc->CheckInvariants());
  REQUIRE_OK(rt->destroy_stream(a));
  REQUIRE_OK(rt->destroy_stream(b));
}

TEST_CASE("a capture routed to another device's graph pool refuses its allocations",
          "[streams][capture]") {
  // Found by a review: a capture on a stream of device 0 routed to a graph
  // pool of device 1 handed out device-0 memory filed in device 1's pool
  // and stats, and the invariants broke.
  auto rt = host_runtime(std::size_t{16} << 30, 2);
  auto alloc = make_allocator(rt);
  const StreamHandle s0 = *rt->create_stream(0);
  auto pool1 = alloc->create_graph_pool(1);
  REQUIRE_OK(pool1);
  auto capture = rt->begin_capture(s0, CaptureMode::kThreadLocal);
  REQUIRE_OK(capture);
  // Named with its stream, the route is refused at once.
  const absl::Status named = alloc->begin_allocate_to_pool(1, *capture, *pool1, s0);
  CHECK(absl::IsInvalidArgument(named));
  CHECK_THAT(std::string(named.message()), Catch::Contains("runs on device 0, not device 1"));
  // Without the stream the route cannot be checked; the allocations are.
  REQUIRE_OK(alloc->begin_allocate_to_pool(1, *capture, *pool1));
  const AllocatorStats before0 = *alloc->stats(0);
  const AllocatorStats before1 = *alloc->stats(1);
  for (int attempt = 0; attempt < 2; ++attempt) {  // the route looked up, then remembered
    auto wrong = alloc->allocate(4096, 0, s0);
    CHECK(absl::IsInvalidArgument(wrong.status()));
    CHECK_THAT(std::string(wrong.status().message()),
               Catch::Contains("a graph pool of another device"));
    CHECK(absl::IsInvalidArgument(alloc->allocate(4096, 1, s0).status()));
  }
  CHECK(capalloc::testing::same_state(before0, *alloc->stats(0)));
  CHECK(capalloc::testing::same_state(before1, *alloc->stats(1)));
  REQUIRE_OK(alloc->CheckInvariants());
  auto graph = rt->end_capture(s0);
  REQUIRE_OK(graph);
  REQUIRE_OK(alloc->end_allocate_to_pool(*capture));
  REQUIRE_OK(rt->destroy_graph(*graph));
  REQUIRE_OK(alloc->release_graph_pool(*pool1));
  REQUIRE_OK(alloc->CheckInvariants());
  REQUIRE_OK(rt->destroy_stream(s0));
}

TEST_CASE("a stream of another device that joins a capture allocates as part of it",
          "[streams][capture]") {
  // CUDA captures may span devices: a stream of device 1 waiting on an
  // event recorded in a capture on device 0 joins it. The host runtime
  // counted the capture for its origin's device only, so any_capture_active
  // said no for device 1 and the joined stream's allocations were taken for
  // ordinary ones (not routed to a graph pool, not told to the tracker); a
  // GPU runtime asks every stream, so this was the host runtime's fault.
  auto rt = host_runtime(std::size_t{16} << 30, 2);
  auto alloc = make_allocator(rt);
  const StreamHandle s0 = *rt->create_stream(0);
  const StreamHandle s1 = *rt->create_stream(1);
  const EventHandle fork = *rt->create_event(0);
  const EventHandle join = *rt->create_event(1);
  auto capture = rt->begin_capture(s0, CaptureMode::kThreadLocal);
  REQUIRE_OK(capture);
  CHECK(rt->any_capture_active(0));
  CHECK_FALSE(rt->any_capture_active(1));
  REQUIRE_OK(rt->record_event(fork, s0));
  REQUIRE_OK(rt->stream_wait_event(s1, fork));
  CHECK(rt->any_capture_active(1));
  void* p = *alloc->allocate(4096, 1, s1);
  CHECK(alloc->block_info(p)->capture == *capture);
  CHECK(alloc->block_info(p)->pool != kDefaultPool);
  // One capture allocates into one graph pool, of one device: the origin's
  // stream, of device 0, is refused now that the capture's pool is device
  // 1's (a known limit: docs/design.md, "Captures and graph pools").
  CHECK(absl::IsInvalidArgument(alloc->allocate(4096, 0, s0).status()));
  REQUIRE_OK(alloc->deallocate(p));
  REQUIRE_OK(rt->record_event(join, s1));
  REQUIRE_OK(rt->stream_wait_event(s0, join));
  auto graph = rt->end_capture(s0);
  REQUIRE_OK(graph);
  CHECK_FALSE(rt->any_capture_active(0));
  CHECK_FALSE(rt->any_capture_active(1));
  REQUIRE_OK(rt->destroy_graph(*graph));
  REQUIRE_OK(alloc->CheckInvariants());
  REQUIRE_OK(rt->destroy_event(fork));
  REQUIRE_OK(rt->destroy_event(join));
  REQUIRE_OK(rt->destroy_stream(s0));
  REQUIRE_OK(rt->destroy_stream(s1));
}

TEST_CASE("record_stream: without it the hazard is real (the cookie test can see it)",
          "[streams]") {
  // The control arm: a kernel on stream B still has to read the block when
  // the host frees it on A without record_stream. The allocator then hands
  // the block back at once on A, the new owner writes it, and B's kernel
  // reads the new owner's data. The kernel waits for the new owner's write
  // through a future (not a timing race), so the outcome is deterministic and
  // the test stays clean under ThreadSanitizer. It shows the test above would
  // catch a reuse that ignored stream B.
  auto rt = host_runtime();
  auto alloc = make_allocator(rt);
  const StreamHandle a = *rt->create_stream(0);
  const StreamHandle b = *rt->create_stream(0);
  void* p = *alloc->allocate(kBlock, 0, a);
  capalloc::testing::write_cookie(p, 256, kCookie);
  std::promise<void> rewritten;
  std::shared_future<void> rewritten_future = rewritten.get_future().share();
  std::atomic<bool> damaged{false};
  KernelLaunch late_reader;
  late_reader.name = "late_reader";
  late_reader.reads = {{p, kBlock}};
  late_reader.host_body = [p, rewritten_future, &damaged] {
    rewritten_future.wait();
    damaged.store(!capalloc::testing::cookie_intact(p, 256, kCookie));
  };
  REQUIRE_OK(rt->launch_kernel(b, late_reader));
  REQUIRE_OK(alloc->deallocate(p));
  void* q = *alloc->allocate(kBlock, 0, a);
  CHECK(q == p);  // reused at once: same stream, no recorded use elsewhere
  std::memset(q, 0x5A, kBlock);
  rewritten.set_value();
  REQUIRE_OK(rt->synchronize_stream(b));
  CHECK(damaged.load());
  REQUIRE_OK(alloc->deallocate(q));
  REQUIRE_OK(rt->destroy_stream(a));
  REQUIRE_OK(rt->destroy_stream(b));
}

TEST_CASE("a block freed on one stream is not handed to another stream", "[streams]") {
  auto rt = host_runtime();
  auto alloc = make_allocator(rt);
  const StreamHandle a = *rt->create_stream(0);
  const StreamHandle b = *rt->create_stream(0);
  void* p = *alloc->allocate(4096, 0, a);
  REQUIRE_OK(alloc->deallocate(p));
  void* q = *alloc->allocate(4096, 0, b);
  CHECK(q != p);
  CHECK(alloc->block_info(q)->stream == b);
  void* r = *alloc->allocate(4096, 0, a);
  CHECK(r == p);
  REQUIRE_OK(alloc->deallocate(q));
  REQUIRE_OK(alloc->deallocate(r));
  REQUIRE_OK(alloc->CheckInvariants());
}

// Two streams taking turns stay on the steady-state path (the allocator
// remembers the last two streams it checked); a third, and a destroyed one,
// must still be told apart from them.
TEST_CASE("streams taking turns get their own blocks back, and a destroyed one is refused",
          "[streams]") {
  auto rt = host_runtime();
  auto alloc = make_allocator(rt);
  const StreamHandle streams[3] = {*rt->create_stream(0), *rt->create_stream(0),
                                   *rt->create_stream(0)};
  void* first[3] = {};
  for (int i = 0; i < 3; ++i) {
    first[i] = *alloc->allocate(4096, 0, streams[i]);
    REQUIRE_OK(alloc->deallocate(first[i]));
  }
  void* held = *alloc->allocate(8192, 0, streams[2]);  // held across the turns
  for (int round = 0; round < 4; ++round) {
    for (int i : {2, 0, 1, 0, 1}) {
      void* p = *alloc->allocate(4096, 0, streams[i]);
      CHECK(p == first[i]);  // each stream's own cached block, never another's
      CHECK(alloc->block_info(p)->stream == streams[i]);
      REQUIRE_OK(alloc->deallocate(p));
    }
  }
  // Destroyed between turns: the stream before the last one used, then the
  // last one. Neither is served again; the third keeps its block.
  REQUIRE_OK(rt->destroy_stream(streams[0]));
  CHECK(alloc->record_stream(held, streams[0]).code() == absl::StatusCode::kInvalidArgument);
  CHECK(alloc->allocate(4096, 0, streams[0]).status().code() ==
        absl::StatusCode::kInvalidArgument);
  REQUIRE_OK(alloc->deallocate(held));
  void* p = *alloc->allocate(4096, 0, streams[1]);
  CHECK(p == first[1]);
  REQUIRE_OK(alloc->deallocate(p));
  REQUIRE_OK(rt->destroy_stream(streams[1]));
  CHECK(alloc->allocate(4096, 0, streams[1]).status().code() ==
        absl::StatusCode::kInvalidArgument);
  p = *alloc->allocate(4096, 0, streams[2]);
  CHECK(p == first[2]);
  REQUIRE_OK(alloc->deallocate(p));
  CHECK(alloc->stats(0)->allocated_blocks.current == 0);
  REQUIRE_OK(alloc->CheckInvariants());
  REQUIRE_OK(rt->destroy_stream(streams[2]));
}

// The pool finds a stream's free index through the two it found last and a
// small table of those found before (Pool::find_index): more streams than
// that table has slots, taking turns in varying orders, and indexes dropped
// by empty_cache and made again, must each still reach their own stream's
// memory, never another's or a dropped one.
TEST_CASE("many streams taking turns each reach their own free index, across empty_cache",
          "[streams]") {
  auto rt = host_runtime();
  auto alloc = make_allocator(rt);
  constexpr int kStreams = 20;  // more than the table's 8 slots
  std::vector<StreamHandle> streams;
  for (int i = 0; i < kStreams; ++i) streams.push_back(*rt->create_stream(0));
  for (int pass = 0; pass < 3; ++pass) {
    std::vector<void*> mine(kStreams, nullptr);
    for (int round = 0; round < 4; ++round) {
      for (int k = 0; k < kStreams; ++k) {
        const int i = (k * (round + 1) + pass) % kStreams;  // varying orders
        void* p = *alloc->allocate(4096 + 512 * static_cast<std::size_t>(round), 0, streams[i]);
        CHECK(alloc->block_info(p)->stream == streams[i]);
        if (mine[i] != nullptr) REQUIRE_OK(alloc->deallocate(mine[i]));
        mine[i] = p;
      }
    }
    for (void* p : mine) REQUIRE_OK(alloc->deallocate(p));
    REQUIRE_OK(alloc->CheckInvariants());
    // Every segment is free: empty_cache releases them and drops their
    // streams' indexes; the next pass makes them again.
    REQUIRE_OK(alloc->empty_cache());
    CHECK(alloc->stats(0)->reserved_bytes.current == 0);
  }
  for (StreamHandle s : streams) REQUIRE_OK(rt->destroy_stream(s));
}

// Streams beyond the last two checked are recalled through a small table in
// front of the known streams (Allocator::Impl::recall_known_stream): a
// destroyed stream must leave it, or a later request on its handle would
// pass for one on a live stream.
TEST_CASE("four streams taking turns: a destroyed one is refused at every later request",
          "[streams]") {
  auto rt = host_runtime();
  auto alloc = make_allocator(rt);
  std::vector<StreamHandle> streams;
  for (int i = 0; i < 4; ++i) streams.push_back(*rt->create_stream(0));
  for (int round = 0; round < 3; ++round) {
    for (StreamHandle s : streams) {
      void* p = *alloc->allocate(4096, 0, s);
      CHECK(alloc->block_info(p)->stream == s);
      REQUIRE_OK(alloc->deallocate(p));
    }
  }
  // Not one of the last two used: known only through the table or the set.
  REQUIRE_OK(rt->destroy_stream(streams[1]));
  for (int attempt = 0; attempt < 3; ++attempt) {
    CHECK(alloc->allocate(4096, 0, streams[1]).status().code() ==
          absl::StatusCode::kInvalidArgument);
    for (int i : {0, 2, 3}) {  // the others go on taking turns
      void* p = *alloc->allocate(4096, 0, streams[static_cast<std::size_t>(i)]);
      REQUIRE_OK(alloc->deallocate(p));
    }
  }
  REQUIRE_OK(alloc->CheckInvariants());
  for (int i : {0, 2, 3}) REQUIRE_OK(rt->destroy_stream(streams[static_cast<std::size_t>(i)]));
}

// A destroyed stream's handle named again at once by a new stream (as CUDA
// and HIP do), while ten streams take turns: the new stream is checked
// anew, never served the old one's memory through a remembered index or a
// remembered stream (both tables of Pool::find_index and
// recall_known_stream), and the old one's live blocks become orphans.
TEST_CASE("handles reused after destroy while ten streams take turns", "[streams]") {
  auto host = host_runtime(std::size_t{64} << 30);
  auto rt = std::make_shared<capalloc::testing::ReusingRuntime>(host);
  auto alloc = *Allocator::create(rt);
  std::vector<StreamHandle> streams;
  for (int i = 0; i < 10; ++i) streams.push_back(*host->create_stream(0));
  struct Held {
    void* p;
    StreamHandle stream;
  };
  std::vector<Held> held;
  const std::size_t sizes[] = {4096, std::size_t{1536} << 10, std::size_t{40} << 20};
  for (int round = 0; round < 20; ++round) {
    for (std::size_t k = 0; k < streams.size(); ++k) {
      const std::size_t i = (k * 3 + static_cast<std::size_t>(round)) % streams.size();
      for (std::size_t bytes : sizes) {
        void* p = *alloc->allocate(bytes, 0, streams[i]);
        CHECK(alloc->block_info(p)->stream == streams[i]);
        held.push_back({p, streams[i]});
        if (held.size() > 20) {  // the oldest goes (quick cache, merges)
          REQUIRE_OK(alloc->deallocate(held.front().p));
          held.erase(held.begin());
        }
      }
    }
    const StreamHandle retired = streams[static_cast<std::size_t>(round * 7) % streams.size()];
    rt->retire_and_reuse(retired);
    for (Held& h : held) {
      if (h.stream == retired) h.stream = kNoStream;
    }
    // A call that applies the report (block_info does not).
    REQUIRE_OK(alloc->deallocate(*alloc->allocate(64, 0, kDefaultStream)));
    for (const Held& h : held) CHECK(alloc->block_info(h.p)->stream == h.stream);
    REQUIRE_OK(alloc->CheckInvariants());
    if (round % 5 == 4) REQUIRE_OK(alloc->empty_cache());
  }
  for (const Held& h : held) REQUIRE_OK(alloc->deallocate(h.p));
  REQUIRE_OK(alloc->CheckInvariants());
  for (StreamHandle s : streams) REQUIRE_OK(host->destroy_stream(s));
}

// Streams of two devices taking turns: each request is served on its
// stream's device and refused on the other, whichever stream a table slot
// held last.
TEST_CASE("streams of two devices taking turns: each served on its own device only",
          "[streams]") {
  auto rt = host_runtime(std::size_t{16} << 30, 2);
  auto alloc = make_allocator(rt);
  std::vector<std::pair<StreamHandle, int>> streams;
  for (int i = 0; i < 12; ++i) streams.push_back({*rt->create_stream(i % 2), i % 2});
  for (int round = 0; round < 6; ++round) {
    for (std::size_t k = 0; k < streams.size(); ++k) {
      const auto [s, d] = streams[(k * 5 + static_cast<std::size_t>(round)) % streams.size()];
      void* p = *alloc->allocate(4096, d, s);
      CHECK(alloc->block_info(p)->stream == s);
      CHECK(alloc->block_info(p)->device == d);
      REQUIRE_OK(alloc->deallocate(p));
      CHECK(alloc->allocate(4096, 1 - d, s).status().code() ==
            absl::StatusCode::kInvalidArgument);
    }
    REQUIRE_OK(alloc->CheckInvariants());
  }
  for (const auto& [s, d] : streams) REQUIRE_OK(rt->destroy_stream(s));
}

TEST_CASE("pending frees hold their segment until the event completes and empty_cache never waits",
          "[streams]") {
  auto rt = host_runtime();
  auto alloc = make_allocator(rt);
  const StreamHandle a = *rt->create_stream(0);
  const StreamHandle b = *rt->create_stream(0);
  void* p = *alloc->allocate(kBlock, 0, a);
  capalloc::testing::Gate gate;
  REQUIRE_OK(rt->launch_kernel(b, gate.kernel(p, kBlock)));
  REQUIRE_OK(alloc->record_stream(p, b));
  REQUIRE_OK(alloc->deallocate(p));

  const auto t0 = std::chrono::steady_clock::now();
  REQUIRE_OK(alloc->empty_cache(0));  // must not block on stream b
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(1));
  CHECK(alloc->stats(0)->segments.current == 1);
  CHECK(alloc->stats(0)->pending_free_blocks == 1);

  gate.open();
  REQUIRE_OK(rt->synchronize_stream(b));
  REQUIRE_OK(alloc->empty_cache(0));
  CHECK(alloc->stats(0)->segments.current == 0);
  CHECK(alloc->stats(0)->pending_free_blocks == 0);
  REQUIRE_OK(alloc->CheckInvariants());
  REQUIRE_OK(rt->destroy_stream(a));
  REQUIRE_OK(rt->destroy_stream(b));
}

TEST_CASE("out of memory: cached segments are released and the request retried once",
          "[oom]") {
  constexpr std::size_t kMiB = std::size_t{1} << 20;
  auto rt = host_runtime(64 * kMiB);
  auto alloc = make_allocator(rt);
  const StreamHandle a = *rt->create_stream(0);
  const StreamHandle b = *rt->create_stream(0);

  // Three 20 MiB segments cached on stream a: 60 of the 64 MiB.
  std::vector<void*> blocks;
  for (int i = 0; i < 3; ++i) blocks.push_back(*alloc->allocate(20 * kMiB, 0, a));
  for (void* p : blocks) REQUIRE_OK(alloc->deallocate(p));
  CHECK(alloc->stats(0)->reserved_bytes.current == 60 * kMiB);

  // Stream b cannot use a's cache and the device has no room for a fourth
  // segment: the allocator releases a's cached segments and retries.
  auto q = alloc->allocate(20 * kMiB, 0, b);
  REQUIRE_OK(q);
  auto stats = *alloc->stats(0);
  CHECK(stats.retries == 1);
  CHECK(stats.ooms == 0);
  CHECK(stats.reserved_bytes.current == 20 * kMiB);
  REQUIRE_OK(alloc->CheckInvariants());

  // Where it does not fit even then: a clear error, and nothing changed.
  std::vector<void*> held = {*q};
  for (int i = 0; i < 2; ++i) held.push_back(*alloc->allocate(20 * kMiB, 0, b));
  const auto before = *alloc->stats(0);
  auto fail = alloc->allocate(20 * kMiB, 0, b);
  REQUIRE_FALSE(fail.ok());
  CHECK(fail.status().code() == absl::StatusCode::kResourceExhausted);
  const std::string message(fail.status().message());
  CHECK_THAT(message, Catch::Contains("requested 20.00 MiB"));
  CHECK_THAT(message, Catch::Contains("device 0"));
  CHECK_THAT(message, Catch::Contains("60.00 MiB reserved"));
  CHECK_THAT(message, Catch::Contains("60.00 MiB allocated"));
  const auto after = *alloc->stats(0);
  CHECK(capalloc::testing::same_state(before, after));
  CHECK(after.ooms == 1);
  CHECK(after.retries == 2);
  REQUIRE_OK(alloc->CheckInvariants());
  for (void* p : held) REQUIRE_OK(alloc->deallocate(p));
  REQUIRE_OK(rt->destroy_stream(a));
  REQUIRE_OK(rt->destroy_stream(b));
}
