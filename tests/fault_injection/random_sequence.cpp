// tests/fault_injection/random_sequence.cpp: the fault injection test's
// random scenario (tests/fault_injection_test.cpp): a seeded sequence of
// the stress generator's operations, tolerating errors.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "capalloc/allocator.hpp"
#include "capalloc/capture.hpp"
#include "capalloc/persistent_cache.hpp"
#include "capalloc/runtime.hpp"
#include "fault_injection/harness.hpp"
#include "tools/stress/stress_driver.hpp"

namespace capalloc::fault_test {
namespace {

// A seeded random sequence: the operations of `capalloc stress`'s generator
// (tools/stress), applied to an allocator, tracker and persistent cache on 2
// devices with 2 created streams each, tolerating errors: an operation
// whose call fails leaves the model as the call's contract says (a failed
// free leaves the block allocated, a failed destroy the stream alive, a
// failed capture end no graph), and the program goes on. The generator's
// out-of-memory and invalid-call operations are the stress driver's
// business and are skipped.
class RandomSequence {
 public:
  RandomSequence(Harness& h, std::uint64_t seed, std::size_t ops) : h_(h), seed_(seed), ops_(ops) {}

  absl::Status run() {
    auto created = Allocator::create(h_.rt);
    if (!created.ok()) return created.status();
    alloc_ = *std::move(created);
    h_.at(WorldPoint::kCreated, *alloc_);
    tracker_ = CaptureTracker::create(*alloc_).value();
    cache_ = std::make_unique<PersistentCache>(*alloc_);
    for (int d = 0; d < kDevices; ++d) shared_[d] = alloc_->create_graph_pool(d).value();
    for (int d = 0; d < kDevices; ++d) {
      for (int slot = 1; slot < kSlots; ++slot) {
        step("create the streams", [&] { return make_stream(d, slot); });
      }
    }
    capalloc::stress::Generator generator(seed_);
    for (std::size_t i = 0; i < ops_; ++i) {
      const capalloc::stress::Op op = generator.next();
      using capalloc::stress::OpKind;
      step(absl::StrCat("op ", i, " (", capalloc::stress::describe(op), ")"),
           [&] { return apply(op); },
           op.kind == OpKind::kFree || op.kind == OpKind::kFreeOtherStream);
    }
    h_.at(WorldPoint::kWorkDone, *alloc_);
    teardown();
    h_.at(WorldPoint::kReleased, *alloc_);
    alloc_.reset();
    return first_error_;
  }

 private:
  static constexpr int kSlots = 3;  // the default stream and two created ones
  static constexpr int kKeys = 4;
  struct Block {
    void* ptr = nullptr;
    int device = 0;
    StreamHandle stream = kDefaultStream;
    std::size_t bytes = 0;
    bool in_capture = false;
    std::vector<StreamHandle> used_on;
  };

  // Runs one operation. A fault injected during it must show in its result
  // (or be one absorbed() allows); an error with no fault injected during
  // it is a consequence of an earlier failure that capalloc let change its
  // state, and a problem.
  template <typename F>
  void step(const std::string& what, F&& body, bool frees = false) {
    const std::size_t before = h_.rt->injected().size();
    const absl::Status s = body();
    if (!s.ok() && first_error_.ok()) first_error_ = s;
    const std::vector<InjectedFault> injected = h_.rt->injected();
    if (injected.size() > before) {
      // Right after the failure.
      h_.check(*alloc_, absl::StrCat("after ", what, " met ", injected.back().call));
      if (s.ok()) {
        for (std::size_t i = before; i < injected.size(); ++i) {
          h_.absorbed_in_ops.push_back({what, frees, injected[i]});
        }
      } else if (!absl::StrContains(s.message(), "injected fault")) {
        h_.problem(absl::StrCat(what, ": the fault (", injected.back().call,
                                ") came back as an error that does not carry it: ",
                                s.ToString()));
      }
    } else if (!s.ok()) {
      h_.problem(absl::StrCat(what, " failed with no fault injected during it: ", s.ToString()));
    }
  }

  absl::Status make_stream(int device, int slot) {
    auto s = h_.rt->create_stream(device);
    if (!s.ok()) return s.status();
    streams_[device][slot] = *s;
    return absl::OkStatus();
  }
  // 0 when the slot's stream could not be made (slot 0 is the default stream).
  StreamHandle stream_of(int device, int slot, bool* missing) const {
    const StreamHandle s = streams_[device][slot % kSlots];
    *missing = slot % kSlots != 0 && s == 0;
    return s;
  }
  bool capturing(StreamHandle s) const { return capture_.active && capture_.stream == s; }
  bool in_use(StreamHandle s) const {
    for (const Block& b : live_) {
      if (b.stream == s || std::find(b.used_on.begin(), b.used_on.end(), s) != b.used_on.end()) {
        return true;
      }
    }
    return capturing(s);
  }
  absl::Status tick(StreamHandle s) {
    KernelLaunch k;
    k.name = "faults.tick";
    k.host_body = [] {};
    return h_.rt->launch_kernel(s, std::move(k));
  }
  absl::Status free_at(std::size_t index) {
    const Block b = live_[index];
    const AllocatorStats before = alloc_->stats(b.device).value();
    if (absl::Status s = alloc_->deallocate(b.ptr); !s.ok()) {
      // "A call that fails changes no state": the block is still allocated.
      unchanged(before, b.device, "deallocate");
      auto info = alloc_->block_info(b.ptr);
      if (!info.ok() || info->state != capalloc::BlockState::kAllocated || info->ptr != b.ptr) {
        h_.problem(absl::StrFormat("a failed deallocate(%p) did not leave the block allocated",
                                   b.ptr));
      }
      return s;
    }
    live_.erase(live_.begin() + static_cast<std::ptrdiff_t>(index));
    return absl::OkStatus();
  }
  std::string key_name(int key) const { return absl::StrFormat("faults.k%d", key); }
  // A failed allocate or deallocate left the device's blocks and counters
  // as they were (an out-of-memory failure counts itself: stats.ooms).
  void unchanged(const AllocatorStats& before, int device, const char* call) {
    const AllocatorStats after = alloc_->stats(device).value();
    if (after.allocated_bytes.current != before.allocated_bytes.current ||
        after.requested_bytes.current != before.requested_bytes.current ||
        after.allocated_blocks.current != before.allocated_blocks.current ||
        after.allocations != before.allocations || after.frees != before.frees ||
        // (allocate completes earlier pending frees before it fails)
        (std::string_view(call) == "deallocate" &&
         after.pending_free_blocks != before.pending_free_blocks)) {
      h_.problem(absl::StrFormat(
          "a failed %s changed device %d's blocks: allocated %d -> %d B in %d -> %d blocks, "
          "%d -> %d allocations, %d -> %d frees, %d -> %d pending frees",
          call, device, before.allocated_bytes.current, after.allocated_bytes.current,
          before.allocated_blocks.current, after.allocated_blocks.current, before.allocations,
          after.allocations, before.frees, after.frees, before.pending_free_blocks,
          after.pending_free_blocks));
    }
  }

  absl::Status apply(const capalloc::stress::Op& op) {
    using capalloc::stress::OpKind;
    const int device = op.device % kDevices;
    bool missing = false;
    switch (op.kind) {
      case OpKind::kAlloc: {
        const StreamHandle s = stream_of(device, op.stream, &missing);
        if (missing || op.size == 0) return absl::OkStatus();
        const AllocatorStats before = alloc_->stats(device).value();
        auto p = alloc_->allocate(op.size, device, s, {.tag = "faults"});
        if (!p.ok()) {
          unchanged(before, device, "allocate");
          return p.status();
        }
        live_.push_back(Block{*p, device, s, op.size, capturing(s), {}});
        return absl::OkStatus();
      }
      case OpKind::kFree:
        if (live_.empty()) return absl::OkStatus();
        return free_at(op.pick % live_.size());
      case OpKind::kRecordStream:
      case OpKind::kFreeOtherStream: {
        if (live_.empty()) return absl::OkStatus();
        const std::size_t index = op.pick % live_.size();
        Block& b = live_[index];
        const StreamHandle other = stream_of(b.device, op.stream, &missing);
        if (missing) return absl::OkStatus();
        if (absl::Status s = alloc_->record_stream(b.ptr, other); !s.ok()) return s;
        if (other != b.stream &&
            std::find(b.used_on.begin(), b.used_on.end(), other) == b.used_on.end()) {
          b.used_on.push_back(other);
        }
        if (op.kind == OpKind::kRecordStream) return absl::OkStatus();
        if (!capturing(other)) {
          if (absl::Status s = tick(other); !s.ok()) return s;
        }
        return free_at(index);
      }
      case OpKind::kTick: {
        const StreamHandle s = stream_of(device, op.stream, &missing);
        if (missing || capturing(s)) return absl::OkStatus();
        return tick(s);
      }
      case OpKind::kDestroyStream: {
        const int slot = 1 + op.stream % 2;
        const StreamHandle s = streams_[device][slot];
        if (s == 0) return make_stream(device, slot);  // its creation failed before
        if (in_use(s)) return absl::OkStatus();
        if (absl::Status st = tick(s); !st.ok()) return st;  // work pending when destroyed
        if (absl::Status st = h_.rt->destroy_stream(s); !st.ok()) return st;
        streams_[device][slot] = 0;
        return make_stream(device, slot);
      }
      case OpKind::kBeginCapture: {
        if (capture_.active) return absl::OkStatus();
        const int slot = 1 + op.stream % 2;
        const StreamHandle s = streams_[device][slot];
        if (s == 0) return absl::OkStatus();
        if (op.variant % 16 == 1) {
          auto fresh = alloc_->create_graph_pool(device);
          if (!fresh.ok()) return fresh.status();
          if (absl::Status st = alloc_->release_graph_pool(shared_[device]); !st.ok()) return st;
          shared_[device] = *fresh;
        }
        CaptureOptions options;
        options.pool = op.variant % 2 ? shared_[device] : kDefaultPool;
        auto id = tracker_->begin_capture(device, s, options);
        if (!id.ok()) return id.status();
        capture_ = {true, device, s};
        return absl::OkStatus();
      }
      case OpKind::kCaptureWrite: {
        if (!capture_.active) return absl::OkStatus();
        for (std::size_t i = 0; i < live_.size(); ++i) {
          const Block& b = live_[(op.pick + i) % live_.size()];
          if (!b.in_capture || b.stream != capture_.stream) continue;
          // The first 64 KiB: what is written matters not, and whole blocks
          // (up to 64 MiB, at each replay) would dominate the run time.
          return h_.rt->memset_async(b.ptr, 0xA5, std::min<std::size_t>(b.bytes, 64 << 10),
                                     capture_.stream);
        }
        return absl::OkStatus();
      }
      case OpKind::kEndCapture: {
        if (!capture_.active) return absl::OkStatus();
        auto done = tracker_->end_capture(capture_.stream);
        capture_.active = false;
        for (Block& b : live_) b.in_capture = false;
        if (!done.ok()) return done.status();
        graphs_.push_back(done->graph);
        return absl::OkStatus();
      }
      case OpKind::kReplay: {
        if (capture_.active || graphs_.empty()) return absl::OkStatus();
        const StreamHandle s = stream_of(device, op.stream, &missing);
        if (missing) return absl::OkStatus();
        const GraphHandle g = graphs_[op.pick % graphs_.size()];
        if (absl::Status st = tracker_->replay(g, s); !st.ok()) return st;
        return h_.rt->synchronize_stream(s);
      }
      case OpKind::kDestroyGraph: {
        if (graphs_.empty()) return absl::OkStatus();
        const std::size_t index = op.pick % graphs_.size();
        if (absl::Status st = tracker_->destroy_graph(graphs_[index]); !st.ok()) return st;
        graphs_.erase(graphs_.begin() + static_cast<std::ptrdiff_t>(index));
        return absl::OkStatus();
      }
      case OpKind::kPreallocate: {
        const int key = op.variant % kKeys;
        // A key that exists, or a request during a capture on the device, is
        // refused by design (the stress driver checks those).
        if (persistent_.contains({device, key}) || (capture_.active && capture_.device == device)) {
          return absl::OkStatus();
        }
        auto p = cache_->preallocate(device, key_name(key), op.size);
        if (!p.ok()) return p.status();
        persistent_[{device, key}] = *p;
        return absl::OkStatus();
      }
      case OpKind::kGetPersistent: {
        const int key = op.variant % kKeys;
        if (!persistent_.contains({device, key})) return absl::OkStatus();
        auto p = cache_->get(device, key_name(key));
        if (!p.ok()) return p.status();
        if (*p != persistent_[{device, key}]) h_.problem("get returned another buffer");
        return absl::OkStatus();
      }
      case OpKind::kReleasePersistent: {
        const int key = op.variant % kKeys;
        if (!persistent_.contains({device, key})) return absl::OkStatus();
        if (absl::Status s = cache_->release(device, key_name(key)); !s.ok()) return s;
        persistent_.erase({device, key});
        return absl::OkStatus();
      }
      case OpKind::kEmptyCache:
        return alloc_->empty_cache(op.variant % 3 == 2 ? Allocator::kAnyDevice : device);
      case OpKind::kOom:
      case OpKind::kInvalid:
      case OpKind::kCount:
        break;
    }
    return absl::OkStatus();
  }

  // Best effort, as the scenarios' worlds tear down: what a failed call
  // leaves is released by a later owner or stays held.
  void teardown() {
    if (capture_.active) {
      if (auto done = tracker_->end_capture(capture_.stream); done.ok()) {
        graphs_.push_back(done->graph);
      }
    }
    for (int d = 0; d < kDevices; ++d) {
      for (int slot = 0; slot < kSlots; ++slot) {
        if (slot == 0 || streams_[d][slot] != 0) {
          h_.rt->synchronize_stream(streams_[d][slot]).IgnoreError();
        }
      }
    }
    for (GraphHandle g : graphs_) tracker_->destroy_graph(g).IgnoreError();
    for (const Block& b : live_) alloc_->deallocate(b.ptr).IgnoreError();
    for (const auto& [key, ptr] : persistent_) {
      cache_->release(key.first, key_name(key.second)).IgnoreError();
    }
    cache_.reset();
    tracker_.reset();
    for (PoolHandle p : shared_) alloc_->release_graph_pool(p).IgnoreError();
    for (int d = 0; d < kDevices; ++d) {
      for (int slot = 1; slot < kSlots; ++slot) {
        if (streams_[d][slot] != 0) h_.rt->destroy_stream(streams_[d][slot]).IgnoreError();
      }
    }
  }

  Harness& h_;
  const std::uint64_t seed_;
  const std::size_t ops_;
  absl::Status first_error_;
  std::unique_ptr<Allocator> alloc_;
  std::unique_ptr<CaptureTracker> tracker_;
  std::unique_ptr<PersistentCache> cache_;
  PoolHandle shared_[kDevices] = {};
  StreamHandle streams_[kDevices][kSlots] = {};
  std::vector<Block> live_;
  std::vector<GraphHandle> graphs_;
  std::map<std::pair<int, int>, void*> persistent_;
  struct {
    bool active = false;
    int device = 0;
    StreamHandle stream = kDefaultStream;
  } capture_;
};

}  // namespace

// FAULT_SWEEP_SEED and FAULT_SWEEP_OPS choose another sequence.
std::uint64_t env_or(const char* name, std::uint64_t fallback) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? std::strtoull(v, nullptr, 10) : fallback;
}
const std::uint64_t kRandomSeed = env_or("FAULT_SWEEP_SEED", 11);
const std::size_t kRandomOps = env_or("FAULT_SWEEP_OPS", 1000);

absl::Status random_scenario(Harness& h) {
  return RandomSequence(h, kRandomSeed, kRandomOps).run();
}

}  // namespace capalloc::fault_test
