// tests/capture_test_support.hpp: the fixture shared by the capture suites
// (capture_tracker_test.cpp, capture_lifecycle_test.cpp): World, an allocator
// and a CaptureTracker over a runtime with a side stream to capture on, and
// the calls those tests make through them (tensors, kernels, captures,
// replays, reading results back); and all_equal for the values read back.
#ifndef CAPALLOC_TESTS_CAPTURE_TEST_SUPPORT_HPP_
#define CAPALLOC_TESTS_CAPTURE_TEST_SUPPORT_HPP_

#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "capalloc/capture.hpp"
#include "test_support.hpp"

namespace capalloc::testing {

// One allocator and tracker over a runtime (the host runtime unless one is
// given), and a stream to capture on.
struct World {
  explicit World(std::shared_ptr<DeviceRuntime> runtime = nullptr, AllocatorOptions options = {})
      : rt(runtime ? std::move(runtime) : host_runtime()),
        alloc(make_allocator(rt, options)),
        tracker(*CaptureTracker::create(*alloc)),
        side(*rt->create_stream(0)) {}
  explicit World(AllocatorOptions options) : World(nullptr, options) {}
  ~World() {
    // Work still queued must not outlive the memory it touches; the tracker
    // (declared after the allocator) is destroyed before it.
    rt->synchronize_stream(kDefaultStream).IgnoreError();
    for (StreamHandle s : streams) rt->destroy_stream(s).IgnoreError();
    rt->destroy_stream(side).IgnoreError();
  }

  StreamHandle stream() {
    auto s = rt->create_stream(0);
    REQUIRE_OK(s);
    streams.push_back(*s);
    return *s;
  }
  float* tensor(std::size_t floats, StreamHandle s, std::string_view tag) {
    auto p = alloc->allocate(floats * sizeof(float), 0, s, {.tag = tag});
    REQUIRE_OK(p);
    return static_cast<float*>(*p);
  }
  void free(void* p) { REQUIRE_OK(alloc->deallocate(p)); }
  std::uint64_t seq(const void* p) const {
    auto info = alloc->block_info(p);
    REQUIRE_OK(info);
    return info->sequence;
  }
  void launch(StreamHandle s, KernelLaunch k) { REQUIRE_OK(rt->launch_kernel(s, std::move(k))); }
  // Runs a kernel on the default stream and waits for it (eager work).
  void run_now(KernelLaunch k) {
    launch(kDefaultStream, std::move(k));
    REQUIRE_OK(rt->synchronize_stream(kDefaultStream));
  }
  void replay(GraphHandle g) {
    REQUIRE_OK(tracker->replay(g, kDefaultStream));
    REQUIRE_OK(rt->synchronize_stream(kDefaultStream));
  }
  std::vector<float> read(const float* p, std::size_t floats) {
    std::vector<float> host(floats);
    REQUIRE_OK(rt->memcpy_async(host.data(), p, floats * sizeof(float), kDefaultStream));
    REQUIRE_OK(rt->synchronize_stream(kDefaultStream));
    return host;
  }
  // Captures `body` on the side stream into `pool` (kDefaultPool: private).
  CaptureResult capture(PoolHandle pool, const std::string& label, const std::function<void()>& body,
                        CaptureId* id = nullptr) {
    auto began = tracker->begin_capture(0, side, {.pool = pool, .label = label});
    REQUIRE_OK(began);
    if (id != nullptr) *id = *began;
    body();
    auto done = tracker->end_capture(side);
    REQUIRE_OK(done);
    return *std::move(done);
  }
  std::int64_t reserved() const { return alloc->stats(0)->reserved_bytes.current; }
  bool pool_exists(PoolHandle pool) const {
    auto s = alloc->pool_stats(pool);
    if (!s.ok()) CHECK(s.status().code() == absl::StatusCode::kNotFound);
    return s.ok();
  }

  std::shared_ptr<DeviceRuntime> rt;
  std::unique_ptr<Allocator> alloc;
  std::unique_ptr<CaptureTracker> tracker;
  StreamHandle side;
  std::vector<StreamHandle> streams;
};

// dst[i] = src[i], declaring src read and dst written: a host-only test
// kernel for verdicts that hinge on reads.
inline KernelLaunch copy_kernel(float* dst, const float* src, std::size_t n) {
  KernelLaunch k;
  k.name = "copy";
  k.reads = {{src, n * sizeof(float)}};
  k.writes = {{dst, n * sizeof(float)}};
  k.host_body = [dst, src, n] {
    for (std::size_t i = 0; i < n; ++i) dst[i] = src[i];
  };
  return k;
}

// p[i] = value, declaring p written: the plainest writing kernel.
inline KernelLaunch fill_floats(float* p, std::size_t n, float value) {
  KernelLaunch k;
  k.name = "fill";
  k.writes = {{p, n * sizeof(float)}};
  k.host_body = [p, n, value] {
    for (std::size_t i = 0; i < n; ++i) p[i] = value;
  };
  return k;
}

// Makes `to` wait for everything `from` has done so far (a fork, or a join,
// of a capture's streams).
inline void join_streams(World& w, StreamHandle from, StreamHandle to) {
  auto e = w.rt->create_event(0);
  REQUIRE_OK(e);
  REQUIRE_OK(w.rt->record_event(*e, from));
  REQUIRE_OK(w.rt->stream_wait_event(to, *e));
  REQUIRE_OK(w.rt->destroy_event(*e));
}

// The finding of graph `graph` (its label) on the block tagged `victim` with
// `harm`, or null.
inline const Finding* find_finding(const std::vector<Finding>& findings, std::string_view graph,
                                   std::string_view victim, Harm harm = Harm::kClobber) {
  for (const Finding& f : findings) {
    if (f.graph_label == graph && f.victim.tag == victim && f.harm == harm) return &f;
  }
  return nullptr;
}

inline bool all_equal(const std::vector<float>& v, float value) {
  return std::all_of(v.begin(), v.end(), [&](float x) { return x == value; });
}

}  // namespace capalloc::testing

#endif  // CAPALLOC_TESTS_CAPTURE_TEST_SUPPORT_HPP_
