// tools/report/scenario_trace.hpp: a ScenarioRecorder that writes what a
// scenario did as an event trace (docs/trace.md) plus the snapshot taken when
// its work is done (docs/snapshot.md): the two inputs of `capalloc report`.
//
// Allocations and frees are found by comparing the allocator's allocated
// blocks (Allocator::segments) after each step with those after the step
// before: every block a step leaves allocated is seen with its true address,
// size, tag, pool and capture. A block allocated and freed within one step
// would be missed; the allocator's allocation counter tells, and
// `missed_allocations()` counts them (the report says so). The scenarios
// record a step after every call that allocates, so for them it is 0.
#ifndef CAPALLOC_TOOLS_REPORT_SCENARIO_TRACE_HPP_
#define CAPALLOC_TOOLS_REPORT_SCENARIO_TRACE_HPP_

#include <chrono>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tools/scenarios/scenario_recorder.hpp"

namespace capalloc::report {

class ScenarioTrace final : public scenarios::ScenarioRecorder {
 public:
  // `source` goes into the trace's header (e.g. "capalloc arms --arm A").
  explicit ScenarioTrace(std::string source);

  void step(const Allocator& allocator) override;
  void capture_begun(const Allocator& allocator, CaptureId capture, StreamHandle stream,
                     PoolHandle pool, std::string_view label) override;
  void capture_ended(const Allocator& allocator, CaptureId capture,
                     const std::vector<Finding>& new_findings) override;
  void replayed(const Allocator& allocator, CaptureId capture, bool refused) override;
  void finished(CaptureTracker& tracker) override;

  // The trace so far: the header line, then one line per event.
  std::string trace_jsonl() const;
  // The snapshot taken by finished(); empty before.
  const std::string& snapshot_json() const { return snapshot_; }
  std::uint64_t missed_allocations() const { return missed_; }

 private:
  struct LiveBlock {
    const void* ptr = nullptr;
    std::size_t size = 0;
  };
  // Appends one event line, with `t` (nanoseconds since construction).
  void emit(nlohmann::ordered_json event);
  std::uint64_t now_ns() const;

  std::string source_;
  std::chrono::steady_clock::time_point start_;
  std::vector<std::string> lines_;
  std::map<std::uint64_t, LiveBlock> live_;  // by sequence
  std::uint64_t allocations_seen_ = 0;       // the allocator's counter at the last step
  std::uint64_t missed_ = 0;
  std::string snapshot_;
};

}  // namespace capalloc::report

#endif  // CAPALLOC_TOOLS_REPORT_SCENARIO_TRACE_HPP_
