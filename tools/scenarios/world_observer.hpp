// tools/scenarios/world_observer.hpp: a hook into the scenarios' worlds (the
// allocator, tracker and streams each arm makes and tears down), for the
// fault-injection sweep (tests/fault_injection_test.cpp, issue 11): it sees
// the allocator when the arm's work is over, failed or not, and once the
// world has released everything but the allocator.
#ifndef CAPALLOC_TOOLS_SCENARIOS_WORLD_OBSERVER_HPP_
#define CAPALLOC_TOOLS_SCENARIOS_WORLD_OBSERVER_HPP_

#include <functional>

#include "capalloc/allocator.hpp"

namespace capalloc::scenarios {

enum class WorldPoint {
  kCreated,   // the allocator exists; nothing else does yet
  kWorkDone,  // the arm returned (a result or an error); nothing released yet
  kReleased,  // graphs, blocks, pools, tracker and streams released; the
              // allocator is destroyed next
};

using WorldObserver = std::function<void(WorldPoint point, const Allocator& allocator)>;

}  // namespace capalloc::scenarios

#endif  // CAPALLOC_TOOLS_SCENARIOS_WORLD_OBSERVER_HPP_
