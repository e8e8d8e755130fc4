// tests/release_queue_test.cpp: the ReleaseQueue (capalloc/release.hpp) on
// the host runtime: stream order, graphs holding releases, bad input,
// teardown, and many threads at once.
#include <atomic>
#include <chrono>
#include <future>
#include <memory>
#include <thread>
#include <vector>

#include "capalloc/capture.hpp"
#include "capalloc/release.hpp"
#include "release_test_support.hpp"
#include "test_support.hpp"

namespace capalloc::testing {
namespace {

struct World {
  std::shared_ptr<DeviceRuntime> rt = host_runtime();
  std::unique_ptr<Allocator> allocator = make_allocator(rt);
  std::unique_ptr<CaptureTracker> tracker = CaptureTracker::create(*allocator).value();
  std::unique_ptr<ReleaseQueue> queue = ReleaseQueue::create(*tracker).value();
  StreamHandle stream = rt->create_stream(0).value();
  StreamHandle idle = rt->create_stream(0).value();

  ~World() {
    queue.reset();  // before the tracker and the runtime it uses
    tracker.reset();
  }
};

TEST_CASE("release queue: the callback runs only after the stream's work up to the request") {
  World w;
  std::atomic<bool> kernel_done{false};
  std::atomic<bool> released_after_kernel{false};
  std::promise<void> released;
  std::future<void> done = released.get_future();
  Gate gate;
  REQUIRE_OK(w.rt->launch_kernel(w.stream, gate.kernel(nullptr, 0)));
  REQUIRE_OK(w.rt->launch_kernel(w.stream, host_kernel("work", [&] { kernel_done = true; })));
  REQUIRE_OK(w.queue->release(0, w.stream, [&] {
    released_after_kernel = kernel_done.load();
    released.set_value();
  }));
  // Work enqueued after the request does not hold it.
  Gate second_gate;
  REQUIRE_OK(w.rt->launch_kernel(w.stream, second_gate.kernel(nullptr, 0)));

  wait_for_a_pass(*w.queue, w.idle);
  CHECK(done.wait_for(std::chrono::seconds(0)) == std::future_status::timeout);

  gate.open();
  done.wait();
  CHECK(released_after_kernel);
  second_gate.open();
  REQUIRE_OK(w.rt->synchronize_stream(w.stream));
  REQUIRE_OK(w.queue->drain());  // the callbacks have returned before their promises go
}

TEST_CASE("release queue: requests on one stream run in request order") {
  World w;
  Gate gate;
  REQUIRE_OK(w.rt->launch_kernel(w.stream, gate.kernel(nullptr, 0)));
  std::mutex mu;
  std::vector<int> order;
  std::promise<void> last;
  for (int i = 0; i < 20; ++i) {
    REQUIRE_OK(w.queue->release(0, w.stream, [&, i] {
      std::lock_guard lock(mu);
      order.push_back(i);
      if (i == 19) last.set_value();
    }));
  }
  gate.open();
  last.get_future().wait();
  std::vector<int> expected(20);
  for (int i = 0; i < 20; ++i) expected[i] = i;
  CHECK(order == expected);
  REQUIRE_OK(w.queue->drain());
}

TEST_CASE("release queue: bad input is an error that changes nothing") {
  World w;
  const ReleaseQueueStats before = w.queue->stats();
  bool ran = false;
  auto status = w.queue->release(0, w.stream, ReleaseQueue::Callback{});
  CHECK(status.code() == absl::StatusCode::kInvalidArgument);
  CHECK(std::string(status.message()).find("callback is empty") != std::string::npos);

  status = w.queue->release(3, w.stream, [&] { ran = true; });
  CHECK(status.code() == absl::StatusCode::kInvalidArgument);
  CHECK(std::string(status.message()).find("device 3 does not exist") != std::string::npos);

  status = w.queue->release(0, StreamHandle{987654}, [&] { ran = true; });
  CHECK(status.code() == absl::StatusCode::kNotFound);
  CHECK(std::string(status.message()).find("never created or already destroyed") !=
        std::string::npos);

  int x = 0;
  status = w.queue->release(0, w.stream, [&] { ran = true; }, {{&x, 0}});
  CHECK(status.code() == absl::StatusCode::kInvalidArgument);
  CHECK(std::string(status.message()).find("memory span is empty") != std::string::npos);

  const ReleaseQueueStats after = w.queue->stats();
  CHECK(after.requested == before.requested);
  CHECK(after.pending == before.pending);
  CHECK(after.completed == before.completed);
  CHECK_FALSE(ran);
}

// Break test 13, item 7: documented in docs/errors.md.
TEST_CASE("release queue: after drain, a release on a capturing stream is refused") {
  World w;
  const StreamHandle capturing = w.rt->create_stream(0).value();
  REQUIRE_OK(w.queue->drain());
  REQUIRE_OK(w.tracker->begin_capture(0, capturing));
  bool ran = false;
  const auto before = w.queue->stats();
  absl::Status status = w.queue->release(0, capturing, [&] { ran = true; });
  CHECK(status.code() == absl::StatusCode::kFailedPrecondition);
  CHECK(std::string(status.message()).find("the release queue was drained") != std::string::npos);
  CHECK_FALSE(ran);
  CHECK(w.queue->stats().requested == before.requested);
  auto done = w.tracker->end_capture(capturing);
  REQUIRE_OK(done);
  REQUIRE_OK(w.tracker->destroy_graph(done->graph));
}

TEST_CASE("release queue: a release on a capturing stream waits until its graph is destroyed") {
  World w;
  const StreamHandle capturing = w.rt->create_stream(0).value();
  REQUIRE_OK(w.tracker->begin_capture(0, capturing));
  std::atomic<bool> ran{false};
  std::promise<void> released;
  REQUIRE_OK(w.queue->release(0, capturing, [&] {
    ran = true;
    released.set_value();
  }));
  wait_for_a_pass(*w.queue, w.idle);
  CHECK_FALSE(ran);
  auto done = w.tracker->end_capture(capturing);
  REQUIRE_OK(done);
  REQUIRE_OK(w.tracker->replay(done->graph, capturing));
  wait_for_a_pass(*w.queue, w.idle);
  CHECK_FALSE(ran);  // the graph still exists: a replay may use the memory
  CHECK(w.queue->stats().held_by_graphs == 1);
  REQUIRE_OK(w.tracker->destroy_graph(done->graph));
  released.get_future().wait();
  CHECK(ran);
  REQUIRE_OK(w.queue->drain());
}

TEST_CASE("release queue: a release of memory a live graph reads waits until the graph is gone") {
  World w;
  void* input = w.allocator->allocate(4096, 0, w.stream).value();
  const StreamHandle capturing = w.rt->create_stream(0).value();
  REQUIRE_OK(w.tracker->begin_capture(0, capturing));
  KernelLaunch reads;
  reads.name = "reads_input";
  reads.reads = {{input, 4096}};
  reads.host_body = [] {};
  REQUIRE_OK(w.rt->launch_kernel(capturing, reads));
  auto done = w.tracker->end_capture(capturing);
  REQUIRE_OK(done);
  REQUIRE(w.tracker->graph_uses(0, {input, 4096}));

  std::atomic<bool> ran{false};
  std::promise<void> released;
  REQUIRE_OK(w.queue->release(0, w.stream,
                              [&] {
                                ran = true;
                                released.set_value();
                              },
                              {{input, 4096}}));
  // A later release on the same stream, of other memory, is not held back.
  std::promise<void> later;
  REQUIRE_OK(w.queue->release(0, w.stream, [&] { later.set_value(); }));
  later.get_future().wait();
  wait_for_a_pass(*w.queue, w.idle);
  CHECK_FALSE(ran);
  CHECK(w.queue->stats().held_by_graphs == 1);
  REQUIRE_OK(w.tracker->destroy_graph(done->graph));
  released.get_future().wait();
  CHECK(ran);
  REQUIRE_OK(w.queue->drain());
  REQUIRE_OK(w.allocator->deallocate(input));
}

TEST_CASE("release queue: teardown runs every pending release, after its stream's work") {
  auto rt = host_runtime();
  auto allocator = make_allocator(rt);
  auto tracker = CaptureTracker::create(*allocator).value();
  auto queue = ReleaseQueue::create(*tracker).value();
  const StreamHandle stream = rt->create_stream(0).value();
  void* input = allocator->allocate(4096, 0, stream).value();

  // One held by a live graph, one behind a kernel still gated.
  const StreamHandle capturing = rt->create_stream(0).value();
  REQUIRE_OK(tracker->begin_capture(0, capturing));
  KernelLaunch reads;
  reads.name = "reads_input";
  reads.reads = {{input, 4096}};
  reads.host_body = [] {};
  REQUIRE_OK(rt->launch_kernel(capturing, reads));
  REQUIRE_OK(tracker->end_capture(capturing));

  std::atomic<bool> kernel_done{false};
  Gate gate;
  REQUIRE_OK(rt->launch_kernel(stream, gate.kernel(nullptr, 0)));
  REQUIRE_OK(rt->launch_kernel(stream, host_kernel("work", [&] { kernel_done = true; })));
  std::atomic<int> ran{0};
  std::atomic<bool> ran_before_kernel{false};
  REQUIRE_OK(queue->release(0, stream, [&] { ++ran; }, {{input, 4096}}));
  REQUIRE_OK(queue->release(0, stream, [&] {
    if (!kernel_done) ran_before_kernel = true;
    ++ran;
  }));
  CHECK(ran == 0);

  std::thread opener([&] { gate.open(); });
  REQUIRE_OK(queue->drain());  // waits for the gated kernel
  opener.join();
  CHECK(ran == 2);
  CHECK_FALSE(ran_before_kernel);
  const ReleaseQueueStats stats = queue->stats();
  // The graph-held release runs at teardown (forced); the one behind the
  // gate is run by whichever sees its stream's work done first once the
  // gate opens: the progress thread or drain() (both are right; this test
  // counted 2 and failed about one run in a hundred when the thread won).
  CHECK(stats.completed == 2);
  CHECK(stats.run_at_teardown >= 1);
  CHECK(stats.run_at_teardown <= 2);
  CHECK(stats.forced_at_teardown == 1);
  CHECK(stats.pending == 0);

  // After teardown a release waits for the stream and runs before returning.
  bool late = false;
  REQUIRE_OK(queue->release(0, stream, [&] { late = true; }));
  CHECK(late);
  queue.reset();
  tracker.reset();
  REQUIRE_OK(allocator->deallocate(input));
}

TEST_CASE("release queue: the destructor runs what is pending") {
  auto rt = host_runtime();
  const StreamHandle stream = rt->create_stream(0).value();
  std::atomic<int> ran{0};
  {
    auto queue = ReleaseQueue::create(*rt).value();
    for (int i = 0; i < 10; ++i) {
      KernelLaunch k;
      k.name = "work";
      k.host_body = [] {};
      REQUIRE_OK(rt->launch_kernel(stream, k));
      REQUIRE_OK(queue->release(0, stream, [&] { ++ran; }));
    }
  }
  CHECK(ran == 10);
}

TEST_CASE("release queue: a callback may request another release, and drain from one is refused") {
  World w;
  std::promise<void> inner_ran;
  std::promise<absl::Status> drain_status;
  REQUIRE_OK(w.queue->release(0, w.stream, [&] {
    drain_status.set_value(w.queue->drain());
    w.queue->release(0, w.stream, [&] { inner_ran.set_value(); }).IgnoreError();
  }));
  inner_ran.get_future().wait();
  absl::Status from_thread = drain_status.get_future().get();
  CHECK(from_thread.code() == absl::StatusCode::kFailedPrecondition);
  CHECK(std::string(from_thread.message()).find("progress thread would wait for itself") !=
        std::string::npos);
  // Break test 13, item 7: from a callback that teardown runs, the message
  // named the progress thread; it is the tearing-down thread.
  // The gate keeps the callback pending until the drain has (almost
  // certainly) stopped the thread; which thread ran it is checked, not
  // assumed, so that a slow machine cannot make the test fail.
  absl::Status from_teardown;
  std::thread::id ran_on;
  std::promise<std::thread::id> drainer;
  Gate gate;
  REQUIRE_OK(w.rt->launch_kernel(w.stream, gate.kernel(nullptr, 0)));
  REQUIRE_OK(w.queue->release(0, w.stream, [&] {
    ran_on = std::this_thread::get_id();
    from_teardown = w.queue->drain();
  }));
  auto drained = std::async(std::launch::async, [&] {
    drainer.set_value(std::this_thread::get_id());
    return w.queue->drain();
  });
  const std::thread::id drain_thread = drainer.get_future().get();
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  gate.open();
  REQUIRE_OK(drained.get());
  CHECK(from_teardown.code() == absl::StatusCode::kFailedPrecondition);
  const std::string message(from_teardown.message());
  if (ran_on == drain_thread) {
    CHECK(message.find("run by teardown") != std::string::npos);
    CHECK(message.find("progress thread") == std::string::npos);
  } else {
    WARN("the progress thread ran the callback before the drain stopped it");
    CHECK(message.find("progress thread would wait for itself") != std::string::npos);
  }
}

TEST_CASE("release queue: a callback is destroyed once it has run") {
  World w;
  auto owner = std::make_shared<int>(7);
  std::weak_ptr<int> watch = owner;
  std::promise<void> ran;
  REQUIRE_OK(w.queue->release(0, w.stream, [owner = std::move(owner), &ran] { ran.set_value(); }));
  ran.get_future().wait();
  wait_for_a_pass(*w.queue, w.idle);  // the pass that ran it has finished with it
  CHECK(watch.expired());
}

TEST_CASE("release queue: many threads, many streams, every release after its own kernel") {
  World w;
  constexpr int kThreads = 6;
  constexpr int kPerThread = 150;
  std::vector<StreamHandle> streams;
  for (int s = 0; s < 3; ++s) streams.push_back(w.rt->create_stream(0).value());
  std::atomic<int> ran{0};
  std::atomic<int> early{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kPerThread; ++i) {
        const StreamHandle s = streams[(t + i) % streams.size()];
        auto done = std::make_shared<std::atomic<bool>>(false);
        KernelLaunch k;
        k.name = "mark";
        k.host_body = [done] { done->store(true); };
        if (!w.rt->launch_kernel(s, k).ok()) continue;
        const absl::Status requested = w.queue->release(0, s, [done, &ran, &early] {
          if (!done->load()) ++early;
          ++ran;
        });
        if (!requested.ok()) ++early;
      }
    });
  }
  for (auto& th : threads) th.join();
  REQUIRE_OK(w.queue->drain());
  CHECK(ran == kThreads * kPerThread);
  CHECK(early == 0);
}

}  // namespace
}  // namespace capalloc::testing
