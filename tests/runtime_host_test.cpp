// runtime_host_test.cpp: the host runtime as the reference model of CUDA
// stream, event and graph-capture semantics (DESIGN.md §3, §11).
//
// Kernels here are host functions; the ones that must stay pending block on a
// Gate. A Gate is declared after the runtime so that, if an assertion fails
// early, it opens (in its destructor) before the runtime joins its workers.
// Catch2 assertions are made on the test thread only, never inside a kernel.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <future>
#include <memory>
#include <set>
#include <stdexcept>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "capalloc/runtime.hpp"

namespace {

using capalloc::CaptureMode;
using capalloc::CaptureStatus;
using capalloc::DeviceRuntime;
using capalloc::HostRuntimeOptions;
using capalloc::KernelLaunch;
using capalloc::StreamHandle;
using Code = absl::StatusCode;

#define CHECK_CODE(status_expr, expected_code)   \
  do {                                           \
    const absl::Status checked_ = (status_expr); \
    INFO(checked_.ToString());                   \
    CHECK(checked_.code() == (expected_code));   \
  } while (false)

std::shared_ptr<DeviceRuntime> make_runtime_or_fail(HostRuntimeOptions options = {}) {
  auto runtime = capalloc::make_host_runtime(options);
  REQUIRE(runtime.ok());
  return *std::move(runtime);
}

StreamHandle make_stream(DeviceRuntime& rt) {
  auto stream = rt.create_stream(0);
  REQUIRE(stream.ok());
  return *stream;
}

// Built member by member: KernelLaunch's members have no default initializers,
// so designated initializers that skip some trip -Wmissing-field-initializers.
KernelLaunch body_kernel(std::string name, std::function<void()> body) {
  KernelLaunch kernel;
  kernel.name = std::move(name);
  kernel.host_body = std::move(body);
  return kernel;
}

// Holds kernels back until the test opens it.
class Gate {
 public:
  ~Gate() { open(); }
  void open() {
    if (!opened_) {
      opened_ = true;
      promise_.set_value();
    }
  }
  KernelLaunch kernel() const {
    return body_kernel("gate", [f = future_] { f.wait(); });
  }

 private:
  std::promise<void> promise_;
  std::shared_future<void> future_ = promise_.get_future().share();
  bool opened_ = false;
};


unsigned char* as_bytes(void* p) { return static_cast<unsigned char*>(p); }

}  // namespace

TEST_CASE("reserve and release respect the device limit and reject bad input", "[host]") {
  constexpr std::size_t kLimit = std::size_t{1} << 20;
  auto rt = make_runtime_or_fail({.device_count = 2, .memory_limit_per_device = kLimit});
  CHECK(rt->name() == "host");
  CHECK(rt->device_count() == 2);

  auto seg = rt->reserve(1, 1000);
  REQUIRE(seg.ok());
  CHECK(reinterpret_cast<std::uintptr_t>(*seg) % 4096 == 0);
  std::memset(*seg, 0xAB, 1000);  // really usable memory
  auto info = rt->memory_info(1);
  REQUIRE(info.ok());
  CHECK(info->total_bytes == kLimit);
  CHECK(info->free_bytes <= kLimit - 1000);
  CHECK(rt->memory_info(0)->free_bytes == kLimit);

  auto too_big = rt->reserve(1, kLimit);
  CHECK_CODE(too_big.status(), Code::kResourceExhausted);
  CHECK_THAT(std::string(too_big.status().message()), Catch::Contains("device 1"));
  CHECK_CODE(rt->reserve(2, 64).status(), Code::kInvalidArgument);
  CHECK_CODE(rt->reserve(-1, 64).status(), Code::kInvalidArgument);
  CHECK_CODE(rt->reserve(0, 0).status(), Code::kInvalidArgument);
  CHECK_CODE(rt->memory_info(5).status(), Code::kInvalidArgument);

  CHECK_CODE(rt->release(1, *seg, 999), Code::kInvalidArgument);
  CHECK_CODE(rt->release(0, *seg, 1000), Code::kNotFound);  // other device
  CHECK_CODE(rt->release(1, as_bytes(*seg) + 4096, 1000), Code::kNotFound);
  CHECK(rt->release(1, *seg, 1000).ok());
  CHECK_CODE(rt->release(1, *seg, 1000), Code::kNotFound);  // double release
  CHECK(rt->memory_info(1)->free_bytes == kLimit);

  auto whole = rt->reserve(0, kLimit);  // the limit itself fits exactly
  REQUIRE(whole.ok());
  CHECK(rt->memory_info(0)->free_bytes == 0);
  CHECK_CODE(rt->reserve(0, 1).status(), Code::kResourceExhausted);
  CHECK(rt->release(0, *whole, kLimit).ok());
}

TEST_CASE("make_host_runtime validates its options", "[host]") {
  CHECK_CODE(capalloc::make_host_runtime({.device_count = 0}).status(), Code::kInvalidArgument);
  CHECK_CODE(capalloc::make_host_runtime({.memory_limit_per_device = 0}).status(),
             Code::kInvalidArgument);
}

TEST_CASE("make_runtime selects by name", "[host]") {
  auto host = capalloc::make_runtime("host");
  REQUIRE(host.ok());
  CHECK((*host)->name() == "host");
  // "cuda" and "hip" exist only when built in and a device is present;
  // otherwise kUnavailable. "auto" takes the first that exists, else host.
  auto cuda = capalloc::make_runtime("cuda");
  auto hip = capalloc::make_runtime("hip");
  if (!cuda.ok()) CHECK_CODE(cuda.status(), Code::kUnavailable);
  if (!hip.ok()) CHECK_CODE(hip.status(), Code::kUnavailable);
  auto automatic = capalloc::make_runtime("auto");
  REQUIRE(automatic.ok());
  CHECK((*automatic)->name() == (cuda.ok() ? "cuda" : hip.ok() ? "hip" : "host"));
  auto bogus = capalloc::make_runtime("bogus");
  CHECK_CODE(bogus.status(), Code::kInvalidArgument);
  CHECK_THAT(std::string(bogus.status().message()), Catch::Contains("host"));
}

TEST_CASE("unknown handles and unrunnable kernels are rejected", "[host]") {
  auto rt = make_runtime_or_fail();
  constexpr StreamHandle kNoStream = 999;
  CHECK_CODE(rt->synchronize_stream(kNoStream), Code::kNotFound);
  CHECK_CODE(rt->destroy_stream(kNoStream), Code::kNotFound);
  CHECK_CODE(rt->destroy_stream(capalloc::kDefaultStream), Code::kInvalidArgument);
  CHECK_CODE(rt->launch_kernel(kNoStream, body_kernel("k", [] {})), Code::kNotFound);
  CHECK_CODE(rt->capture_info(kNoStream).status(), Code::kNotFound);
  CHECK_CODE(rt->query_event(999).status(), Code::kNotFound);
  CHECK_CODE(rt->synchronize_event(999), Code::kNotFound);
  CHECK_CODE(rt->destroy_event(999), Code::kNotFound);
  CHECK_CODE(rt->record_event(999, capalloc::kDefaultStream), Code::kNotFound);
  CHECK_CODE(rt->stream_wait_event(capalloc::kDefaultStream, 999), Code::kNotFound);
  CHECK_CODE(rt->create_stream(3).status(), Code::kInvalidArgument);

  KernelLaunch bodiless;
  bodiless.name = "gemm";
  const absl::Status no_body = rt->launch_kernel(capalloc::kDefaultStream, bodiless);
  CHECK_CODE(no_body, Code::kInvalidArgument);
  CHECK_THAT(std::string(no_body.message()), Catch::Contains("kernel gemm has no host body"));
}

TEST_CASE("a launch returns before its kernel runs", "[host][async]") {
  auto rt = make_runtime_or_fail();
  const StreamHandle s = make_stream(*rt);
  std::atomic<bool> ran{false};
  Gate gate;
  REQUIRE(rt->launch_kernel(s, gate.kernel()).ok());
  REQUIRE(rt->launch_kernel(s, body_kernel("mark", [&ran] { ran = true; })).ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  CHECK_FALSE(ran.load());  // the worker is held at the gate, the caller is not
  gate.open();
  REQUIRE(rt->synchronize_stream(s).ok());
  CHECK(ran.load());
  CHECK(rt->destroy_stream(s).ok());
}

TEST_CASE("a stream runs its work in FIFO order", "[host]") {
  auto rt = make_runtime_or_fail();
  const StreamHandle s = make_stream(*rt);
  auto seg = rt->reserve(0, 4096);
  REQUIRE(seg.ok());
  unsigned char* mem = as_bytes(*seg);
  std::vector<int> order;  // touched only by the worker until synchronize
  for (int i = 0; i < 100; ++i) {
    REQUIRE(rt->launch_kernel(s, body_kernel("push", [&order, i] { order.push_back(i); })).ok());
  }
  REQUIRE(rt->memset_async(mem, 1, 16, s).ok());
  REQUIRE(rt->memcpy_async(mem + 16, mem, 16, s).ok());  // sees the memset before it
  REQUIRE(rt->memset_async(mem, 2, 8, s).ok());
  REQUIRE(rt->synchronize_stream(s).ok());
  // The default stream is a stream like any other.
  REQUIRE(rt->memset_async(mem + 32, 5, 4, capalloc::kDefaultStream).ok());
  REQUIRE(rt->synchronize_stream(capalloc::kDefaultStream).ok());
  CHECK(mem[35] == 5);

  std::vector<int> expected(100);
  for (int i = 0; i < 100; ++i) expected[i] = i;
  CHECK(order == expected);
  CHECK(mem[0] == 2);
  CHECK(mem[8] == 1);
  CHECK(mem[16] == 1);
  CHECK(mem[31] == 1);
  CHECK(rt->release(0, *seg, 4096).ok());
}

TEST_CASE("an event completes when its stream reaches it", "[host][events]") {
  auto rt = make_runtime_or_fail();
  const StreamHandle s = make_stream(*rt);
  auto e = rt->create_event(0);
  REQUIRE(e.ok());
  CHECK(*rt->query_event(*e));  // never recorded

  Gate gate;
  REQUIRE(rt->launch_kernel(s, gate.kernel()).ok());
  REQUIRE(rt->record_event(*e, s).ok());
  CHECK_FALSE(*rt->query_event(*e));
  gate.open();
  REQUIRE(rt->synchronize_event(*e).ok());
  CHECK(*rt->query_event(*e));
  CHECK(rt->destroy_event(*e).ok());
}

TEST_CASE("stream_wait_event orders work across streams", "[host][events]") {
  auto rt = make_runtime_or_fail();
  const StreamHandle producer = make_stream(*rt);
  const StreamHandle consumer = make_stream(*rt);
  auto e = rt->create_event(0);
  REQUIRE(e.ok());
  int value = 0;  // written on the producer, read on the consumer
  int seen = -1;
  std::atomic<bool> consumed{false};

  Gate gate;
  REQUIRE(rt->launch_kernel(producer, gate.kernel()).ok());
  REQUIRE(rt->launch_kernel(producer, body_kernel("produce", [&value] { value = 42; })).ok());
  REQUIRE(rt->record_event(*e, producer).ok());
  REQUIRE(rt->stream_wait_event(consumer, *e).ok());
  REQUIRE(rt->launch_kernel(consumer, body_kernel("consume", [&] {
                              seen = value;
                              consumed = true;
                            }))
              .ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  CHECK_FALSE(consumed.load());
  gate.open();
  REQUIRE(rt->synchronize_stream(consumer).ok());
  CHECK(seen == 42);
  REQUIRE(rt->synchronize_stream(producer).ok());
}

TEST_CASE("capture records work without running it and replays run it at the same addresses",
          "[host][capture]") {
  auto rt = make_runtime_or_fail();
  const StreamHandle s = make_stream(*rt);
  auto seg = rt->reserve(0, 4096);
  REQUIRE(seg.ok());
  unsigned char* mem = as_bytes(*seg);
  std::atomic<int> kernel_runs{0};

  auto id = rt->begin_capture(s, CaptureMode::kGlobal);
  REQUIRE(id.ok());
  REQUIRE(rt->memset_async(mem, 7, 64, s).ok());
  REQUIRE(rt->launch_kernel(s, body_kernel("increment", [mem, &kernel_runs] {
                              for (int i = 0; i < 64; ++i) mem[64 + i] = mem[i] + 1;
                              ++kernel_runs;
                            }))
              .ok());
  REQUIRE(rt->memcpy_async(mem + 128, mem + 64, 64, s).ok());
  auto graph = rt->end_capture(s);
  REQUIRE(graph.ok());
  REQUIRE(rt->synchronize_stream(s).ok());
  CHECK(kernel_runs == 0);
  CHECK(std::all_of(mem, mem + 192, [](unsigned char b) { return b == 0; }));

  REQUIRE(rt->launch_graph(*graph, s).ok());
  REQUIRE(rt->synchronize_stream(s).ok());
  CHECK(kernel_runs == 1);
  CHECK(mem[0] == 7);
  CHECK(mem[64] == 8);
  CHECK(mem[191] == 8);

  std::memset(mem, 0, 192);  // a second replay redoes all of it
  REQUIRE(rt->launch_graph(*graph, s).ok());
  REQUIRE(rt->launch_graph(*graph, s).ok());
  REQUIRE(rt->synchronize_stream(s).ok());
  CHECK(kernel_runs == 3);
  CHECK(mem[63] == 7);
  CHECK(mem[128] == 8);
  CHECK(rt->destroy_graph(*graph).ok());
  CHECK(rt->release(0, *seg, 4096).ok());
}

TEST_CASE("capture ids are unique and capture_info tracks positions", "[host][capture]") {
  auto rt = make_runtime_or_fail();
  const StreamHandle a = make_stream(*rt);
  const StreamHandle b = make_stream(*rt);
  CHECK(rt->capture_info(a)->status == CaptureStatus::kNone);
  CHECK_CODE(rt->begin_capture(capalloc::kDefaultStream, CaptureMode::kGlobal).status(),
             Code::kInvalidArgument);

  auto id_a = rt->begin_capture(a, CaptureMode::kRelaxed);
  auto id_b = rt->begin_capture(b, CaptureMode::kRelaxed);
  REQUIRE(id_a.ok());
  REQUIRE(id_b.ok());
  CHECK(*id_a != 0);
  CHECK(*id_a != *id_b);
  CHECK_CODE(rt->begin_capture(a, CaptureMode::kRelaxed).status(), Code::kFailedPrecondition);

  for (std::size_t i = 0; i < 3; ++i) {
    auto info = rt->capture_info(a);
    REQUIRE(info.ok());
    CHECK(info->status == CaptureStatus::kActive);
    CHECK(info->id == *id_a);
    CHECK(info->position == i);
    REQUIRE(rt->launch_kernel(a, body_kernel("noop", [] {})).ok());
  }
  CHECK(rt->capture_info(b)->position == 0);
  auto graph_a = rt->end_capture(a);
  REQUIRE(graph_a.ok());
  CHECK(rt->capture_info(a)->status == CaptureStatus::kNone);
  CHECK_CODE(rt->end_capture(a).status(), Code::kFailedPrecondition);

  // A graph launched into a capture is inlined: its nodes advance the position.
  REQUIRE(rt->launch_graph(*graph_a, b).ok());
  CHECK(rt->capture_info(b)->position == 3);
  CHECK(rt->end_capture(b).ok());

  std::set<capalloc::CaptureId> ids{*id_a, *id_b};
  auto other_runtime = make_runtime_or_fail();  // ids are unique across the process
  const StreamHandle c = make_stream(*other_runtime);
  for (int i = 0; i < 5; ++i) {
    auto id = other_runtime->begin_capture(c, CaptureMode::kRelaxed);
    REQUIRE(id.ok());
    CHECK(ids.insert(*id).second);
    REQUIRE(other_runtime->end_capture(c).ok());
  }
}

TEST_CASE("a side stream forks from and joins back into a capture", "[host][capture]") {
  auto rt = make_runtime_or_fail();
  const StreamHandle origin = make_stream(*rt);
  const StreamHandle side = make_stream(*rt);
  auto fork = rt->create_event(0);
  auto join = rt->create_event(0);
  REQUIRE(fork.ok());
  REQUIRE(join.ok());
  std::vector<std::string> order;  // touched by one worker at a time

  auto id = rt->begin_capture(origin, CaptureMode::kGlobal);
  REQUIRE(id.ok());
  REQUIRE(rt->launch_kernel(origin, body_kernel("A", [&order] { order.push_back("A"); })).ok());
  REQUIRE(rt->record_event(*fork, origin).ok());
  REQUIRE(rt->stream_wait_event(side, *fork).ok());
  auto side_info = rt->capture_info(side);
  REQUIRE(side_info.ok());
  CHECK(side_info->status == CaptureStatus::kActive);
  CHECK(side_info->id == *id);
  REQUIRE(rt->launch_kernel(side, body_kernel("B", [&order] { order.push_back("B"); })).ok());
  REQUIRE(rt->record_event(*join, side).ok());
  REQUIRE(rt->stream_wait_event(origin, *join).ok());
  REQUIRE(rt->launch_kernel(origin, body_kernel("C", [&order] { order.push_back("C"); })).ok());
  CHECK_CODE(rt->end_capture(side).status(), Code::kFailedPrecondition);  // not the origin

  auto graph = rt->end_capture(origin);
  REQUIRE(graph.ok());
  CHECK(rt->capture_info(side)->status == CaptureStatus::kNone);
  REQUIRE(rt->synchronize_stream(side).ok());
  CHECK(order.empty());

  REQUIRE(rt->launch_graph(*graph, origin).ok());
  REQUIRE(rt->synchronize_stream(origin).ok());
  CHECK(order == std::vector<std::string>{"A", "B", "C"});
}

TEST_CASE("a stream joins back through another joined stream", "[host][capture]") {
  auto rt = make_runtime_or_fail();
  const StreamHandle origin = make_stream(*rt);
  const StreamHandle side = make_stream(*rt);
  const StreamHandle leaf = make_stream(*rt);
  auto fork = rt->create_event(0);
  auto leaf_done = rt->create_event(0);
  auto side_done = rt->create_event(0);
  REQUIRE((fork.ok() && leaf_done.ok() && side_done.ok()));
  std::atomic<int> runs{0};
  auto count = [&runs] { return body_kernel("count", [&runs] { ++runs; }); };

  REQUIRE(rt->begin_capture(origin, CaptureMode::kGlobal).ok());
  REQUIRE(rt->record_event(*fork, origin).ok());
  REQUIRE(rt->stream_wait_event(side, *fork).ok());
  REQUIRE(rt->record_event(*fork, side).ok());  // the leaf forks from the side stream
  REQUIRE(rt->stream_wait_event(leaf, *fork).ok());
  REQUIRE(rt->launch_kernel(leaf, count()).ok());
  REQUIRE(rt->launch_kernel(side, count()).ok());
  REQUIRE(rt->record_event(*leaf_done, leaf).ok());
  REQUIRE(rt->stream_wait_event(side, *leaf_done).ok());
  REQUIRE(rt->record_event(*side_done, side).ok());
  REQUIRE(rt->stream_wait_event(origin, *side_done).ok());  // covers the leaf too
  auto graph = rt->end_capture(origin);
  REQUIRE(graph.ok());
  REQUIRE(rt->launch_graph(*graph, origin).ok());
  REQUIRE(rt->synchronize_stream(origin).ok());
  CHECK(runs == 2);
}

TEST_CASE("a capturing stream may only wait on events of its own capture", "[host][capture]") {
  auto rt = make_runtime_or_fail();
  const StreamHandle s = make_stream(*rt);
  const StreamHandle other = make_stream(*rt);
  auto plain = rt->create_event(0);
  auto foreign = rt->create_event(0);
  REQUIRE((plain.ok() && foreign.ok()));
  REQUIRE(rt->record_event(*plain, other).ok());

  SECTION("an event recorded outside any capture") {
    REQUIRE(rt->begin_capture(s, CaptureMode::kGlobal).ok());
    CHECK_CODE(rt->stream_wait_event(s, *plain), Code::kFailedPrecondition);
    CHECK_CODE(rt->end_capture(s).status(), Code::kFailedPrecondition);
  }
  SECTION("an event of another capture") {
    REQUIRE(rt->begin_capture(s, CaptureMode::kGlobal).ok());
    REQUIRE(rt->begin_capture(other, CaptureMode::kGlobal).ok());
    REQUIRE(rt->record_event(*foreign, other).ok());
    CHECK_CODE(rt->stream_wait_event(s, *foreign), Code::kFailedPrecondition);
    CHECK_CODE(rt->end_capture(s).status(), Code::kFailedPrecondition);
    CHECK_CODE(rt->end_capture(other).status(), Code::kFailedPrecondition);
  }
}

TEST_CASE("a side stream that never joins back makes end_capture fail", "[host][capture]") {
  auto rt = make_runtime_or_fail();
  const StreamHandle origin = make_stream(*rt);
  const StreamHandle side = make_stream(*rt);
  auto fork = rt->create_event(0);
  REQUIRE(fork.ok());
  std::atomic<int> runs{0};

  REQUIRE(rt->begin_capture(origin, CaptureMode::kGlobal).ok());
  REQUIRE(rt->record_event(*fork, origin).ok());
  REQUIRE(rt->stream_wait_event(side, *fork).ok());
  REQUIRE(rt->launch_kernel(side, body_kernel("dangling", [&runs] { ++runs; })).ok());
  auto graph = rt->end_capture(origin);
  CHECK_CODE(graph.status(), Code::kFailedPrecondition);
  CHECK_THAT(std::string(graph.status().message()), Catch::Contains("unjoined"));

  // The capture is over for both streams; the side stream runs work again.
  CHECK(rt->capture_info(origin)->status == CaptureStatus::kNone);
  CHECK(rt->capture_info(side)->status == CaptureStatus::kNone);
  REQUIRE(rt->launch_kernel(side, body_kernel("later", [&runs] { runs += 10; })).ok());
  REQUIRE(rt->synchronize_stream(side).ok());
  CHECK(runs == 10);
}

TEST_CASE("synchronize_stream during capture invalidates the capture", "[host][capture]") {
  auto rt = make_runtime_or_fail();
  const StreamHandle s = make_stream(*rt);
  auto id = rt->begin_capture(s, CaptureMode::kGlobal);
  REQUIRE(id.ok());
  REQUIRE(rt->launch_kernel(s, body_kernel("k", [] {})).ok());
  CHECK_CODE(rt->synchronize_stream(s), Code::kFailedPrecondition);
  auto info = rt->capture_info(s);
  REQUIRE(info.ok());
  CHECK(info->status == CaptureStatus::kInvalidated);
  CHECK(info->id == *id);
  CHECK_CODE(rt->launch_kernel(s, body_kernel("k", [] {})), Code::kFailedPrecondition);

  auto graph = rt->end_capture(s);
  CHECK_CODE(graph.status(), Code::kFailedPrecondition);
  CHECK_THAT(std::string(graph.status().message()),
             Catch::Contains("invalidated by synchronize_stream"));
  CHECK(rt->capture_info(s)->status == CaptureStatus::kNone);
  CHECK(rt->synchronize_stream(s).ok());
}

TEST_CASE("querying an event recorded during capture invalidates the capture",
          "[host][capture][events]") {
  auto rt = make_runtime_or_fail();
  const StreamHandle s = make_stream(*rt);
  auto e = rt->create_event(0);
  REQUIRE(e.ok());
  REQUIRE(rt->begin_capture(s, CaptureMode::kGlobal).ok());
  REQUIRE(rt->record_event(*e, s).ok());
  CHECK_CODE(rt->query_event(*e).status(), Code::kFailedPrecondition);
  CHECK(rt->capture_info(s)->status == CaptureStatus::kInvalidated);
  CHECK_CODE(rt->synchronize_event(*e), Code::kFailedPrecondition);
  auto graph = rt->end_capture(s);
  CHECK_CODE(graph.status(), Code::kFailedPrecondition);
  CHECK_THAT(std::string(graph.status().message()), Catch::Contains("query_event"));
  auto done = rt->query_event(*e);  // legal again once the capture has ended
  REQUIRE(done.ok());
  CHECK(*done);
}

TEST_CASE("reserve during a global capture invalidates it unless the thread is relaxed",
          "[host][capture]") {
  auto rt = make_runtime_or_fail();
  const StreamHandle s = make_stream(*rt);

  SECTION("the capturing thread, in the default mode") {
    REQUIRE(rt->begin_capture(s, CaptureMode::kGlobal).ok());
    auto seg = rt->reserve(0, 4096);
    CHECK_CODE(seg.status(), Code::kFailedPrecondition);
    CHECK_THAT(std::string(seg.status().message()), Catch::Contains("kRelaxed"));
    CHECK(rt->capture_info(s)->status == CaptureStatus::kInvalidated);
    CHECK_CODE(rt->end_capture(s).status(), Code::kFailedPrecondition);
  }
  SECTION("another thread, in the default mode") {
    REQUIRE(rt->begin_capture(s, CaptureMode::kGlobal).ok());
    absl::Status from_other_thread;
    std::thread([&] { from_other_thread = rt->reserve(0, 4096).status(); }).join();
    CHECK_CODE(from_other_thread, Code::kFailedPrecondition);
    CHECK_CODE(rt->end_capture(s).status(), Code::kFailedPrecondition);
  }
  SECTION("the capturing thread in relaxed mode") {
    REQUIRE(rt->begin_capture(s, CaptureMode::kGlobal).ok());
    const CaptureMode old_mode = rt->exchange_thread_capture_mode(CaptureMode::kRelaxed);
    CHECK(old_mode == CaptureMode::kGlobal);
    auto seg = rt->reserve(0, 4096);
    CHECK(rt->exchange_thread_capture_mode(old_mode) == CaptureMode::kRelaxed);
    REQUIRE(seg.ok());
    CHECK(rt->capture_info(s)->status == CaptureStatus::kActive);
    CHECK(rt->end_capture(s).ok());
    CHECK(rt->release(0, *seg, 4096).ok());
  }
  SECTION("another thread during a thread-local capture") {
    REQUIRE(rt->begin_capture(s, CaptureMode::kThreadLocal).ok());
    absl::StatusOr<void*> seg;
    std::thread([&] { seg = rt->reserve(0, 4096); }).join();
    REQUIRE(seg.ok());
    CHECK(rt->end_capture(s).ok());
    CHECK(rt->release(0, *seg, 4096).ok());
  }
}

TEST_CASE("graph_writes lists the declared accesses of each node with its mode and position",
          "[host][graphs]") {
  auto rt = make_runtime_or_fail();
  const StreamHandle s = make_stream(*rt);
  auto seg = rt->reserve(0, 4096);
  REQUIRE(seg.ok());
  unsigned char* mem = as_bytes(*seg);

  REQUIRE(rt->begin_capture(s, CaptureMode::kGlobal).ok());
  KernelLaunch splitk = body_kernel("splitk", [] {});
  splitk.reads = {{mem + 1024, 64}};
  splitk.writes = {{mem, 64}, {mem + 256, 32}};
  splitk.updates = {{mem + 2048, 16}};
  splitk.state = {{mem + 3072, 8}};
  REQUIRE(rt->launch_kernel(s, splitk).ok());
  REQUIRE(rt->memset_async(mem + 512, 0, 16, s).ok());
  REQUIRE(rt->memcpy_async(mem + 768, mem, 8, s).ok());
  auto graph = rt->end_capture(s);
  REQUIRE(graph.ok());

  auto writes = rt->graph_writes(*graph);
  REQUIRE(writes.ok());
  using capalloc::AccessMode;
  struct Want {
    unsigned char* ptr;
    std::size_t bytes;
    std::size_t position;
    std::string_view op;
    AccessMode mode;
  };
  const std::vector<Want> want = {
      {mem + 1024, 64, 0, "splitk", AccessMode::kRead},
      {mem, 64, 0, "splitk", AccessMode::kWrite},
      {mem + 256, 32, 0, "splitk", AccessMode::kWrite},
      {mem + 2048, 16, 0, "splitk", AccessMode::kReadWrite},
      {mem + 3072, 8, 0, "splitk", AccessMode::kState},
      {mem + 512, 16, 1, "memset", AccessMode::kWrite},
      {mem, 8, 2, "memcpy", AccessMode::kRead},  // the copy's source
      {mem + 768, 8, 2, "memcpy", AccessMode::kWrite},
  };
  REQUIRE(writes->size() == want.size());
  for (std::size_t i = 0; i < want.size(); ++i) {
    const capalloc::GraphWrite& w = (*writes)[i];
    INFO("access " << i);
    CHECK(w.span.ptr == want[i].ptr);
    CHECK(w.span.bytes == want[i].bytes);
    CHECK(w.position == want[i].position);
    CHECK(w.op == want[i].op);
    CHECK(w.mode == want[i].mode);
    CHECK(w.evidence == capalloc::WriteEvidence::kDeclared);
  }
  CHECK(rt->destroy_graph(*graph).ok());
  CHECK(rt->release(0, *seg, 4096).ok());
}

TEST_CASE("a destroyed graph cannot be launched but a replay in flight survives destroy_graph",
          "[host][graphs]") {
  auto rt = make_runtime_or_fail();
  const StreamHandle s = make_stream(*rt);
  std::atomic<int> runs{0};
  Gate gate;

  REQUIRE(rt->begin_capture(s, CaptureMode::kGlobal).ok());
  REQUIRE(rt->launch_kernel(s, gate.kernel()).ok());
  REQUIRE(rt->launch_kernel(s, body_kernel("count", [&runs] { ++runs; })).ok());
  auto graph = rt->end_capture(s);
  REQUIRE(graph.ok());

  REQUIRE(rt->launch_graph(*graph, s).ok());  // held at the gate
  CHECK(rt->destroy_graph(*graph).ok());
  CHECK_CODE(rt->launch_graph(*graph, s), Code::kNotFound);
  CHECK_CODE(rt->destroy_graph(*graph), Code::kNotFound);
  CHECK_CODE(rt->graph_writes(*graph).status(), Code::kNotFound);
  gate.open();
  REQUIRE(rt->synchronize_stream(s).ok());
  CHECK(runs == 1);
}

// Field report 000: a launch path that keeps its last launch's arguments keeps
// the caller's memory alive. The runtime must drop a kernel once it has run;
// only a graph may keep it, until the graph is destroyed.
TEST_CASE("seed 000: the runtime keeps no copy of a kernel after it has run",
          "[host][seed000]") {
  auto rt = make_runtime_or_fail();
  const StreamHandle s = make_stream(*rt);
  auto tensor = std::make_shared<std::vector<float>>(1024, 1.0f);
  std::atomic<float> sum{0};

  REQUIRE(rt->launch_kernel(s, body_kernel("reduce", [tensor, &sum] {
                              float total = 0;
                              for (float v : *tensor) total += v;
                              sum = total;
                            }))
              .ok());
  REQUIRE(rt->synchronize_stream(s).ok());
  CHECK(sum.load() == 1024.0f);
  CHECK(tensor.use_count() == 1);

  REQUIRE(rt->begin_capture(s, CaptureMode::kGlobal).ok());
  REQUIRE(rt->launch_kernel(s, body_kernel("reduce", [tensor] { (void)tensor->size(); })).ok());
  auto graph = rt->end_capture(s);
  REQUIRE(graph.ok());
  CHECK(tensor.use_count() == 2);  // the graph holds its arguments by value
  REQUIRE(rt->launch_graph(*graph, s).ok());
  REQUIRE(rt->synchronize_stream(s).ok());
  CHECK(tensor.use_count() == 2);  // the replay itself kept nothing
  REQUIRE(rt->destroy_graph(*graph).ok());
  CHECK(tensor.use_count() == 1);
}

TEST_CASE("a kernel that throws is reported by the next synchronize", "[host]") {
  auto rt = make_runtime_or_fail();
  const StreamHandle s = make_stream(*rt);
  std::atomic<bool> later_ran{false};
  REQUIRE(rt->launch_kernel(s, body_kernel("boom", [] { throw std::runtime_error("bad"); })).ok());
  REQUIRE(rt->launch_kernel(s, body_kernel("after", [&] { later_ran = true; })).ok());
  const absl::Status status = rt->synchronize_stream(s);
  CHECK_CODE(status, Code::kInternal);
  CHECK_THAT(std::string(status.message()), Catch::Contains("kernel boom threw: bad"));
  CHECK(later_ran.load());
  CHECK(rt->synchronize_stream(s).ok());
}

TEST_CASE("destroy_stream runs queued work first", "[host]") {
  auto rt = make_runtime_or_fail();
  const StreamHandle s = make_stream(*rt);
  std::atomic<int> runs{0};
  for (int i = 0; i < 10; ++i) {
    REQUIRE(rt->launch_kernel(s, body_kernel("count", [&runs] {
                                std::this_thread::sleep_for(std::chrono::milliseconds(1));
                                ++runs;
                              }))
                .ok());
  }
  REQUIRE(rt->destroy_stream(s).ok());
  CHECK(runs == 10);
  CHECK_CODE(rt->launch_kernel(s, body_kernel("late", [] {})), Code::kNotFound);
}

TEST_CASE("many threads use one runtime at once", "[host][threads]") {
  auto rt = make_runtime_or_fail({.memory_limit_per_device = std::size_t{64} << 20});
  constexpr int kThreads = 4;
  constexpr int kKernels = 200;
  std::atomic<int> runs{0};
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      auto stream = rt->create_stream(0);
      auto event = rt->create_event(0);
      if (!stream.ok() || !event.ok()) {
        ++failures;
        return;
      }
      for (int i = 0; i < kKernels; ++i) {
        if (!rt->launch_kernel(*stream, body_kernel("count", [&runs] { ++runs; })).ok()) ++failures;
        if (i % 50 == 0) {
          auto seg = rt->reserve(0, 8192);
          if (!seg.ok() || !rt->memset_async(*seg, 3, 8192, *stream).ok() ||
              !rt->record_event(*event, *stream).ok() || !rt->synchronize_event(*event).ok() ||
              !rt->release(0, *seg, 8192).ok()) {
            ++failures;
          }
        }
      }
      if (!rt->synchronize_stream(*stream).ok() || !rt->destroy_stream(*stream).ok() ||
          !rt->destroy_event(*event).ok()) {
        ++failures;
      }
    });
  }
  for (auto& thread : threads) thread.join();
  CHECK(failures == 0);
  CHECK(runs == kThreads * kKernels);
  CHECK(rt->memory_info(0)->free_bytes == std::size_t{64} << 20);
}

// watch_capture_graph: the host runtime models CUDA's user objects retained
// by a captured graph (issue 9: graph lifetime for captures capalloc did not
// begin).
TEST_CASE("a watched graph reports its end after destroy_graph and the last replay",
          "[host][graphs][lifetime]") {
  auto rt = make_runtime_or_fail();
  const StreamHandle s = make_stream(*rt);
  std::atomic<int> gone{0};
  Gate gate;
  CHECK_CODE(rt->watch_capture_graph(s, [&gone] { ++gone; }), Code::kFailedPrecondition);
  REQUIRE(rt->begin_capture(s, CaptureMode::kGlobal).ok());
  REQUIRE(rt->watch_capture_graph(s, [&gone] { ++gone; }).ok());
  REQUIRE(rt->launch_kernel(s, gate.kernel()).ok());
  auto graph = rt->end_capture(s);
  REQUIRE(graph.ok());
  CHECK(gone == 0);
  REQUIRE(rt->launch_graph(*graph, s).ok());  // held at the gate
  REQUIRE(rt->destroy_graph(*graph).ok());
  CHECK(gone == 0);  // the replay in flight still holds the graph
  gate.open();
  REQUIRE(rt->synchronize_stream(s).ok());
  CHECK(gone == 1);
}

TEST_CASE("a watched capture that fails reports its graph gone at once",
          "[host][graphs][lifetime]") {
  auto rt = make_runtime_or_fail();
  const StreamHandle s = make_stream(*rt);
  std::atomic<int> gone{0};
  REQUIRE(rt->begin_capture(s, CaptureMode::kGlobal).ok());
  REQUIRE(rt->watch_capture_graph(s, [&gone] { ++gone; }).ok());
  CHECK_CODE(rt->synchronize_stream(s), Code::kFailedPrecondition);  // invalidates it
  CHECK_CODE(rt->watch_capture_graph(s, [&gone] { ++gone; }), Code::kFailedPrecondition);
  CHECK_CODE(rt->end_capture(s).status(), Code::kFailedPrecondition);
  CHECK(gone == 1);
}

TEST_CASE("a graph launched into a capture lives as long as the graph that inlined it",
          "[host][graphs][lifetime]") {
  auto rt = make_runtime_or_fail();
  const StreamHandle s = make_stream(*rt);
  std::atomic<int> child_gone{0};
  REQUIRE(rt->begin_capture(s, CaptureMode::kGlobal).ok());
  REQUIRE(rt->watch_capture_graph(s, [&child_gone] { ++child_gone; }).ok());
  REQUIRE(rt->launch_kernel(s, body_kernel("k", [] {})).ok());
  auto child = rt->end_capture(s);
  REQUIRE(child.ok());
  REQUIRE(rt->begin_capture(s, CaptureMode::kGlobal).ok());
  REQUIRE(rt->launch_graph(*child, s).ok());
  auto parent = rt->end_capture(s);
  REQUIRE(parent.ok());
  REQUIRE(rt->destroy_graph(*child).ok());
  CHECK(child_gone == 0);
  REQUIRE(rt->destroy_graph(*parent).ok());
  CHECK(child_gone == 1);
}
