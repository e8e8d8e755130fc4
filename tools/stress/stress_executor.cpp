// tools/stress/stress_executor.cpp: applies stress operations to an
// allocator and checks its properties after each one (see stress_driver.hpp).
#include <algorithm>
#include <cstring>
#include <limits>
#include <map>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "capalloc/allocator.hpp"
#include "capalloc/capture.hpp"
#include "capalloc/persistent_cache.hpp"
#include "capalloc/runtime.hpp"
#include "tools/stress/stress_world.hpp"

namespace capalloc::stress {

namespace {

constexpr int kSlots = 3;  // the default stream and two created ones per device
constexpr int kKeys = 4;   // persistent keys per device

std::uint64_t mix(std::uint64_t x) {
  x ^= x >> 33;
  x *= 0xFF51AFD7ED558CCDull;
  x ^= x >> 33;
  return x | 1;  // never 0, so a zeroed block never passes for intact
}

struct Live {
  void* ptr = nullptr;
  std::size_t requested = 0;
  std::size_t rounded = 0;
  int device = 0;
  StreamHandle stream = kDefaultStream;
  std::uint64_t cookie = 0;  // 0: none (allocated in a capture: its graph writes it)
  std::vector<StreamHandle> used_on;  // streams given to record_stream
  bool in_capture = false;
};

bool same_counts(const AllocatorStats& a, const AllocatorStats& b) {
  return a.allocated_bytes.current == b.allocated_bytes.current &&
         a.requested_bytes.current == b.requested_bytes.current &&
         a.allocated_blocks.current == b.allocated_blocks.current &&
         a.allocations == b.allocations && a.frees == b.frees && a.ooms == b.ooms;
}

}  // namespace

struct Executor::State {
  std::shared_ptr<World> world;
  int thread = 0;
  ExecOptions options;
  Counters counters;
  std::size_t op_index = 0;
  std::vector<Live> live;  // blocks allocated by allocate(), in allocation order
  std::map<std::pair<int, int>, Live> persistent;  // (device, key)
  std::vector<void*> freed;                        // recently freed pointers, for double frees
  StreamHandle streams[kDevices][kSlots] = {};
  struct Capture {
    bool active = false;
    int device = 0;
    int slot = 0;
    StreamHandle stream = 0;
  } capture;
  std::vector<GraphHandle> graphs;
  StreamHandle dead_streams[kDevices] = {};  // the last stream destroyed, per device
  std::vector<PoolHandle> released_pools;     // shared pools whose handle was given up
  // What the stats must show, per device (the executor's share in a threaded run).
  std::int64_t model_peak_allocated[kDevices] = {};
  std::uint64_t allocations[kDevices] = {}, frees[kDevices] = {}, ooms[kDevices] = {};

  std::string key_name(int key) const { return absl::StrFormat("stress.t%d.k%d", thread, key); }
  Allocator& alloc() { return *world->allocator; }
  DeviceRuntime& rt() { return *world->runtime; }
  bool threaded() const { return world->threaded; }

  std::string fail(const std::string& what) const {
    return absl::StrFormat("thread %d, op %d: %s", thread, op_index, what);
  }

  void model_sums(int device, std::int64_t& bytes, std::int64_t& requested,
                  std::int64_t& blocks) const {
    auto add = [&](const Live& b) {
      if (b.device != device) return;
      bytes += static_cast<std::int64_t>(b.rounded);
      requested += static_cast<std::int64_t>(b.requested);
      ++blocks;
    };
    for (const Live& b : live) add(b);
    for (const auto& [k, b] : persistent) add(b);
  }

  void write_cookie(Live& b) {
    if (b.cookie != 0) std::memcpy(b.ptr, &b.cookie, sizeof b.cookie);
  }
  bool cookie_intact(const Live& b) const {
    if (b.cookie == 0) return true;
    std::uint64_t v;
    std::memcpy(&v, b.ptr, sizeof v);
    return v == b.cookie;
  }

  // A new block: checks its address and size, that it overlaps no live block
  // (every device's blocks share one address space on the host runtime), and
  // writes its cookie.
  std::optional<std::string> admit(Live& b) {
    auto info = alloc().block_info(b.ptr);
    if (!info.ok()) return fail("block_info of a new block: " + info.status().ToString());
    const std::size_t granularity = alloc().options().round_granularity;
    if (info->ptr != b.ptr || info->size < b.requested || info->size % granularity != 0 ||
        reinterpret_cast<std::uintptr_t>(b.ptr) % granularity != 0 || info->device != b.device ||
        info->requested != b.requested || info->state != BlockState::kAllocated) {
      return fail(absl::StrFormat("new block %p: block_info says size %d requested %d device %d "
                                  "state %d, asked %d B on device %d",
                                  b.ptr, info->size, info->requested, info->device,
                                  static_cast<int>(info->state), b.requested, b.device));
    }
    b.rounded = info->size;
    if (auto overlap = world->claim(b.ptr, b.rounded); overlap) return fail(*overlap);
    write_cookie(b);
    return std::nullopt;
  }

  void forget(const Live& b) {
    world->unclaim(b.ptr);
    freed.push_back(b.ptr);
    if (freed.size() > 16) freed.erase(freed.begin());
  }

  // --- The checks after every operation --------------------------------------

  std::optional<std::string> check_cookies() {
    std::vector<Live*> broken;
    for (Live& b : live)
      if (!cookie_intact(b)) broken.push_back(&b);
    for (auto& [k, b] : persistent)
      if (!cookie_intact(b)) broken.push_back(&b);
    if (broken.empty()) return std::nullopt;
    // Allowed only where a finding names the block as a victim.
    const std::vector<Finding> findings = world->tracker->check();
    for (Live* b : broken) {
      const MemorySpan cookie{b->ptr, sizeof b->cookie};
      const bool predicted = std::any_of(findings.begin(), findings.end(), [&](const Finding& f) {
        return f.victim.span().overlaps(cookie);
      });
      if (!predicted) {
        return fail(absl::StrFormat(
            "the cookie of live block %p (%d B, device %d) changed and no finding predicted it",
            b->ptr, b->requested, b->device));
      }
      ++counters.predicted_clobbers;
      write_cookie(*b);
    }
    return std::nullopt;
  }

  std::optional<std::string> check_stats() {
    for (int d = 0; d < kDevices; ++d) {
      auto stats = alloc().stats(d);
      if (!stats.ok()) return fail("stats: " + stats.status().ToString());
      std::int64_t bytes = 0, requested = 0, blocks = 0;
      model_sums(d, bytes, requested, blocks);
      model_peak_allocated[d] = std::max(model_peak_allocated[d], bytes);
      const AllocatorStats& s = *stats;
      if (s.allocated_bytes.current != bytes || s.requested_bytes.current != requested ||
          s.allocated_blocks.current != blocks || s.allocations != allocations[d] ||
          s.frees != frees[d] || s.ooms != ooms[d] ||
          s.allocated_bytes.peak < model_peak_allocated[d] ||
          s.reserved_bytes.current < s.allocated_bytes.current) {
        return fail(absl::StrFormat(
            "device %d stats: allocated %d B (peak %d) requested %d B in %d blocks, "
            "%d allocations %d frees %d ooms, reserved %d B; the model: %d B (peak %d) "
            "requested %d B in %d blocks, %d allocations %d frees %d ooms",
            d, s.allocated_bytes.current, s.allocated_bytes.peak, s.requested_bytes.current,
            s.allocated_blocks.current, s.allocations, s.frees, s.ooms, s.reserved_bytes.current,
            bytes, model_peak_allocated[d], requested, blocks, allocations[d], frees[d],
            ooms[d]));
      }
    }
    return std::nullopt;
  }

  std::optional<std::string> check_all() {
    if (absl::Status s = alloc().CheckInvariants(); !s.ok())
      return fail("CheckInvariants: " + s.ToString());
    ++counters.invariant_checks;
    if (auto e = check_cookies()) return e;
    if (!threaded()) return check_stats();
    return std::nullopt;
  }

  // --- Operations ---------------------------------------------------------------

  StreamHandle stream_of(int device, int slot) const { return streams[device][slot % kSlots]; }
  bool is_capturing(StreamHandle s) const { return capture.active && capture.stream == s; }

  // An invalid call: must fail and change nothing (single-threaded: the stats
  // of both devices compare equal).
  template <typename Call>
  std::optional<std::string> expect_error(const char* what, Call&& call) {
    AllocatorStats before[kDevices];
    if (!threaded())
      for (int d = 0; d < kDevices; ++d) before[d] = *alloc().stats(d);
    const absl::Status status = call();
    if (status.ok()) return fail(absl::StrFormat("invalid call %s succeeded", what));
    if (!threaded()) {
      for (int d = 0; d < kDevices; ++d) {
        if (!same_counts(before[d], *alloc().stats(d)))
          return fail(absl::StrFormat("invalid call %s (%s) changed device %d's stats", what,
                                      status.ToString(), d));
      }
    }
    ++counters.invalid_calls_checked;
    return std::nullopt;
  }

  std::optional<std::string> do_alloc(const Op& op, std::size_t bytes, bool oom_expected) {
    const int device = op.device % kDevices;
    const StreamHandle stream = stream_of(device, op.stream);
    auto p = alloc().allocate(bytes, device, stream, {.tag = "stress"});
    if (!p.ok()) {
      if (p.status().code() != absl::StatusCode::kResourceExhausted)
        return fail(absl::StrFormat("allocate(%d) on device %d: %s", bytes, device,
                                    p.status().ToString()));
      ++ooms[device];
      ++counters.ooms;
      if (!oom_expected && !threaded()) {
        // Out of memory is right only when the segment it needs does not fit
        // beside what is still reserved after the cache was released.
        const auto stats = *alloc().stats(device);
        const AllocatorOptions& o = alloc().options();
        const std::size_t rounded = (bytes + o.round_granularity - 1) / o.round_granularity *
                                    o.round_granularity;
        constexpr std::size_t kHugeRounding = std::size_t{2} << 20;
        const std::size_t need =
            rounded <= o.small_request_limit    ? o.small_segment_bytes
            : rounded <= o.medium_request_limit ? o.large_segment_bytes
                                                : (rounded + kHugeRounding - 1) / kHugeRounding *
                                                      kHugeRounding;
        if (static_cast<std::size_t>(stats.reserved_bytes.current) + need <=
            options.memory_limit_per_device) {
          return fail(absl::StrFormat(
              "allocate(%d) on device %d: out of memory with %d B reserved of a %d B limit",
              bytes, device, stats.reserved_bytes.current, options.memory_limit_per_device));
        }
      }
      return std::nullopt;
    }
    if (oom_expected)
      return fail(absl::StrFormat("allocate(%d) beyond the device limit succeeded", bytes));
    ++allocations[device];
    Live b;
    b.ptr = *p;
    b.requested = bytes;
    b.device = device;
    b.stream = stream;
    b.in_capture = is_capturing(stream);
    b.cookie = b.in_capture ? 0 : mix(world->next_cookie());
    if (auto e = admit(b)) return e;
    live.push_back(std::move(b));
    return std::nullopt;
  }

  std::optional<std::string> free_block(std::size_t index) {
    Live b = live[index];
    if (!cookie_intact(b)) {
      if (auto e = check_cookies()) return e;
    }
    // Unclaimed first: once deallocate returns, another thread may get the memory.
    forget(b);
    if (absl::Status s = alloc().deallocate(b.ptr, b.device); !s.ok())
      return fail(absl::StrFormat("deallocate(%p): %s", b.ptr, s.ToString()));
    ++frees[b.device];
    live[index] = std::move(live.back());
    live.pop_back();
    return std::nullopt;
  }

  // A created stream of `device` no live block was allocated or recorded on
  // (destroying one in use is the caller's error, as in CUDA).
  bool stream_unused(StreamHandle s) const {
    for (const Live& b : live)
      if (b.stream == s || std::find(b.used_on.begin(), b.used_on.end(), s) != b.used_on.end())
        return false;
    return !is_capturing(s);
  }

  std::optional<std::string> tick(StreamHandle s) {
    KernelLaunch k;
    k.name = "stress.tick";
    k.host_body = [] {};
    if (absl::Status st = rt().launch_kernel(s, std::move(k)); !st.ok())
      return fail("launch_kernel: " + st.ToString());
    return std::nullopt;
  }

  std::optional<std::string> apply(const Op& op);
  std::optional<std::string> apply_invalid(const Op& op);
  std::optional<std::string> finish();
};

std::optional<std::string> Executor::State::apply(const Op& op) {
  const int device = op.device % kDevices;
  switch (op.kind) {
    case OpKind::kAlloc:
      if (op.size == 0) return std::nullopt;
      return do_alloc(op, op.size, false);
    case OpKind::kFree:
      if (live.empty()) return std::nullopt;
      return free_block(op.pick % live.size());
    case OpKind::kRecordStream:
    case OpKind::kFreeOtherStream: {
      if (live.empty()) return std::nullopt;
      const std::size_t index = op.pick % live.size();
      Live& b = live[index];
      const StreamHandle other = stream_of(b.device, op.stream);
      if (absl::Status s = alloc().record_stream(b.ptr, other); !s.ok())
        return fail("record_stream: " + s.ToString());
      if (other != b.stream && std::find(b.used_on.begin(), b.used_on.end(), other) == b.used_on.end())
        b.used_on.push_back(other);
      if (op.kind == OpKind::kRecordStream) return std::nullopt;
      if (!is_capturing(other))
        if (auto e = tick(other)) return e;
      return free_block(index);
    }
    case OpKind::kTick: {
      const StreamHandle s = stream_of(device, op.stream);
      if (is_capturing(s)) return std::nullopt;
      return tick(s);
    }
    case OpKind::kDestroyStream: {
      const int slot = 1 + op.stream % 2;
      const StreamHandle s = streams[device][slot];
      if (!stream_unused(s)) return std::nullopt;
      if (auto e = tick(s)) return e;  // work pending when it is destroyed
      if (absl::Status st = rt().destroy_stream(s); !st.ok())
        return fail("destroy_stream: " + st.ToString());
      dead_streams[device] = s;
      auto fresh = rt().create_stream(device);
      if (!fresh.ok()) return fail("create_stream: " + fresh.status().ToString());
      streams[device][slot] = *fresh;
      return std::nullopt;
    }
    case OpKind::kBeginCapture: {
      if (capture.active) return std::nullopt;
      const int slot = 1 + op.stream % 2;
      const StreamHandle s = streams[device][slot];
      if (op.variant % 16 == 1 && !threaded()) {
        // A fresh shared pool, as a new model gets one: the old one goes once
        // its graphs and blocks are gone. (A pool someone holds keeps its
        // cached segments, as PyTorch's do: empty_cache leaves them.)
        auto fresh = alloc().create_graph_pool(device);
        if (!fresh.ok()) return fail("create_graph_pool: " + fresh.status().ToString());
        if (absl::Status st = alloc().release_graph_pool(world->shared_pools[device]); !st.ok())
          return fail("release_graph_pool: " + st.ToString());
        if (released_pools.size() < 8) released_pools.push_back(world->shared_pools[device]);
        world->shared_pools[device] = *fresh;
      }
      CaptureOptions capture_options;
      capture_options.pool = op.variant % 2 ? world->shared_pools[device] : kDefaultPool;
      capture_options.mode = threaded() ? CaptureMode::kThreadLocal : CaptureMode::kGlobal;
      auto id = world->tracker->begin_capture(device, s, capture_options);
      if (!id.ok()) return fail("begin_capture: " + id.status().ToString());
      capture = {true, device, slot, s};
      return std::nullopt;
    }
    case OpKind::kCaptureWrite: {
      if (!capture.active || live.empty()) return std::nullopt;
      // The first block allocated in this capture from the pick onwards.
      for (std::size_t i = 0; i < live.size(); ++i) {
        const Live& b = live[(op.pick + i) % live.size()];
        if (!b.in_capture || b.stream != capture.stream) continue;
        if (absl::Status s = rt().memset_async(b.ptr, 0xA5, b.requested, capture.stream); !s.ok())
          return fail("memset_async in a capture: " + s.ToString());
        break;
      }
      return std::nullopt;
    }
    case OpKind::kEndCapture: {
      if (!capture.active) return std::nullopt;
      auto done = world->tracker->end_capture(capture.stream);
      capture.active = false;
      for (Live& b : live) b.in_capture = false;  // keeps no cookie: its graph writes it
      if (!done.ok()) return fail("end_capture: " + done.status().ToString());
      graphs.push_back(done->graph);
      ++counters.graphs;
      return std::nullopt;
    }
    case OpKind::kReplay: {
      if (capture.active || graphs.empty()) return std::nullopt;
      const GraphHandle g = graphs[op.pick % graphs.size()];
      const StreamHandle s = stream_of(device, op.stream);
      if (absl::Status st = world->tracker->replay(g, s); !st.ok())
        return fail("replay: " + st.ToString());
      if (absl::Status st = rt().synchronize_stream(s); !st.ok())
        return fail("synchronize_stream after a replay: " + st.ToString());
      ++counters.replays;
      return std::nullopt;
    }
    case OpKind::kDestroyGraph: {
      if (graphs.empty()) return std::nullopt;
      const std::size_t index = op.pick % graphs.size();
      if (absl::Status st = world->tracker->destroy_graph(graphs[index]); !st.ok())
        return fail("destroy_graph: " + st.ToString());
      graphs.erase(graphs.begin() + static_cast<std::ptrdiff_t>(index));
      return std::nullopt;
    }
    case OpKind::kPreallocate: {
      const int key = op.variant % kKeys;
      const std::string name = key_name(key);
      auto it = persistent.find({device, key});
      // The allocator refuses persistent requests while a capture is active
      // on the device (the default guard scope; threaded runs use `stream`).
      // A key that already holds enough bytes allocates nothing: no refusal.
      const bool refused =
          capture.active && capture.device == device && !threaded() && it == persistent.end();
      if (refused || (it != persistent.end() && it->second.requested < op.size)) {
        return expect_error("preallocate during a capture or growing a key", [&] {
          return world->cache->preallocate(device, name, op.size).status();
        });
      }
      auto p = world->cache->preallocate(device, name, op.size);
      if (it != persistent.end()) {
        if (!p.ok() || *p != it->second.ptr)
          return fail("preallocate of an existing key did not return its buffer");
        return std::nullopt;
      }
      if (!p.ok()) {
        if (p.status().code() != absl::StatusCode::kResourceExhausted)
          return fail("preallocate: " + p.status().ToString());
        ++ooms[device];
        ++counters.ooms;
        return std::nullopt;
      }
      ++allocations[device];
      Live b;
      b.ptr = *p;
      b.requested = op.size;
      b.device = device;
      b.cookie = mix(world->next_cookie());
      if (auto e = admit(b)) return e;
      persistent.emplace(std::make_pair(device, key), std::move(b));
      return std::nullopt;
    }
    case OpKind::kGetPersistent: {
      const int key = op.variant % kKeys;
      auto it = persistent.find({device, key});
      if (it == persistent.end()) {
        return expect_error("get of a key never preallocated", [&] {
          return world->cache->get(device, key_name(key)).status();
        });
      }
      auto p = world->cache->get(device, key_name(key));
      if (!p.ok() || *p != it->second.ptr) return fail("get did not return the preallocated buffer");
      return std::nullopt;
    }
    case OpKind::kReleasePersistent: {
      const int key = op.variant % kKeys;
      auto it = persistent.find({device, key});
      if (it == persistent.end()) {
        return expect_error("release of a key never preallocated", [&] {
          return world->cache->release(device, key_name(key));
        });
      }
      forget(it->second);
      if (absl::Status s = world->cache->release(device, key_name(key)); !s.ok())
        return fail("release: " + s.ToString());
      ++frees[device];
      persistent.erase(it);
      return std::nullopt;
    }
    case OpKind::kEmptyCache: {
      const int which = op.variant % 3 == 2 ? Allocator::kAnyDevice : device;
      if (absl::Status s = alloc().empty_cache(which); !s.ok())
        return fail("empty_cache: " + s.ToString());
      return std::nullopt;
    }
    case OpKind::kOom: {
      // More than the limit leaves beside the bytes already allocated.
      const std::int64_t allocated = alloc().stats(device)->allocated_bytes.current;
      std::size_t bytes = options.memory_limit_per_device + (std::size_t{1} << 20);
      if (!threaded()) bytes -= static_cast<std::size_t>(allocated);
      return do_alloc(op, bytes, true);
    }
    case OpKind::kInvalid:
      return apply_invalid(op);
    case OpKind::kCount: break;
  }
  return std::nullopt;
}

std::optional<std::string> Executor::State::apply_invalid(const Op& op) {
  const int device = op.device % kDevices;
  static int not_a_block = 0;
  switch (op.variant % 21) {
    case 0:
      return expect_error("deallocate of a pointer never returned",
                          [&] { return alloc().deallocate(&not_a_block); });
    case 1:
      if (!live.empty()) {
        const Live& b = live[op.pick % live.size()];
        return expect_error("deallocate of an interior pointer", [&] {
          return alloc().deallocate(static_cast<char*>(b.ptr) + 16);
        });
      }
      [[fallthrough]];
    case 2:
      if (!live.empty()) {
        const Live& b = live[op.pick % live.size()];
        return expect_error("deallocate on the wrong device", [&] {
          return alloc().deallocate(b.ptr, 1 - b.device);
        });
      }
      [[fallthrough]];
    case 3:
      // A double free, unless the address is live again (then it is no double
      // free). Not with threads: another thread may have just been given the
      // address and not yet claimed it.
      if (!freed.empty() && !threaded()) {
        void* p = freed[op.pick % freed.size()];
        if (!world->is_claimed(p))
          return expect_error("double free", [&] { return alloc().deallocate(p); });
      }
      [[fallthrough]];
    case 4:
      return expect_error("allocate(0)",
                          [&] { return alloc().allocate(0, device).status(); });
    case 5:
      return expect_error("allocate on a device that does not exist",
                          [&] { return alloc().allocate(64, kDevices + 1).status(); });
    case 6:
      return expect_error("allocate of a size that overflows rounding", [&] {
        return alloc().allocate(std::numeric_limits<std::size_t>::max() - 10, device).status();
      });
    case 7:
      return expect_error("record_stream of a pointer never returned", [&] {
        return alloc().record_stream(&not_a_block, stream_of(device, 1));
      });
    case 8:
      return expect_error("empty_cache of a device that does not exist",
                          [&] { return alloc().empty_cache(kDevices + 3); });
    case 9:
      if (!capture.active) {
        return expect_error("end_capture on a stream not capturing", [&] {
          return world->tracker->end_capture(stream_of(device, 1)).status();
        });
      }
      [[fallthrough]];
    case 10:
      return expect_error("replay of a graph that does not exist", [&] {
        return world->tracker->replay(GraphHandle{0xDEAD0000}, stream_of(device, 1));
      });
    case 11:
      return expect_error("destroy_graph of a graph that does not exist",
                          [&] { return world->tracker->destroy_graph(GraphHandle{0xDEAD0001}); });
    case 12:
      if (!capture.active) {
        return expect_error("begin_capture on the default stream", [&] {
          return world->tracker->begin_capture(device, kDefaultStream).status();
        });
      }
      [[fallthrough]];
    case 13:
      if (!capture.active) {
        return expect_error("begin_capture into a pool that does not exist", [&] {
          CaptureOptions capture_options;
          capture_options.pool = PoolHandle{0xBAD00000};
          return world->tracker->begin_capture(device, stream_of(device, 1), capture_options).status();
        });
      }
      [[fallthrough]];
    case 14:
      if (op.pick % 2 == 0) {
        return expect_error("preallocate with an empty key",
                            [&] { return world->cache->preallocate(device, "", 64).status(); });
      }
      return expect_error("preallocate of zero bytes", [&] {
        return world->cache->preallocate(device, key_name(0), 0).status();
      });
    case 15:
      if (!persistent.empty()) {
        auto it = std::next(persistent.begin(),
                            static_cast<std::ptrdiff_t>(op.pick % persistent.size()));
        return expect_error("a plain deallocate of a persistent buffer",
                            [&] { return alloc().deallocate(it->second.ptr); });
      }
      [[fallthrough]];
    case 16:
      return expect_error("allocate on a stream never created", [&] {
        return alloc().allocate(64, device, StreamHandle{0xBAD00000} + device).status();
      });
    case 17:
      if (dead_streams[device] != kDefaultStream) {
        return expect_error("allocate on a destroyed stream", [&] {
          return alloc().allocate(64, device, dead_streams[device]).status();
        });
      }
      [[fallthrough]];
    case 18:
      if (!live.empty()) {
        const Live& b = live[op.pick % live.size()];
        return expect_error("record_stream on a stream never created", [&] {
          return alloc().record_stream(b.ptr, StreamHandle{0xBAD00000} + b.device);
        });
      }
      [[fallthrough]];
    case 19:
      // A pool whose one handle was given up: releasing again is not ours to
      // do, whoever still holds the pool (a graph, a capture route).
      if (!released_pools.empty()) {
        return expect_error("release of a pool whose handle was already released", [&] {
          return alloc().release_graph_pool(released_pools[op.pick % released_pools.size()]);
        });
      }
      return expect_error("release of a pool that does not exist",
                          [&] { return alloc().release_graph_pool(PoolHandle{0xBAD10000}); });
    default:
      if (capture.active) {
        // A persistent block requested on the capturing stream itself: refused
        // under either guard scope.
        return expect_error("a persistent allocation in a capture", [&] {
          return alloc()
              .allocate(256, capture.device, capture.stream, {.lifetime = Lifetime::kPersistent})
              .status();
        });
      }
      return expect_error("get of a key never preallocated", [&] {
        return world->cache->get(device, "stress.never").status();
      });
  }
}

std::optional<std::string> Executor::State::finish() {
  if (capture.active) {
    if (auto e = apply(Op{.kind = OpKind::kEndCapture})) return e;
  }
  while (!live.empty())
    if (auto e = free_block(live.size() - 1)) return e;
  for (int d = 0; d < kDevices; ++d)
    for (int k = 0; k < kKeys; ++k)
      if (persistent.count({d, k}))
        if (auto e = apply(Op{.kind = OpKind::kReleasePersistent, .device = static_cast<std::uint8_t>(d),
                              .variant = static_cast<std::uint8_t>(k)}))
          return e;
  for (GraphHandle g : graphs)
    if (absl::Status s = world->tracker->destroy_graph(g); !s.ok())
      return fail("destroy_graph at the end: " + s.ToString());
  graphs.clear();
  for (int d = 0; d < kDevices; ++d)
    for (int slot = 0; slot < kSlots; ++slot)
      if (absl::Status s = rt().synchronize_stream(streams[d][slot]); !s.ok())
        return fail("synchronize_stream at the end: " + s.ToString());
  if (auto e = check_all()) return e;
  return std::nullopt;
}

Executor::Executor(ExecOptions options)
    : Executor(World::create(options.memory_limit_per_device, false), 0, options) {}

Executor::Executor(std::shared_ptr<World> world, int thread, ExecOptions options)
    : state_(std::make_unique<State>()) {
  state_->world = std::move(world);
  state_->thread = thread;
  state_->options = std::move(options);
  if (state_->world->threaded) state_->world->executors.push_back(state_.get());
  for (int d = 0; d < kDevices; ++d) {
    state_->streams[d][0] = kDefaultStream;
    for (int slot = 1; slot < kSlots; ++slot)
      state_->streams[d][slot] = state_->world->runtime->create_stream(d).value();
  }
}

Executor::~Executor() {
  if (!state_) return;
  // Leave nothing behind for the world's teardown; errors were reported by finish().
  if (state_->capture.active) state_->world->tracker->end_capture(state_->capture.stream).IgnoreError();
  for (const Live& b : state_->live) state_->alloc().deallocate(b.ptr).IgnoreError();
  for (GraphHandle g : state_->graphs) state_->world->tracker->destroy_graph(g).IgnoreError();
  for (int d = 0; d < kDevices; ++d)
    for (int slot = 1; slot < kSlots; ++slot)
      state_->rt().destroy_stream(state_->streams[d][slot]).IgnoreError();
}

std::optional<std::string> Executor::apply(const Op& op) {
  State& s = *state_;
  ++s.counters.ops;
  ++s.counters.per_kind[static_cast<std::size_t>(op.kind)];
  if (s.options.inject_failure) {
    if (auto injected = s.options.inject_failure(op, s.live.size() + s.persistent.size()))
      return s.fail("injected: " + *injected);
  }
  std::optional<std::string> failure;
  {
    std::shared_lock lock(s.world->ops_mu);
    failure = s.apply(op);
    if (!failure) failure = s.check_all();
  }
  if (!failure && s.threaded() && s.counters.ops % 512 == 0) failure = s.world->check_global();
  ++s.op_index;
  return failure;
}

std::optional<std::string> Executor::finish() {
  std::shared_lock lock(state_->world->ops_mu);
  return state_->finish();
}
const Counters& Executor::counters() const { return state_->counters; }

// --- World: the check with every executor between operations ----------------

std::optional<std::string> World::check_global() {
  // Every executor is between operations: the sums over their models must
  // equal the stats.
  std::unique_lock lock(ops_mu);
  for (int d = 0; d < kDevices; ++d) {
    std::int64_t bytes = 0, requested = 0, blocks = 0;
    std::uint64_t allocations = 0, frees = 0, ooms = 0;
    for (Executor::State* s : executors) {
      s->model_sums(d, bytes, requested, blocks);
      allocations += s->allocations[d];
      frees += s->frees[d];
      ooms += s->ooms[d];
    }
    const auto stats = allocator->stats(d);
    if (!stats.ok()) return "stats: " + stats.status().ToString();
    if (stats->allocated_bytes.current != bytes || stats->requested_bytes.current != requested ||
        stats->allocated_blocks.current != blocks || stats->allocations != allocations ||
        stats->frees != frees || stats->ooms != ooms) {
      return absl::StrFormat(
          "device %d stats with every thread between operations: allocated %d B requested %d B "
          "in %d blocks, %d allocations %d frees %d ooms; the models' sums: %d B, %d B, %d "
          "blocks, %d, %d, %d",
          d, stats->allocated_bytes.current, stats->requested_bytes.current,
          stats->allocated_blocks.current, stats->allocations, stats->frees, stats->ooms, bytes,
          requested, blocks, allocations, frees, ooms);
    }
  }
  if (absl::Status s = allocator->CheckInvariants(); !s.ok()) return "CheckInvariants: " + s.ToString();
  return std::nullopt;
}

}  // namespace capalloc::stress
