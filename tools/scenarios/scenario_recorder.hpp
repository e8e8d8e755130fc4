// tools/scenarios/scenario_recorder.hpp: a hook that watches a scenario's
// steps, so that `capalloc arms --report` and `capalloc gemm-scenario
// --report` can draw what happened (tools/report/scenario_trace.hpp turns the
// steps into an event trace and a snapshot).
//
// The scenarios call it after every step that may change the allocator's
// blocks (an allocation, a free, a PersistentCache or GEMM call), around each
// capture, after each replay, and once when the work is done, before
// anything is released. The recorder reads the allocator; it must not change
// it.
#ifndef CAPALLOC_TOOLS_SCENARIOS_SCENARIO_RECORDER_HPP_
#define CAPALLOC_TOOLS_SCENARIOS_SCENARIO_RECORDER_HPP_

#include <string_view>
#include <vector>

#include "capalloc/allocator.hpp"
#include "capalloc/capture.hpp"

namespace capalloc::scenarios {

class ScenarioRecorder {
 public:
  virtual ~ScenarioRecorder() = default;
  // After a step that may have allocated or freed blocks.
  virtual void step(const Allocator& allocator) = 0;
  // A capture began on `stream`, allocating into `pool`.
  virtual void capture_begun(const Allocator& allocator, CaptureId capture, StreamHandle stream,
                             PoolHandle pool, std::string_view label) = 0;
  // The capture ended (its graph exists), with the findings the tracker
  // reported at its end.
  virtual void capture_ended(const Allocator& allocator, CaptureId capture,
                             const std::vector<Finding>& new_findings) = 0;
  // The graph of `capture` was replayed once (or its replay refused).
  virtual void replayed(const Allocator& allocator, CaptureId capture, bool refused) = 0;
  // The scenario's work is done; nothing is released yet.
  virtual void finished(CaptureTracker& tracker) = 0;
};

}  // namespace capalloc::scenarios

#endif  // CAPALLOC_TOOLS_SCENARIOS_SCENARIO_RECORDER_HPP_
