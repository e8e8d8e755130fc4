// Fault injection (issue 11, reliability): the runtime calls capalloc and
// its scenarios make fail, one at a time, and capalloc must report each
// failure to its caller, keep its invariants, and leak nothing.
//
// Each scenario (seed 003's four arms and the fix; the GEMM scenario's two
// arms, swept apart; a seeded random sequence of allocator, tracker and
// persistent-cache calls) runs over runtime/fault_injecting_runtime.hpp on a
// fresh host runtime: first once without faults, to count its runtime calls
// per category; then once per fault point, a plan that fails the Nth call of
// one category (every N up to a cap, sampled evenly beyond it; reserve three
// ways: out of memory, out of memory on the allocator's retry too, and an
// error it does not retry). Each run checks:
//   - the failure reached the caller: the scenario (for the random sequence,
//     the operation during which it fired) returned an error carrying the
//     injected fault's message; or the call is one capalloc documents as
//     best effort, and what it documents happened instead (absorbed());
//     or the fault fired in a teardown, where no caller is left to tell;
//   - Allocator::CheckInvariants() holds, and the allocator's reserved bytes
//     and segments equal what the runtime holds for it, right after the
//     failure (the random sequence: after the operation; the scenarios: when
//     the arm returned its error) and after teardown. In the random
//     sequence a failed allocate or deallocate changed no block or counter,
//     and a block whose free failed is still allocated;
//   - after teardown nothing is held: segments reserved equal segments
//     released, events and streams created were destroyed, graphs made were
//     destroyed. The one exception is the resource of a failed release or
//     destroy in the teardown itself, when nobody is left to retry it (a
//     failed cudaFree frees nothing): it must be exactly that resource.
// The count of fault points swept is printed (WARN) per scenario; see
// docs/fault-injection.md for the counts and the outcomes.
//
// Environment, for longer sweeps: FAULT_SWEEP_CAP=<n> points per
// category (0: every call), FAULT_SWEEP_COUNT=<k> calls failed in a row
// (a sticky error), FAULT_SWEEP_SEED and FAULT_SWEEP_OPS for the
// random sequence, FAULT_SWEEP_VERBOSE=1 for one line per point.
#include <catch2/catch.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <future>
#include <mutex>
#include <thread>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "capalloc/allocator.hpp"
#include "capalloc/capture.hpp"
#include "capalloc/gemm.hpp"
#include "capalloc/persistent_cache.hpp"
#include "capalloc/runtime.hpp"
#include "runtime/fault_injecting_runtime.hpp"
#include "tools/scenarios/seed003_arms.hpp"
#include "tools/scenarios/seed003_gemm.hpp"
#include "tools/stress/stress_driver.hpp"

namespace {

using capalloc::Allocator;
using capalloc::AllocatorStats;
using capalloc::CaptureOptions;
using capalloc::CaptureTracker;
using capalloc::DeviceRuntime;
using capalloc::GraphHandle;
using capalloc::KernelLaunch;
using capalloc::PersistentCache;
using capalloc::PoolHandle;
using capalloc::StreamHandle;
using capalloc::detail::FaultCategory;
using capalloc::detail::FaultInjectingRuntime;
using capalloc::detail::FaultPlan;
using capalloc::detail::HeldKind;
using capalloc::detail::InjectedFault;
using capalloc::detail::Outstanding;
using capalloc::scenarios::WorldPoint;
using capalloc::kDefaultStream;
using capalloc::kDefaultPool;

constexpr int kDevices = 2;  // the random sequence uses both

// Phases of a run, recorded with each injected fault.
constexpr const char* kRun = "run";
constexpr const char* kTeardown = "teardown";
constexpr const char* kDestruction = "allocator destruction";
constexpr const char* kDone = "done";

// One run of a scenario over a fresh fault-injecting runtime, and what its
// checks found.
class Harness {
 public:
  explicit Harness(FaultPlan plan) {
    capalloc::HostRuntimeOptions options;
    options.device_count = kDevices;
    options.memory_limit_per_device = std::size_t{8} << 30;  // mapped lazily
    rt = std::make_shared<FaultInjectingRuntime>(capalloc::make_host_runtime(options).value(),
                                                 std::move(plan));
    rt->set_phase(kRun);
  }

  std::shared_ptr<FaultInjectingRuntime> rt;
  std::vector<std::string> problems;    // violated checks
  std::vector<std::string> mismatches;  // scenario results unlike the seed's expectations
  std::uint64_t retries = 0;            // the allocators' out-of-memory retries, summed
  // Faults the random sequence saw absorbed by an operation that succeeded.
  struct Absorbed {
    std::string what;  // the operation
    bool frees = false;  // a free (deallocate), which must report its event's failure
    InjectedFault fault;
  };
  std::vector<Absorbed> absorbed_in_ops;

  void problem(std::string what) { problems.push_back(std::move(what)); }

  // Invariants, and the allocator's reservations against the runtime's.
  void check(const Allocator& a, std::string_view when) {
    if (absl::Status s = a.CheckInvariants(); !s.ok()) {
      problem(absl::StrCat("CheckInvariants ", std::string(when), ": ", s.ToString()));
    }
    const Outstanding now = rt->outstanding();
    for (int d = 0; d < a.runtime().device_count(); ++d) {
      const AllocatorStats stats = a.stats(d).value();
      const auto bytes = static_cast<std::int64_t>(now.bytes[d] - baseline_.bytes[d]);
      const auto segments = static_cast<std::int64_t>(now.segments[d] - baseline_.segments[d]);
      if (bytes != stats.reserved_bytes.current || segments != stats.segments.current) {
        problem(absl::StrFormat(
            "%s, device %d: the allocator counts %d B in %d segment(s) reserved, the runtime "
            "holds %d B in %d segment(s) for it (%s)",
            when, d, stats.reserved_bytes.current, stats.segments.current, bytes, segments,
            rt->describe_outstanding()));
      }
    }
  }

  capalloc::scenarios::WorldObserver observer() {
    return [this](WorldPoint point, const Allocator& a) { at(point, a); };
  }

  // The scenarios' worlds call this at their three points.
  void at(WorldPoint point, const Allocator& a) {
    switch (point) {
      case WorldPoint::kCreated:
        baseline_ = rt->outstanding();
        rt->set_phase(kRun);
        return;
      case WorldPoint::kWorkDone:
        check(a, "when the work was over");
        rt->set_phase(kTeardown);
        return;
      case WorldPoint::kReleased:
        check(a, "after teardown");
        for (int d = 0; d < a.runtime().device_count(); ++d) retries += a.stats(d)->retries;
        rt->set_phase(kDestruction);
        return;
    }
  }

 private:
  Outstanding baseline_;
};

// --- The scenarios ---------------------------------------------------------------

// Seed 003's four arms, then the fix, each with its own allocator and
// tracker over the one runtime, stopping at the first error.
absl::Status arms_scenario(Harness& h) {
  capalloc::scenarios::ArmsOptions options;
  options.observer = h.observer();
  for (char arm : {'A', 'B', 'C', 'D'}) {
    auto r = capalloc::scenarios::run_arm(arm, h.rt, options);
    if (!r.ok()) return r.status();
    if (!r->expected_match) {
      h.mismatches.push_back(absl::StrCat("arm ", std::string(1, arm), ": ",
                                          absl::StrJoin(r->mismatches, "; ")));
    }
  }
  auto fix = capalloc::scenarios::run_fix(h.rt, options);
  if (!fix.ok()) return fix.status();
  if (!fix->expected_match) {
    h.mismatches.push_back(absl::StrCat("fix: ", absl::StrJoin(fix->mismatches, "; ")));
  }
  return absl::OkStatus();
}

// The GEMM scenario's two arms, swept apart: the status quo (stream-keyed
// buffers allocated in the capture) and capalloc's (SplitKGemm, persistent
// buffers preallocated during warmup).
absl::Status gemm_arm(Harness& h, bool status_quo) {
  capalloc::scenarios::GemmScenarioOptions options;
  options.observer = h.observer();
  auto r = capalloc::scenarios::run_gemm_arm(status_quo, h.rt, options);
  if (!r.ok()) return r.status();
  if (!r->expected_match) {
    h.mismatches.push_back(absl::StrCat(r->arm, ": ", absl::StrJoin(r->mismatches, "; ")));
  }
  return absl::OkStatus();
}
absl::Status gemm_status_quo(Harness& h) { return gemm_arm(h, true); }
absl::Status gemm_capalloc(Harness& h) { return gemm_arm(h, false); }

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

// --- The sweep ---------------------------------------------------------------------

using Scenario = absl::Status (*)(Harness&);

// Whether capalloc documents a failure of this call, in the run, as one it
// absorbs; the label of the documented behaviour, checked here, or nullopt.
// `op` is the random sequence's operation that absorbed it (null for the
// scenarios, which give no operation).
std::optional<std::string> absorbed(const InjectedFault& f, const Harness& h,
                                    const Harness::Absorbed* op) {
  // Allocator: "kResourceExhausted when the device is out of memory after
  // the cache was released and the request retried once".
  if (f.category == FaultCategory::kReserve &&
      f.status.code() == absl::StatusCode::kResourceExhausted) {
    if (h.retries == 0) return std::nullopt;
    return "reserve out of memory: retried after releasing the cache";
  }
  // Pending frees are polled, never waited for: a failed query is an event
  // not yet complete, polled again (allocator/pending_frees.cpp).
  if (f.method == "query_event") return "query_event: polled again";
  // A segment the runtime fails to release stays cached and is released
  // again later; the harness checked that the allocator still counts it and
  // that teardown released it.
  if (f.method == "release") return "release: segment kept, released again later";
  // A free deferred during a capture gets its events once the captures are
  // over, from whichever call polls next; if that fails the free stays
  // deferred and the next poll tries again (allocator/pending_frees.cpp).
  // Only the random sequence frees blocks used on other streams; a free's
  // own events are its error (deallocate reports it, the block left
  // allocated), and SplitKGemm's are its run()'s.
  if ((f.method == "record_event" || f.method == "create_event") && op != nullptr && !op->frees) {
    return "event of a deferred free: the free stays deferred, retried at the next poll";
  }
  return std::nullopt;
}

struct SweepTotals {
  std::map<std::string, int> points;      // by category
  std::map<std::string, int> outcomes;    // reached / absorbed: ... / teardown / not fired
  int runs = 0;
  int failures = 0;
};

// One run with `plan`; every check, with the fault's story on failure.
void run_point(const char* scenario_name, Scenario scenario, const FaultPlan& plan,
               SweepTotals& totals, std::uint64_t clean_count, bool deterministic) {
  const auto start = std::chrono::steady_clock::now();
  Harness h(plan);
  const absl::Status status = scenario(h);
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  h.rt->set_phase(kDone);
  const std::vector<InjectedFault> injected = h.rt->injected();
  ++totals.runs;
  std::vector<std::string> problems = h.problems;
  std::string outcome;

  // The first fault in a run decides (with a sticky plan, a teardown's
  // faults may be followed by the next world's); else the first at all.
  const InjectedFault* fault = injected.empty() ? nullptr : &injected.front();
  for (const InjectedFault& f : injected) {
    if (f.phase == kRun) {
      fault = &f;
      break;
    }
  }
  if (injected.size() > plan.count) problems.push_back("more faults injected than planned");
  if (fault == nullptr) {
    // The category made fewer calls this time: in the random sequence,
    // event polls depend on timing, and with them which cached blocks are
    // reusable, hence the reservations and releases.
    outcome = "not fired";
    if (plan.nth <= clean_count && deterministic) {
      problems.push_back(absl::StrFormat("call #%d of %d in the clean run was not made", plan.nth,
                                         clean_count));
    }
    if (!status.ok()) problems.push_back("failed with no fault: " + status.ToString());
  } else if (fault->phase == kRun) {
    if (!status.ok()) {
      outcome = "reached the caller";
      if (!absl::StrContains(status.message(), "injected fault")) {
        problems.push_back("the scenario's error does not carry the injected fault: " +
                           status.ToString());
      }
    } else if (scenario == random_scenario) {
      // Attributed per operation: the operations that absorbed a fault.
      for (const Harness::Absorbed& a : h.absorbed_in_ops) {
        if (auto label = absorbed(a.fault, h, &a)) {
          outcome = "absorbed: " + *label;
        } else {
          problems.push_back(absl::StrCat(a.what, " succeeded although ", a.fault.call,
                                          " failed: the failure did not reach the caller"));
        }
      }
      if (h.absorbed_in_ops.empty()) problems.push_back("fault injected outside any operation");
    } else if (auto label = absorbed(*fault, h, nullptr)) {
      outcome = "absorbed: " + *label;
    } else {
      problems.push_back("the scenario succeeded: the failure did not reach the caller");
    }
    if (status.ok() && !h.mismatches.empty()) {
      problems.push_back("an absorbed fault changed the results: " +
                         absl::StrJoin(h.mismatches, "; "));
    }
  } else {
    // In a teardown: no caller is left to tell; the scenario's result stands.
    outcome = "in teardown";
    if (!status.ok()) {
      problems.push_back("a teardown fault failed the scenario: " + status.ToString());
    }
    if (!h.mismatches.empty()) {
      problems.push_back("a teardown fault changed the results: " +
                         absl::StrJoin(h.mismatches, "; "));
    }
  }

  // Nothing held after teardown, but what failed releases in the teardown
  // itself left: each held resource must be one a release or destroy failed
  // on there, when nobody was left to retry it.
  std::vector<std::string> leaked;
  std::size_t left_by_teardown = 0;
  for (const auto& [kind, handle] : h.rt->held()) {
    const bool named = std::any_of(injected.begin(), injected.end(), [&](const InjectedFault& f) {
      return f.phase != kRun && f.held == kind && f.handle == handle;
    });
    if (named) {
      ++left_by_teardown;
    } else {
      leaked.push_back(absl::StrFormat("%d:%#x", static_cast<int>(kind), handle));
    }
  }
  if (!leaked.empty()) {
    problems.push_back(absl::StrCat("after teardown the runtime still holds ",
                                    h.rt->describe_outstanding(), " (",
                                    h.rt->outstanding().describe(), ")"));
  } else if (left_by_teardown > 0) {
    outcome += " (left held: what its failed release named)";
  }

  ++totals.outcomes[outcome];
  if (std::getenv("FAULT_SWEEP_VERBOSE") != nullptr) {
    std::printf("%s | %.0f ms | %s #%d x%d | %s | %s | %s\n", scenario_name, ms,
                plan.category ? std::string(fault_category_name(*plan.category)).c_str() : "any",
                static_cast<int>(plan.nth), static_cast<int>(plan.count),
                fault ? fault->call.c_str() : "-", fault ? fault->phase.c_str() : "-",
                outcome.c_str());
  }
  if (!problems.empty()) {
    ++totals.failures;
    const std::string story = absl::StrFormat(
        "%s, %s call #%d%s: %s\nscenario returned: %s\nproblems:\n  %s", scenario_name,
        plan.category ? std::string(fault_category_name(*plan.category)) : "any", plan.nth,
        absl::StrCat(plan.code ? absl::StrCat(" (code ", absl::StatusCodeToString(*plan.code), ")")
                               : "",
                     plan.count > 1 ? absl::StrCat(" and the ", plan.count - 1, " after it") : ""),
        fault ? absl::StrCat(fault->call, " in the ", fault->phase) : "not fired",
        status.ToString(), absl::StrJoin(problems, "\n  "));
    FAIL_CHECK(story);
  }
}

// The N to sweep for a category with `count` calls: all of them up to
// `cap`, else `cap` spread evenly, first and last included.
std::vector<std::uint64_t> sample(std::uint64_t count, std::uint64_t cap) {
  std::vector<std::uint64_t> ns;
  if (count <= cap) {
    for (std::uint64_t n = 1; n <= count; ++n) ns.push_back(n);
    return ns;
  }
  if (cap == 1) return {1};
  for (std::uint64_t i = 0; i < cap; ++i) ns.push_back(1 + i * (count - 1) / (cap - 1));
  ns.erase(std::unique(ns.begin(), ns.end()), ns.end());
  return ns;
}

// FAULT_SWEEP_CAP=<n> sweeps up to n points per category instead
// (0: every call); a variant of a category (reserve has three) counts apart.
void sweep(const char* name, Scenario scenario, std::uint64_t cap, bool deterministic) {
  if (const char* env = std::getenv("FAULT_SWEEP_CAP"); env != nullptr && *env != '\0') {
    cap = std::strtoull(env, nullptr, 10);
    if (cap == 0) cap = ~std::uint64_t{0};
  }
  // FAULT_SWEEP_COUNT=<k> fails k calls in a row from each point (a
  // sticky error) instead of one.
  const std::uint64_t sticky = std::max<std::uint64_t>(env_or("FAULT_SWEEP_COUNT", 1), 1);
  // The allocator logs the releases that fail (as it should): hundreds of
  // lines here, all expected.
  const std::string level = capalloc::log_level_from_env().value_or("warn");
  capalloc::set_log_level("off").IgnoreError();
  struct RestoreLevel {
    std::string level;
    ~RestoreLevel() { capalloc::set_log_level(level).IgnoreError(); }
  } restore{level};
  const auto start = std::chrono::steady_clock::now();
  // The clean run: no fault, every check, and the counts.
  Harness clean(FaultPlan{});
  const absl::Status status = scenario(clean);
  {
    INFO(name << " without faults: " << status.ToString() << "\n  "
              << absl::StrJoin(clean.problems, "\n  ") << absl::StrJoin(clean.mismatches, "\n  "));
    REQUIRE(status.ok());
    REQUIRE(clean.problems.empty());
    REQUIRE(clean.mismatches.empty());
    REQUIRE(clean.absorbed_in_ops.empty());
    REQUIRE(clean.rt->outstanding().none());
  }
  const auto counts = clean.rt->calls();

  SweepTotals totals;
  std::vector<std::string> per_category;
  for (FaultCategory c : capalloc::detail::kAllFaultCategories) {
    const std::uint64_t count = counts[static_cast<std::size_t>(c)];
    // Reserve three times: out of memory (which the allocator retries
    // once), out of memory on the retry too, and an error it does not retry.
    std::vector<FaultPlan> variants = {FaultPlan{.category = c, .count = sticky}};
    if (c == FaultCategory::kReserve) {
      variants.push_back(FaultPlan{.category = c, .count = std::max<std::uint64_t>(sticky, 2)});
      variants.push_back(
          FaultPlan{.category = c, .count = sticky, .code = absl::StatusCode::kInternal});
    }
    int points = 0;
    for (FaultPlan plan : variants) {
      for (std::uint64_t n : sample(count, cap)) {
        plan.nth = n;
        run_point(name, scenario, plan, totals, count, deterministic);
        ++points;
      }
    }
    totals.points[std::string(fault_category_name(c))] = points;
    per_category.push_back(
        absl::StrFormat("%s %d/%d", fault_category_name(c), points, count));
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::vector<std::string> outcomes;
  for (const auto& [outcome, n] : totals.outcomes) {
    outcomes.push_back(absl::StrCat(n, " ", outcome));
  }
  WARN(absl::StrFormat(
      "fault injection, %s: %d fault points swept in %.1f s (swept/calls per category: %s); "
      "outcomes: %s; %d failing",
      name, totals.runs, seconds, absl::StrJoin(per_category, ", "),
      absl::StrJoin(outcomes, ", "), totals.failures));
}

}  // namespace

TEST_CASE("issue 11: injected runtime faults in the four-arm scenario reach the caller, keep "
          "the invariants and leak nothing",
          "[faults][issue11]") {
  sweep("four arms and the fix", arms_scenario, 8, true);
}

TEST_CASE("issue 11: injected runtime faults in the GEMM scenario reach the caller, keep the "
          "invariants and leak nothing",
          "[faults][issue11]") {
  // About 0.3 s of host GEMMs a run: a few points per category by default.
  sweep("GEMM scenario, status quo arm", gemm_status_quo, 2, true);
  sweep("GEMM scenario, capalloc arm", gemm_capalloc, 3, true);
}

TEST_CASE("issue 11: injected runtime faults in a random sequence reach the operation, keep "
          "the invariants and leak nothing",
          "[faults][issue11]") {
  const std::string name =
      absl::StrFormat("random sequence (seed %d, %d ops)", kRandomSeed, kRandomOps);
  sweep(name.c_str(), random_scenario, 40, false);
}

TEST_CASE("issue 11: the fault-injecting runtime numbers calls per category and fails the "
          "one asked",
          "[faults][issue11]") {
  capalloc::HostRuntimeOptions options;
  auto rt = std::make_shared<FaultInjectingRuntime>(capalloc::make_host_runtime(options).value(),
                                                    FaultPlan{.category = FaultCategory::kEvent,
                                                              .nth = 2});
  auto e1 = rt->create_event(0);
  REQUIRE(e1.ok());
  auto e2 = rt->create_event(0);  // the 2nd event call
  REQUIRE_FALSE(e2.ok());
  CHECK(e2.status().code() == absl::StatusCode::kInternal);
  CHECK_THAT(std::string(e2.status().message()),
             Catch::StartsWith("injected fault: event call #2 (create_event(device 0))"));
  CHECK(rt->outstanding().events == 1);
  // A failed destroy leaves the event held; the next one destroys it.
  rt->set_plan(FaultPlan{.category = FaultCategory::kEvent, .nth = 1});
  CHECK_FALSE(rt->destroy_event(*e1).ok());
  CHECK(rt->outstanding().events == 1);
  CHECK(rt->injected().back().held == HeldKind::kEvent);
  CHECK(rt->destroy_event(*e1).ok());
  CHECK(rt->outstanding().none());
  // Reserve fails with kResourceExhausted; nothing is reserved.
  rt->set_plan(FaultPlan{.category = FaultCategory::kReserve, .nth = 1});
  auto seg = rt->reserve(0, 1 << 21);
  CHECK(absl::IsResourceExhausted(seg.status()));
  CHECK(rt->outstanding().none());
  // A failed end of capture ends the capture and makes no graph.
  auto s = rt->create_stream(0).value();
  rt->set_plan(FaultPlan{.category = FaultCategory::kInstantiate, .nth = 1});
  REQUIRE(rt->begin_capture(s, capalloc::CaptureMode::kGlobal).ok());
  CHECK_FALSE(rt->end_capture(s).ok());
  CHECK(rt->capture_info(s)->status == capalloc::CaptureStatus::kNone);
  CHECK(rt->outstanding().graphs == 0);
  CHECK(rt->calls(FaultCategory::kCapture) == 2);
  CHECK(rt->calls(FaultCategory::kInstantiate) == 1);
  CHECK(rt->destroy_stream(s).ok());
  CHECK(rt->outstanding().none());
}

TEST_CASE("issue 11: a split-K GEMM whose event record fails still orders the next launch on "
          "another stream after it",
          "[faults][issue11][gemm]") {
  // SplitKGemm::run launches the GEMM, then records the event that the next
  // launch on another stream waits for (they share the workspace and the
  // semaphore). Here that record fails (event call #2: #1 creates the
  // event) while the GEMM sits queued on stream A behind a gate; the next
  // GEMM, on stream B, must still run after A's. (Before the fix, run() left
  // its ordering state as if A's GEMM had never been launched, and B's ran
  // at once.)
  capalloc::HostRuntimeOptions options;
  auto rt = std::make_shared<FaultInjectingRuntime>(capalloc::make_host_runtime(options).value());
  auto alloc = Allocator::create(rt).value();
  PersistentCache cache(*alloc);
  capalloc::SplitKGemm gemm(*alloc, cache);
  REQUIRE(gemm.preallocate_split_k(0).ok());
  const StreamHandle a_stream = rt->create_stream(0).value();
  const StreamHandle b_stream = rt->create_stream(0).value();
  constexpr int kM = 1, kN = 64, kK = 256;
  void* a = alloc->allocate(kM * kK * sizeof(float)).value();
  void* b = alloc->allocate(kN * kK * sizeof(float)).value();
  void* c1 = alloc->allocate(kM * kN * 2).value();
  void* c2 = alloc->allocate(kM * kN * 2).value();
  const capalloc::GemmProblem p1{.m = kM, .n = kN, .k = kK, .a = a, .a_type = capalloc::DType::kF32,
                                 .b = b, .b_type = capalloc::DType::kF32, .c = c1};
  capalloc::GemmProblem p2 = p1;
  p2.c = c2;

  // The log of what ran, in order.
  std::mutex mu;
  std::vector<std::string> log;
  auto note = [&](std::string what) {
    std::lock_guard lock(mu);
    log.push_back(std::move(what));
  };
  std::promise<void> gate;
  std::shared_future<void> opened = gate.get_future().share();
  KernelLaunch wait{.name = "gate", .host_body = [opened] { opened.wait(); }};
  REQUIRE(rt->launch_kernel(a_stream, std::move(wait)).ok());
  std::thread opener([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    note("gate opened");
    gate.set_value();
  });

  rt->set_plan(FaultPlan{.category = FaultCategory::kEvent, .nth = 2});
  // Stream calls from here to B's launch: run(A) synchronizes A when the
  // record fails; if that fails too (the wrapper's failed synchronization
  // still waits, so the order alone cannot tell), run(B) synchronizes A.
  std::uint64_t syncs_until_b = 1;
  SECTION("run() waits for A's GEMM when the record fails") {}
  SECTION("and when waiting for it then fails too, the next launch on another stream does") {
    rt->add_plan(FaultPlan{.category = FaultCategory::kStream, .nth = 1});
    syncs_until_b = 2;
  }
  const absl::Status first = gemm.run(0, a_stream, p1);
  CHECK_THAT(std::string(first.message()), Catch::Contains("injected fault: event call #2"));
  KernelLaunch mark{.name = "mark", .host_body = [&] { note("B's GEMM done"); }};
  const absl::Status second = gemm.run(0, b_stream, p2);
  CHECK(second.ok());
  CHECK(rt->calls(FaultCategory::kStream) == syncs_until_b);
  REQUIRE(rt->launch_kernel(b_stream, std::move(mark)).ok());
  CHECK(rt->synchronize_stream(b_stream).ok());
  opener.join();
  CHECK(rt->synchronize_stream(a_stream).ok());
  {
    std::lock_guard lock(mu);
    INFO(absl::StrJoin(log, ", "));
    REQUIRE(log.size() == 2);
    CHECK(log[0] == "gate opened");  // B's GEMM waited for A's, queued behind the gate
  }
  for (void* p : {a, b, c1, c2}) CHECK(alloc->deallocate(p).ok());
  CHECK(rt->destroy_stream(a_stream).ok());
  CHECK(rt->destroy_stream(b_stream).ok());
}

TEST_CASE("issue 11: a split-K preallocation whose zeroing fails leaves no unzeroed semaphore "
          "for later launches",
          "[faults][issue11][gemm]") {
  // preallocate_split_k allocates the workspace and the semaphore, then
  // zeroes the semaphore (memset_async, then synchronize_stream). When the
  // zeroing fails, a later run() must not take the semaphore as ready: its
  // memory holds whatever the block's address held before (here 0xFF bytes
  // of a freed block), and the GEMM's split-K protocol reads it first.
  capalloc::HostRuntimeOptions options;
  auto rt = std::make_shared<FaultInjectingRuntime>(capalloc::make_host_runtime(options).value());
  auto alloc = Allocator::create(rt).value();
  PersistentCache cache(*alloc);
  capalloc::SplitKGemm gemm(*alloc, cache);
  void* dirty = alloc->allocate(capalloc::kSplitKSemaphoreBytes).value();
  REQUIRE(rt->memset_async(dirty, 0xFF, capalloc::kSplitKSemaphoreBytes, kDefaultStream).ok());
  REQUIRE(rt->synchronize_stream(kDefaultStream).ok());
  REQUIRE(alloc->deallocate(dirty).ok());

  SECTION("the memset fails") {
    rt->set_plan(FaultPlan{.category = FaultCategory::kLaunch, .nth = 1});
  }
  SECTION("the synchronization after it fails") {
    rt->set_plan(FaultPlan{.category = FaultCategory::kStream, .nth = 1});
  }
  const absl::Status warm = gemm.preallocate_split_k(0);
  CHECK_THAT(std::string(warm.message()), Catch::Contains("injected fault"));
  rt->set_plan(FaultPlan{});
  // Either no semaphore is handed out, or it reads zero.
  if (auto buffers = gemm.buffers(0); buffers.ok()) {
    std::vector<std::int32_t> sem(capalloc::kSplitKMaxTiles, -1);
    REQUIRE(rt->memcpy_async(sem.data(), buffers->semaphore, capalloc::kSplitKSemaphoreBytes,
                             kDefaultStream)
                .ok());
    REQUIRE(rt->synchronize_stream(kDefaultStream).ok());
    CHECK(std::count(sem.begin(), sem.end(), 0) == capalloc::kSplitKMaxTiles);
  }
  // A later warmup (or run()'s own) hands out a zeroed semaphore.
  REQUIRE(gemm.preallocate_split_k(0).ok());
  auto buffers = gemm.buffers(0);
  REQUIRE(buffers.ok());
  std::vector<std::int32_t> sem(capalloc::kSplitKMaxTiles, -1);
  REQUIRE(rt->memcpy_async(sem.data(), buffers->semaphore, capalloc::kSplitKSemaphoreBytes,
                           kDefaultStream)
              .ok());
  REQUIRE(rt->synchronize_stream(kDefaultStream).ok());
  CHECK(std::count(sem.begin(), sem.end(), 0) == capalloc::kSplitKMaxTiles);
  CHECK(alloc->CheckInvariants().ok());
}
