// tools/scenarios/scenario_world.hpp: what each run of a seed 003 scenario
// (an arm, the fix, a split-K GEMM arm) owns: a runtime, an allocator and a
// tracker of its own, a side stream for the captures, and a list of what to
// release at the end: the blocks it allocated and still holds, its graphs
// and its graph pools.
//
// The scenarios' worlds (seed003_arms.cpp, seed003_gemm.cpp) derive from it
// and add their steps. Every allocation, free and capture goes through it,
// so the observer (the fault-injection test) and the recorder (`--report`)
// see each scenario the same way.
#ifndef CAPALLOC_TOOLS_SCENARIOS_SCENARIO_WORLD_HPP_
#define CAPALLOC_TOOLS_SCENARIOS_SCENARIO_WORLD_HPP_

#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "capalloc/allocator.hpp"
#include "capalloc/capture.hpp"
#include "capalloc/persistent_cache.hpp"
#include "capalloc/runtime.hpp"
#include "tools/scenarios/scenario_recorder.hpp"
#include "tools/scenarios/world_observer.hpp"

namespace capalloc::scenarios {

// How a scenario's world is set up (ArmsOptions and GemmScenarioOptions).
struct WorldOptions {
  bool strict = false;  // the tracker refuses replays of graphs with hazards
  bool strict_possible = false;  // and, with strict, of graphs with `possible` findings
  AllocatorOptions allocator = {};  // the world's allocator (the CLI's CAPALLOC_* settings)
  WorldObserver observer = {};  // sees the world's allocator (the fault-injection test)
  ScenarioRecorder* recorder = nullptr;  // watches the steps (`--report`; run_fix drops it)
};

class ScenarioWorld {
 public:
  ScenarioWorld(const ScenarioWorld&) = delete;
  ScenarioWorld& operator=(const ScenarioWorld&) = delete;

  DeviceRuntime& rt() { return *rt_; }
  StreamHandle side() const { return side_; }
  Allocator& allocator() { return *allocator_; }
  CaptureTracker& tracker() { return *tracker_; }
  // Made at its first use: most arms never ask for one.
  PersistentCache& cache();

  // torch.graph_pool_handle(); released with the world.
  absl::StatusOr<PoolHandle> pool();
  // A block on `stream`, held until del() or the end of the world.
  absl::StatusOr<void*> alloc(std::size_t bytes, StreamHandle stream, std::string_view tag,
                              Lifetime lifetime = Lifetime::kTransient);
  absl::Status del(void* p);
  // After a step outside alloc() and del() that may allocate (a
  // PersistentCache's buffers).
  void record_step();

  // Captures `body` on the side stream into `pool`. The body's error comes
  // first; the capture is ended either way.
  absl::StatusOr<CaptureResult> capture(PoolHandle pool, std::string label,
                                        const std::function<absl::Status()>& body);
  // One replay of `graph` on the default stream, through the tracker's
  // replay guard. `refused`: strict mode refused it (the status says why).
  absl::Status replay_once(GraphHandle graph, bool& refused);

 protected:
  ScenarioWorld() = default;
  // Releases the rest (the cache, the tracker, the side stream); the
  // derived world's destructor calls release_work() first.
  ~ScenarioWorld();

  // Makes the allocator, then the tracker and the side stream.
  absl::Status open(std::shared_ptr<DeviceRuntime> rt, const WorldOptions& options);
  // Teardown's first half, best effort (a runtime failure here has no
  // caller to reach; what a failed call leaves held is released by a later
  // owner, the tracker's destructor or the allocator's, or stays held, as
  // on a device): waits for the streams' work, which must not outlive the
  // memory it touches, then destroys the graphs, frees the blocks and
  // releases the pools.
  void release_work();

  std::shared_ptr<DeviceRuntime> rt_;
  std::unique_ptr<Allocator> allocator_;
  std::unique_ptr<CaptureTracker> tracker_;
  ScenarioRecorder* recorder_ = nullptr;
  StreamHandle side_ = kDefaultStream;

 private:
  void observe(WorldPoint point);
  CaptureId capture_of(GraphHandle graph) const;

  WorldObserver observer_;
  std::unique_ptr<PersistentCache> cache_;
  bool work_released_ = false;
  std::vector<std::pair<GraphHandle, CaptureId>> captures_;
  std::vector<GraphHandle> graphs_;
  std::vector<void*> blocks_;
  std::vector<PoolHandle> pools_;
};

}  // namespace capalloc::scenarios

#endif  // CAPALLOC_TOOLS_SCENARIOS_SCENARIO_WORLD_HPP_
