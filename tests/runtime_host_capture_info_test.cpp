// runtime_host_capture_info_test.cpp: the host runtime's capture_info, which
// reads each stream's published capture state without the runtime's lock
// (runtime/published_capture_states.hpp), answers as CUDA's
// cudaStreamGetCaptureInfo does: per stream, from any thread, consistent
// while other threads begin and end captures and create and destroy streams.
#include <atomic>
#include <memory>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "capalloc/runtime.hpp"

namespace {

using capalloc::CaptureId;
using capalloc::CaptureInfo;
using capalloc::CaptureMode;
using capalloc::CaptureStatus;
using capalloc::DeviceRuntime;
using capalloc::StreamHandle;
using Code = absl::StatusCode;

std::shared_ptr<DeviceRuntime> make_runtime() {
  auto runtime = capalloc::make_host_runtime({});
  REQUIRE(runtime.ok());
  return *std::move(runtime);
}

StreamHandle new_stream(DeviceRuntime& rt) {
  auto stream = rt.create_stream(0);
  REQUIRE(stream.ok());
  return *stream;
}

capalloc::KernelLaunch noop_kernel() {
  capalloc::KernelLaunch kernel;
  kernel.name = "noop";
  kernel.host_body = [] {};
  return kernel;
}

// What capture_info may answer for a stream at all: outside a capture
// (everything zero), or in one (an id, the graph named by it).
bool well_formed(const CaptureInfo& info) {
  if (info.status == CaptureStatus::kNone) {
    return info.id == 0 && info.position == 0 && info.graph == 0;
  }
  return info.id != 0 && info.graph == static_cast<std::uintptr_t>(info.id);
}

}  // namespace

TEST_CASE("capture_info sees another thread's begin, nodes, join, invalidation and end",
          "[host][capture][threads]") {
  auto rt = make_runtime();
  const StreamHandle origin = new_stream(*rt);
  const StreamHandle side = new_stream(*rt);
  auto event = rt->create_event(0);
  REQUIRE(event.ok());

  // Each step runs on a thread of its own; its outcome is checked here, on
  // the test thread, after the join.
  CaptureId id = 0;
  bool ok = true;
  std::thread([&] {
    auto begun = rt->begin_capture(origin, CaptureMode::kRelaxed);
    ok = begun.ok();
    id = begun.ok() ? *begun : 0;
    for (int i = 0; i < 3; ++i) ok = ok && rt->launch_kernel(origin, noop_kernel()).ok();
  }).join();
  REQUIRE(ok);
  auto info = rt->capture_info(origin);
  REQUIRE(info.ok());
  CHECK(info->status == CaptureStatus::kActive);
  CHECK(info->id == id);
  CHECK(info->position == 3);
  CHECK(info->graph == static_cast<std::uintptr_t>(id));
  CHECK(rt->capture_info(side)->status == CaptureStatus::kNone);

  // The side stream joins on another thread; both streams then see the
  // capture's position advance with either stream's nodes.
  std::thread([&] {
    ok = rt->record_event(*event, origin).ok() && rt->stream_wait_event(side, *event).ok() &&
         rt->launch_kernel(side, noop_kernel()).ok();
  }).join();
  REQUIRE(ok);
  CHECK(rt->capture_info(side)->id == id);
  CHECK(rt->capture_info(side)->position == 4);
  CHECK(rt->capture_info(origin)->position == 4);

  // Invalidation shows on every member stream.
  std::thread([&] { ok = !rt->synchronize_stream(side).ok(); }).join();
  CHECK(ok);
  CHECK(rt->capture_info(origin)->status == CaptureStatus::kInvalidated);
  CHECK(rt->capture_info(side)->status == CaptureStatus::kInvalidated);

  std::thread([&] { ok = !rt->end_capture(origin).ok(); }).join();
  CHECK(ok);
  for (StreamHandle s : {origin, side}) {
    auto after = rt->capture_info(s);
    REQUIRE(after.ok());
    CHECK(after->status == CaptureStatus::kNone);
    CHECK(well_formed(*after));
  }
  REQUIRE(rt->destroy_event(*event).ok());
}

TEST_CASE("capture_info knows every stream created, and no stream destroyed or never made",
          "[host][capture]") {
  auto rt = make_runtime();
  // More streams than one chunk of published slots holds.
  std::vector<StreamHandle> streams;
  for (int i = 0; i < 1100; ++i) streams.push_back(new_stream(*rt));
  for (StreamHandle s : streams) {
    auto info = rt->capture_info(s);
    REQUIRE(info.ok());
    CHECK(info->status == CaptureStatus::kNone);
  }
  const StreamHandle last = streams.back();
  auto id = rt->begin_capture(last, CaptureMode::kRelaxed);
  REQUIRE(id.ok());
  CHECK(rt->capture_info(last)->id == *id);
  CHECK_FALSE(rt->destroy_stream(last).ok());  // part of a capture
  auto graph = rt->end_capture(last);
  REQUIRE(graph.ok());
  REQUIRE(rt->destroy_graph(*graph).ok());
  for (std::size_t i = 0; i < streams.size(); i += 2) REQUIRE(rt->destroy_stream(streams[i]).ok());
  for (std::size_t i = 0; i < streams.size(); ++i) {
    auto info = rt->capture_info(streams[i]);
    CHECK(info.ok() == (i % 2 == 1));
    if (!info.ok()) CHECK(info.status().code() == Code::kNotFound);
  }
  CHECK(rt->capture_info(last + 1).status().code() == Code::kNotFound);
  CHECK(rt->capture_info(StreamHandle{1} << 40).status().code() == Code::kNotFound);
  CHECK(rt->capture_info(capalloc::kDefaultStream)->status == CaptureStatus::kNone);
}

TEST_CASE("capture_info stays consistent while other threads capture and destroy streams",
          "[host][capture][threads]") {
  auto rt = make_runtime();
  const StreamHandle captured = new_stream(*rt);
  constexpr int kCaptures = 300;
  constexpr std::size_t kNodes = 5;
  std::atomic<bool> done{false};
  std::atomic<StreamHandle> churned{0};
  std::atomic<int> failures{0};

  std::thread capturer([&] {
    for (int c = 0; c < kCaptures; ++c) {
      auto id = rt->begin_capture(captured, CaptureMode::kRelaxed);
      if (!id.ok()) ++failures;
      for (std::size_t n = 0; n < kNodes; ++n) {
        if (!rt->launch_kernel(captured, noop_kernel()).ok()) ++failures;
      }
      auto graph = rt->end_capture(captured);
      if (!graph.ok() || !rt->destroy_graph(*graph).ok()) ++failures;
    }
    done = true;
  });
  std::thread churner([&] {
    while (!done) {
      auto s = rt->create_stream(0);
      if (!s.ok()) {
        ++failures;
        continue;
      }
      churned = *s;
      if (!rt->destroy_stream(*s).ok()) ++failures;
    }
  });

  // Per capture id, positions never go back; a churned stream is either
  // known and outside any capture, or not found.
  std::size_t reads = 0;
  std::size_t active_reads = 0;
  CaptureId last_id = 0;
  std::size_t last_position = 0;
  bool consistent = true;
  while (!done) {
    auto info = rt->capture_info(captured);
    ++reads;
    if (!info.ok() || !well_formed(*info) || info->position > kNodes) {
      consistent = false;
      break;
    }
    if (info->status == CaptureStatus::kActive) {
      ++active_reads;
      if (info->id == last_id && info->position < last_position) consistent = false;
      if (info->id < last_id) consistent = false;  // ids increase
      last_id = info->id;
      last_position = info->position;
    }
    if (const StreamHandle s = churned.load(); s != 0) {
      auto other = rt->capture_info(s);
      if (other.ok() ? other->status != CaptureStatus::kNone
                     : other.status().code() != Code::kNotFound) {
        consistent = false;
      }
    }
  }
  capturer.join();
  churner.join();
  INFO("reads " << reads << ", in a capture " << active_reads);
  CHECK(consistent);
  CHECK(failures == 0);
  CHECK(rt->capture_info(captured)->status == CaptureStatus::kNone);
}
