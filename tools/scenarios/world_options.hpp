// tools/scenarios/world_options.hpp: how a seed 003 scenario's world is set
// up (ArmsOptions and GemmScenarioOptions are this struct;
// scenario_world.hpp).
#ifndef CAPALLOC_TOOLS_SCENARIOS_WORLD_OPTIONS_HPP_
#define CAPALLOC_TOOLS_SCENARIOS_WORLD_OPTIONS_HPP_

#include "capalloc/allocator.hpp"
#include "tools/scenarios/scenario_recorder.hpp"
#include "tools/scenarios/world_observer.hpp"

namespace capalloc::scenarios {

struct WorldOptions {
  bool strict = false;  // the tracker refuses replays of graphs with hazards
  bool strict_possible = false;  // and, with strict, of graphs with `possible` findings
  AllocatorOptions allocator = {};  // the world's allocator (the CLI's CAPALLOC_* settings)
  WorldObserver observer = {};  // sees the world's allocator (the fault-injection test)
  ScenarioRecorder* recorder = nullptr;  // watches the steps (`--report`; run_fix drops it)
};

}  // namespace capalloc::scenarios

#endif  // CAPALLOC_TOOLS_SCENARIOS_WORLD_OPTIONS_HPP_
