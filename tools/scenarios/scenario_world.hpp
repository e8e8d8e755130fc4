// tools/scenarios/scenario_world.hpp: what each run of a seed 003 scenario
// (an arm, the fix, a split-K GEMM arm) owns: a runtime, an allocator and a
// tracker of its own, a side stream for the captures, and a list of what to
// release at the end: the blocks it allocated and still holds, its graphs
// and its graph pools.
//
// The scenarios' worlds (seed003_arms.cpp, seed003_gemm.cpp) derive from it
// and add their steps. Their allocations, frees and captures go through it,
// so the observer (the fault-injection test) and the recorder (`--report`)
// see each scenario the same way; what a PersistentCache allocates for them
// does not, and a world calls record_step() after it.
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
#include "tools/scenarios/world_options.hpp"

namespace capalloc::scenarios {

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

  // torch.cuda.graph_pool_handle(); released with the world.
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
  // Releases the rest (the cache, the tracker, the side stream). A rule for
  // every derived world: its destructor calls release_work() first, so that
  // its own members (the GEMM and its events) go after the graphs, blocks
  // and pools and before the cache and the tracker, as on a device; without
  // it they would go first. The fault-injection test checks this order.
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
  StreamHandle side_ = kDefaultStream;

 private:
  void observe(WorldPoint point);
  CaptureId capture_of(GraphHandle graph) const;

  // Declared after rt_, so destroyed before it.
  std::unique_ptr<Allocator> allocator_;
  std::unique_ptr<CaptureTracker> tracker_;
  ScenarioRecorder* recorder_ = nullptr;
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
