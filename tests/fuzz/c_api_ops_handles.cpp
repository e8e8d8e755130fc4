// tests/fuzz/c_api_ops_handles.cpp: the C ABI fuzzer's operations on
// handles (tests/fuzz/c_api_fuzzer.cpp): streams, graph pools, captures
// begun and ended through the C ABI, graph replay and destroy.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <optional>
#include <string>

#include "c_api_fuzzer.hpp"
#include "capalloc/capalloc.h"

namespace capalloc::fuzz {

void op_stream(FuzzedDataProvider& in, State& st) {
  switch (in.ConsumeIntegralInRange<int>(0, 6)) {
    case 0:
    case 1: {
      if (st.streams.size() >= kMaxStreams) return;
      void* s = nullptr;
      if (CALL(Expect::kAny, capalloc_stream_create(0, &s)) == CAPALLOC_OK) {
        if (s == nullptr) die("capalloc_stream_create returned the default stream");
        if (is_live_stream(st, s) ||
            std::find(st.dead_streams.begin(), st.dead_streams.end(), s) != st.dead_streams.end()) {
          die("capalloc_stream_create returned %p, a handle in use or destroyed", s);
        }
        st.streams.push_back(s);
        tracef("stream %p created", s);
      }
      return;
    }
    case 2: {  // destroy a live stream
      if (st.streams.empty()) return;
      const std::size_t i = in.ConsumeIntegralInRange<std::size_t>(0, st.streams.size() - 1);
      void* s = st.streams[i];
      tracef("destroy stream %p", s);
      const bool capturing = is_capturing(st, s);
      const capalloc_status r =
          CALL(capturing ? Expect::kError : Expect::kAny, capalloc_stream_destroy(s));
      if (r == CAPALLOC_OK) {
        st.streams.erase(st.streams.begin() + static_cast<std::ptrdiff_t>(i));
        st.dead_streams.push_back(s);
      }
      return;
    }
    case 3: {
      void* s = pick_live_stream(in, st);
      CALL(is_capturing(st, s) ? Expect::kError : Expect::kAny, capalloc_stream_synchronize(s));
      return;
    }
    case 4: {  // bad destroys and synchronizes
      const auto s = pick_bad_stream(in, st);
      if (!s) return;
      CALL(Expect::kError, in.ConsumeBool() ? capalloc_stream_destroy(*s)
                                            : capalloc_stream_synchronize(*s));
      return;
    }
    case 5:
      CALL(Expect::kError, capalloc_stream_destroy(nullptr));  // the default stream
      return;
    default: {
      bool valid = true;
      const int device = pick_device(in, &valid);
      void* s = nullptr;
      if (valid) {
        CALL(Expect::kError, capalloc_stream_create(0, nullptr));
      } else {
        CALL(Expect::kError, capalloc_stream_create(device, &s));
      }
      return;
    }
  }
}

void op_pool(FuzzedDataProvider& in, State& st) {
  switch (in.ConsumeIntegralInRange<int>(0, 4)) {
    case 0:
    case 1: {
      if (st.pools.size() >= 8) return;
      std::uint64_t h = 0;
      if (CALL(Expect::kAny, capalloc_pool_create(0, &h)) == CAPALLOC_OK) {
        if (h == 0) die("capalloc_pool_create returned pool 0");
        if (std::find(st.pools.begin(), st.pools.end(), h) != st.pools.end()) {
          die("capalloc_pool_create returned pool %llu, which we hold",
              static_cast<unsigned long long>(h));
        }
        st.pools.push_back(h);
      }
      return;
    }
    case 2: {
      if (st.pools.empty()) return;
      const std::size_t i = in.ConsumeIntegralInRange<std::size_t>(0, st.pools.size() - 1);
      const std::uint64_t h = st.pools[i];
      if (CALL(Expect::kAny, capalloc_pool_release(h)) == CAPALLOC_OK) {
        st.pools.erase(st.pools.begin() + static_cast<std::ptrdiff_t>(i));
        if (std::find(st.pools.begin(), st.pools.end(), h) == st.pools.end()) {
          st.released_pools.push_back(h);
        }
      }
      return;
    }
    case 3: {  // a pool we hold no handle to
      const std::uint64_t h = pick_bad_pool(in, st);
      if (std::find(st.pools.begin(), st.pools.end(), h) != st.pools.end()) return;
      CALL(Expect::kError, capalloc_pool_release(h));
      return;
    }
    default: {
      bool valid = true;
      const int device = pick_device(in, &valid);
      std::uint64_t h = 0;
      CALL(Expect::kError, valid ? capalloc_pool_create(0, nullptr) : capalloc_pool_create(device, &h));
      return;
    }
  }
}

void op_capture_begin(FuzzedDataProvider& in, State& st) {
  const int kind = in.ConsumeIntegralInRange<int>(0, 5);
  const std::string label = pick_key(in);
  const char* label_arg = in.ConsumeIntegralInRange<int>(0, 4) == 0 ? nullptr : label.c_str();
  if (kind <= 2) {  // a valid capture
    if (st.streams.empty()) return;
    void* s = st.streams[in.ConsumeIntegralInRange<std::size_t>(0, st.streams.size() - 1)];
    std::uint64_t pool = 0;
    if (kind >= 1 && !st.pools.empty()) {
      pool = st.pools[in.ConsumeIntegralInRange<std::size_t>(0, st.pools.size() - 1)];
    }
    const bool already = is_capturing(st, s);
    tracef("capture on stream %p into pool %llu", s, static_cast<unsigned long long>(pool));
    if (CALL(already ? Expect::kError : Expect::kAny, capalloc_capture_begin(0, s, pool, label_arg)) ==
        CAPALLOC_OK) {
      st.capturing.insert(s);
    }
    return;
  }
  if (kind == 3) {  // the default stream, or a bad one
    const auto bad = in.ConsumeBool() ? std::optional<void*>(nullptr) : pick_bad_stream(in, st);
    if (!bad) return;
    CALL(Expect::kError, capalloc_capture_begin(0, *bad, 0, label_arg));
    return;
  }
  if (st.streams.empty()) return;
  void* s = st.streams[in.ConsumeIntegralInRange<std::size_t>(0, st.streams.size() - 1)];
  if (kind == 4) {  // a pool we do not hold
    const std::uint64_t pool = pick_bad_pool(in, st);
    if (std::find(st.pools.begin(), st.pools.end(), pool) != st.pools.end()) return;
    if (CALL(Expect::kError, capalloc_capture_begin(0, s, pool, label_arg)) == CAPALLOC_OK) {
      st.capturing.insert(s);
    }
    return;
  }
  bool valid = true;
  const int device = pick_device(in, &valid);
  if (valid) return;
  CALL(Expect::kError, capalloc_capture_begin(device, s, 0, label_arg));
}

void op_capture_end(FuzzedDataProvider& in, State& st) {
  const int kind = in.ConsumeIntegralInRange<int>(0, 4);
  const char* json = nullptr;
  const bool want_json = in.ConsumeBool();
  if (kind <= 2) {
    if (st.capturing.empty()) return;
    auto it = st.capturing.begin();
    std::advance(it, in.ConsumeIntegralInRange<std::size_t>(0, st.capturing.size() - 1));
    void* s = *it;
    tracef("end capture on stream %p", s);
    std::uint64_t graph = 0;
    const capalloc_status r =
        CALL(Expect::kAny, capalloc_capture_end(s, &graph, want_json ? &json : nullptr));
    // The runtime ends the capture whatever the outcome; the next end (in
    // the teardown) says if it did not.
    st.capturing.erase(it);
    if (r == CAPALLOC_OK) {
      tracef("  graph %llu", static_cast<unsigned long long>(graph));
      add_graph(st, graph);
      if (want_json) require_json(json, "capalloc_capture_end", true);
    }
    return;
  }
  if (kind == 3) {  // a stream not capturing, or a bad one
    void* s = pick_live_stream(in, st);
    if (st.capturing.count(s)) return;
    std::uint64_t graph = 0;
    CALL(Expect::kError, capalloc_capture_end(s, &graph, nullptr));
    const auto bad = pick_bad_stream(in, st);
    if (bad) CALL(Expect::kError, capalloc_capture_end(*bad, &graph, nullptr));
    return;
  }
  if (st.capturing.empty()) return;
  CALL(Expect::kError, capalloc_capture_end(*st.capturing.begin(), nullptr, &json));
}

void op_graph(FuzzedDataProvider& in, State& st) {
  switch (in.ConsumeIntegralInRange<int>(0, 4)) {
    case 0:
    case 1: {
      if (st.graphs.empty()) return;
      const std::uint64_t g = st.graphs[in.ConsumeIntegralInRange<std::size_t>(0, st.graphs.size() - 1)];
      void* s = pick_live_stream(in, st);
      tracef("replay graph %llu on stream %p", static_cast<unsigned long long>(g), s);
      CALL(Expect::kAny, capalloc_graph_replay(g, s));
      return;
    }
    case 2: {
      if (st.graphs.empty()) return;
      const std::size_t i = in.ConsumeIntegralInRange<std::size_t>(0, st.graphs.size() - 1);
      const std::uint64_t g = st.graphs[i];
      tracef("destroy graph %llu", static_cast<unsigned long long>(g));
      if (CALL(Expect::kAny, capalloc_graph_destroy(g)) == CAPALLOC_OK) {
        st.graphs.erase(st.graphs.begin() + static_cast<std::ptrdiff_t>(i));
        st.dead_graphs.push_back(g);
      }
      return;
    }
    case 3: {
      const std::uint64_t g = pick_bad_graph(in, st);
      if (std::find(st.graphs.begin(), st.graphs.end(), g) != st.graphs.end()) return;
      if (in.ConsumeBool()) {
        CALL(Expect::kError, capalloc_graph_replay(g, pick_live_stream(in, st)));
      } else {
        CALL(Expect::kError, capalloc_graph_destroy(g));
      }
      return;
    }
    default: {  // a replay on a bad stream
      if (st.graphs.empty()) return;
      const auto bad = pick_bad_stream(in, st);
      if (!bad) return;
      CALL(Expect::kError, capalloc_graph_replay(st.graphs.front(), *bad));
      return;
    }
  }
}

}  // namespace capalloc::fuzz
