// tests/fuzz/c_api_ops_captures.cpp: the C ABI fuzzer's whole captures
// (tests/fuzz/c_api_fuzzer.cpp): one through the C ABI, with allocations,
// frees, work and replays in it, and one begun on the runtime directly, as
// PyTorch captures.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "c_api_fuzzer.hpp"
#include "capalloc/capalloc.h"
#include "capalloc/runtime.hpp"

namespace capalloc::fuzz {
namespace {

// Work recorded in the capture on `s`: a memset of one of the blocks the
// capture allocated (`mine`), so that its replays write graph memory only,
// or a kernel without a body.
void capture_work(FuzzedDataProvider& in, const State& st, void* s,
                  const std::vector<std::uintptr_t>& mine) {
  if (!mine.empty() && in.ConsumeBool()) {
    const Block& b =
        st.live.at(mine[in.ConsumeIntegralInRange<std::size_t>(0, mine.size() - 1)]);
    const std::size_t offset = in.ConsumeIntegralInRange<std::size_t>(0, b.size - 1);
    const std::size_t bytes = in.ConsumeIntegralInRange<std::size_t>(1, b.size - offset);
    tracef("  memset %p + %zu, %zu bytes", reinterpret_cast<void*>(b.addr), offset, bytes);
    device_runtime()
        .memset_async(reinterpret_cast<void*>(b.addr + offset), in.ConsumeIntegral<std::uint8_t>(),
                      bytes, reinterpret_cast<capalloc::StreamHandle>(s))
        .IgnoreError();
  } else {
    launch_bodiless_kernel(in, st, s);
  }
}

}  // namespace

// A whole capture at once (the separate begin and end operations rarely
// line up with allocations in between): begin on a stream, a few
// allocations, frees and replays on it, then usually the end. Captures into
// a shared pool reuse each other's memory, which is what findings are made
// of.
void op_capture_scenario(FuzzedDataProvider& in, State& st) {
  if (st.streams.size() < kMaxStreams && (st.streams.empty() || in.ConsumeBool())) {
    void* s = nullptr;
    if (CALL(Expect::kAny, capalloc_stream_create(0, &s)) == CAPALLOC_OK) st.streams.push_back(s);
  }
  std::vector<void*> idle;
  for (void* s : st.streams) {
    if (!is_capturing(st, s)) idle.push_back(s);
  }
  if (idle.empty()) return;
  void* s = idle[in.ConsumeIntegralInRange<std::size_t>(0, idle.size() - 1)];
  std::uint64_t pool = 0;
  switch (in.ConsumeIntegralInRange<int>(0, 2)) {
    case 0:
      break;
    case 1:
      if (!st.pools.empty()) {
        pool = st.pools[in.ConsumeIntegralInRange<std::size_t>(0, st.pools.size() - 1)];
        break;
      }
      [[fallthrough]];
    default:
      if (st.pools.size() < 8 && CALL(Expect::kAny, capalloc_pool_create(0, &pool)) == CAPALLOC_OK) {
        st.pools.push_back(pool);
      } else {
        pool = 0;
      }
      break;
  }
  tracef("capture scenario on stream %p into pool %llu", s, static_cast<unsigned long long>(pool));
  if (CALL(Expect::kAny, capalloc_capture_begin(0, s, pool, "scenario")) != CAPALLOC_OK) return;
  st.capturing.insert(s);
  std::vector<std::uintptr_t> mine;  // allocated in this capture, still live
  const int steps = in.ConsumeIntegralInRange<int>(1, 10);
  for (int i = 0; i < steps; ++i) {
    switch (in.ConsumeIntegralInRange<int>(0, 6)) {
      case 0:
      case 1:
      case 2: {
        const std::size_t size = in.ConsumeBool() ? in.ConsumeIntegralInRange<std::size_t>(1, 8192)
                                                  : pick_size(in);
        if (st.live.size() >= kMaxBlocks || st.live_bytes + size > kLiveBytesCap) break;
        void* p = nullptr;
        if (in.ConsumeBool()) {
          const std::string tag = pick_key(in);
          if (CALL(Expect::kAny, capalloc_malloc_tagged(&p, size, 0, s, tag.c_str(), 0)) !=
              CAPALLOC_OK) {
            break;
          }
        } else if (CALL(Expect::kAny, capalloc_malloc(&p, size, 0, s)) != CAPALLOC_OK) {
          break;
        }
        tracef("  capture malloc(%zu) = %p", size, p);
        add_block(st, p, size, "capalloc_malloc (capturing)");
        mine.push_back(reinterpret_cast<std::uintptr_t>(p));
        break;
      }
      case 3: {  // free one of this capture's blocks
        if (mine.empty()) break;
        const std::size_t j = in.ConsumeIntegralInRange<std::size_t>(0, mine.size() - 1);
        tracef("  capture free %p", reinterpret_cast<void*>(mine[j]));
        if (CALL(Expect::kAny, capalloc_free(reinterpret_cast<void*>(mine[j]))) == CAPALLOC_OK) {
          remove_block(st, mine[j]);
        }
        mine.erase(mine.begin() + static_cast<std::ptrdiff_t>(j));
        break;
      }
      case 4: {  // free (or use) a block from outside the capture
        const Block* b = pick_block(in, st, false);
        if (b == nullptr) break;
        const std::uintptr_t addr = b->addr;
        if (in.ConsumeBool()) {
          CALL(Expect::kAny, capalloc_record_stream(reinterpret_cast<void*>(addr), s));
          break;
        }
        verify_pattern(*b, "before free (during a capture)");
        if (CALL(Expect::kAny, capalloc_free(reinterpret_cast<void*>(addr))) == CAPALLOC_OK) {
          remove_block(st, addr);
          mine.erase(std::remove(mine.begin(), mine.end(), addr), mine.end());
        }
        break;
      }
      case 5:  // work: a memset of this capture's blocks, or a kernel
        capture_work(in, st, s, mine);
        break;
      default: {  // a graph launched into the capture
        if (st.graphs.empty()) break;
        const std::uint64_t g =
            st.graphs[in.ConsumeIntegralInRange<std::size_t>(0, st.graphs.size() - 1)];
        CALL(Expect::kAny, capalloc_graph_replay(g, s));
        break;
      }
    }
    check_all(st, "a capture scenario's step");
  }
  if (in.ConsumeIntegralInRange<int>(0, 7) == 0) return;  // left open
  std::uint64_t graph = 0;
  const char* json = nullptr;
  const capalloc_status r = CALL(Expect::kAny, capalloc_capture_end(s, &graph, &json));
  st.capturing.erase(s);
  if (r != CAPALLOC_OK) return;
  tracef("  graph %llu", static_cast<unsigned long long>(graph));
  add_graph(st, graph);
  require_json(json, "capalloc_capture_end", true);
  if (in.ConsumeBool()) CALL(Expect::kAny, capalloc_graph_replay(graph, pick_live_stream(in, st)));
}

// A capture begun on the runtime directly, as PyTorch captures, with its
// allocations through PyTorch's entry points: the pool hooks route them to
// a PyTorch pool (capalloc_torch_begin_allocate_to_pool before the capture,
// the end hook after it), or the allocator finds the capture by itself and
// gives it a private pool that lives as long as the runtime's graph.
void op_native_capture(FuzzedDataProvider& in, State& st) {
  capalloc::DeviceRuntime& rt = device_runtime();
  const int kind = in.ConsumeIntegralInRange<int>(0, 5);
  if (kind == 4) {  // replay or destroy a graph of the runtime
    if (st.native_graphs.empty()) return;
    const std::size_t i = in.ConsumeIntegralInRange<std::size_t>(0, st.native_graphs.size() - 1);
    const std::uint64_t g = st.native_graphs[i];
    if (in.ConsumeBool()) {
      void* s = pick_live_stream(in, st);
      tracef("runtime: launch graph %llu on stream %p", static_cast<unsigned long long>(g), s);
      rt.launch_graph(g, reinterpret_cast<capalloc::StreamHandle>(s)).IgnoreError();
    } else {
      tracef("runtime: destroy graph %llu", static_cast<unsigned long long>(g));
      if (rt.destroy_graph(g).ok()) {
        st.native_graphs.erase(st.native_graphs.begin() + static_cast<std::ptrdiff_t>(i));
      }
    }
    return;
  }
  if (kind == 5) {  // end a capture left open
    if (st.native.empty()) return;
    void* s = *st.native.begin();
    tracef("runtime: end capture on stream %p", s);
    auto graph = rt.end_capture(reinterpret_cast<capalloc::StreamHandle>(s));
    st.native.erase(s);  // over, whatever the outcome
    if (graph.ok()) st.native_graphs.push_back(*graph);
    return;
  }
  std::vector<void*> idle;
  for (void* s : st.streams) {
    if (!is_capturing(st, s)) idle.push_back(s);
  }
  if (idle.empty()) return;
  void* s = idle[in.ConsumeIntegralInRange<std::size_t>(0, idle.size() - 1)];
  const auto handle = reinterpret_cast<capalloc::StreamHandle>(s);
  // PyTorch announces the pool before the capture exists.
  std::optional<std::pair<std::uint64_t, std::uint64_t>> torch_pool;
  if (in.ConsumeIntegralInRange<int>(0, 3) != 0) {
    const auto id = pick_torch_pool(in);
    const bool zero = id.first == 0 && id.second == 0;
    if (zero || st.torch[id].begins < 6) {
      capalloc_stream_filter filter = in.ConsumeBool() ? accept_if_context : accept_all;
      if (in.ConsumeIntegralInRange<int>(0, 5) == 0) filter = reject_all;
      if (CALL(zero ? Expect::kError : Expect::kAny,
               capalloc_torch_begin_allocate_to_pool(0, id.first, id.second, filter, s)) ==
          CAPALLOC_OK) {
        ++st.torch[id].begins;
        torch_pool = id;
      }
    }
  }
  static constexpr capalloc::CaptureMode kModes[] = {
      capalloc::CaptureMode::kGlobal, capalloc::CaptureMode::kThreadLocal,
      capalloc::CaptureMode::kRelaxed};
  const capalloc::CaptureMode mode = in.PickValueInArray(kModes);
  tracef("runtime: capture on stream %p (mode %d)", s, static_cast<int>(mode));
  if (!rt.begin_capture(handle, mode).ok()) return;
  st.native.insert(s);
  // The C ABI's own capture calls refuse a capture they did not begin.
  std::uint64_t graph = 0;
  CALL(Expect::kError, capalloc_capture_end(s, &graph, nullptr));
  CALL(Expect::kError, capalloc_capture_begin(0, s, 0, nullptr));
  CALL(Expect::kError, capalloc_stream_synchronize(s));

  std::vector<std::uintptr_t> mine;
  const int steps = in.ConsumeIntegralInRange<int>(1, 10);
  for (int i = 0; i < steps; ++i) {
    switch (in.ConsumeIntegralInRange<int>(0, 4)) {
      case 0:
      case 1: {
        const std::size_t size = in.ConsumeBool() ? in.ConsumeIntegralInRange<std::size_t>(1, 8192)
                                                  : pick_size(in);
        if (st.live.size() >= kMaxBlocks || st.live_bytes + size > kLiveBytesCap) break;
        void* p = nullptr;
        if (in.ConsumeIntegralInRange<int>(0, 3) != 0) {
          p = capalloc_torch_malloc(size, 0, s);
        } else if (CALL(Expect::kAny, capalloc_malloc(&p, size, 0, s)) != CAPALLOC_OK) {
          p = nullptr;
        }
        tracef("  native capture malloc(%zu) = %p", size, p);
        if (p == nullptr) break;
        add_block(st, p, size, "malloc (native capture)");
        mine.push_back(reinterpret_cast<std::uintptr_t>(p));
        break;
      }
      case 2: {  // PyTorch's free of one of this capture's blocks
        if (mine.empty()) break;
        const std::size_t j = in.ConsumeIntegralInRange<std::size_t>(0, mine.size() - 1);
        const auto addr = mine[j];
        const capalloc_stats before = stats_now("torch_free (native capture)");
        capalloc_torch_free(reinterpret_cast<void*>(addr), st.live.at(addr).size, 0, s);
        const capalloc_stats after = stats_now("torch_free (native capture)");
        tracef("  native capture torch_free %p: %lld blocks -> %lld", reinterpret_cast<void*>(addr),
               static_cast<long long>(before.allocated_blocks),
               static_cast<long long>(after.allocated_blocks));
        if (after.allocated_blocks == before.allocated_blocks - 1) remove_block(st, addr);
        mine.erase(mine.begin() + static_cast<std::ptrdiff_t>(j));
        break;
      }
      case 3:
        capture_work(in, st, s, mine);
        break;
      default: {  // a graph launched into the capture
        if (st.native_graphs.empty()) break;
        rt.launch_graph(st.native_graphs[in.ConsumeIntegralInRange<std::size_t>(
                            0, st.native_graphs.size() - 1)],
                        handle)
            .IgnoreError();
        break;
      }
    }
    check_all(st, "a native capture's step");
  }
  if (in.ConsumeIntegralInRange<int>(0, 7) == 0) return;  // left open
  tracef("runtime: end capture on stream %p", s);
  auto ended = rt.end_capture(handle);
  st.native.erase(s);
  if (ended.ok()) st.native_graphs.push_back(*ended);
  if (torch_pool && in.ConsumeIntegralInRange<int>(0, 3) != 0) {
    const char* json = nullptr;
    if (CALL(Expect::kAny, capalloc_torch_end_allocate_to_pool(0, torch_pool->first,
                                                              torch_pool->second, &json)) ==
        CAPALLOC_OK) {
      require_json(json, "capalloc_torch_end_allocate_to_pool", true);
    }
  }
  if (ended.ok() && in.ConsumeBool()) {
    rt.launch_graph(*ended, reinterpret_cast<capalloc::StreamHandle>(pick_live_stream(in, st)))
        .IgnoreError();
  }
}

}  // namespace capalloc::fuzz
