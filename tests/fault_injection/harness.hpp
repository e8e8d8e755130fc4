// tests/fault_injection/harness.hpp: what the fault-injection test's files
// share (tests/fault_injection_test.cpp says what the test checks): the
// Harness that runs a scenario over a fresh fault-injecting runtime and
// records what its checks found, the scenarios, and the sweep that fails
// each of a scenario's runtime calls in turn.
#ifndef CAPALLOC_TESTS_FAULT_INJECTION_HARNESS_HPP_
#define CAPALLOC_TESTS_FAULT_INJECTION_HARNESS_HPP_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "capalloc/allocator.hpp"
#include "capalloc/capture.hpp"
#include "capalloc/persistent_cache.hpp"
#include "capalloc/runtime.hpp"
#include "runtime/fault_injecting_runtime.hpp"
#include "tools/scenarios/seed003_arms.hpp"

namespace capalloc::fault_test {

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

// A scenario: runs over h.rt, reports through h, and returns its first error.
using Scenario = absl::Status (*)(Harness&);

// The scenarios (scenarios.cpp, random_sequence.cpp).
absl::Status arms_scenario(Harness& h);
absl::Status gemm_status_quo(Harness& h);
absl::Status gemm_capalloc(Harness& h);
absl::Status random_scenario(Harness& h);

// An unsigned integer from the environment variable `name`, or `fallback`.
std::uint64_t env_or(const char* name, std::uint64_t fallback);
// The random sequence's seed and length (FAULT_SWEEP_SEED, FAULT_SWEEP_OPS).
extern const std::uint64_t kRandomSeed;
extern const std::size_t kRandomOps;

// Sweeps `scenario`'s fault points, up to `cap` per category (sweep.cpp).
void sweep(const char* name, Scenario scenario, std::uint64_t cap, bool deterministic);

}  // namespace capalloc::fault_test

#endif  // CAPALLOC_TESTS_FAULT_INJECTION_HARNESS_HPP_
