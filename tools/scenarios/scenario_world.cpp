// tools/scenarios/scenario_world.cpp: see scenario_world.hpp.
#include "tools/scenarios/scenario_world.hpp"

#include <algorithm>

#include "common/status_macros.hpp"

namespace capalloc::scenarios {

absl::Status ScenarioWorld::open(std::shared_ptr<DeviceRuntime> rt, const WorldOptions& options) {
  rt_ = std::move(rt);
  CAPALLOC_ASSIGN_OR_RETURN(allocator_, Allocator::create(rt_, options.allocator));
  observer_ = options.observer;
  recorder_ = options.recorder;
  observe(WorldPoint::kCreated);
  CAPALLOC_ASSIGN_OR_RETURN(
      tracker_, CaptureTracker::create(*allocator_, {.strict = options.strict,
                                                     .strict_possible = options.strict_possible}));
  CAPALLOC_ASSIGN_OR_RETURN(side_, rt_->create_stream(0));
  return absl::OkStatus();
}

void ScenarioWorld::release_work() {
  if (allocator_ == nullptr || work_released_) return;
  work_released_ = true;
  observe(WorldPoint::kWorkDone);
  if (recorder_ != nullptr && tracker_ != nullptr) recorder_->finished(*tracker_);
  rt_->synchronize_stream(kDefaultStream).IgnoreError();
  if (side_ != kDefaultStream) rt_->synchronize_stream(side_).IgnoreError();
  if (tracker_ != nullptr) {
    for (GraphHandle g : graphs_) tracker_->destroy_graph(g).IgnoreError();
  }
  for (void* p : blocks_) allocator_->deallocate(p).IgnoreError();
  for (PoolHandle p : pools_) allocator_->release_graph_pool(p).IgnoreError();
}

ScenarioWorld::~ScenarioWorld() {
  if (allocator_ == nullptr) return;
  release_work();  // a no-op where the derived world's destructor ran it
  cache_.reset();
  tracker_.reset();
  if (side_ != kDefaultStream) rt_->destroy_stream(side_).IgnoreError();
  observe(WorldPoint::kReleased);
}

PersistentCache& ScenarioWorld::cache() {
  if (!cache_) cache_ = std::make_unique<PersistentCache>(*allocator_);
  return *cache_;
}

absl::StatusOr<PoolHandle> ScenarioWorld::pool() {
  CAPALLOC_ASSIGN_OR_RETURN(PoolHandle p, allocator_->create_graph_pool(0));
  pools_.push_back(p);
  return p;
}

absl::StatusOr<void*> ScenarioWorld::alloc(std::size_t bytes, StreamHandle stream,
                                           std::string_view tag, Lifetime lifetime) {
  CAPALLOC_ASSIGN_OR_RETURN(void* p, allocator_->allocate(bytes, 0, stream,
                                                          {.lifetime = lifetime, .tag = tag}));
  blocks_.push_back(p);
  record_step();
  return p;
}

absl::Status ScenarioWorld::del(void* p) {
  const auto held = std::find(blocks_.begin(), blocks_.end(), p);
  if (held == blocks_.end()) {
    return absl::NotFoundError("del: the scenario's world holds no block at that address");
  }
  blocks_.erase(held);
  absl::Status s = allocator_->deallocate(p);
  record_step();
  return s;
}

void ScenarioWorld::record_step() {
  if (recorder_ != nullptr) recorder_->step(*allocator_);
}

absl::StatusOr<CaptureResult> ScenarioWorld::capture(PoolHandle pool, std::string label,
                                                     const std::function<absl::Status()>& body) {
  CAPALLOC_ASSIGN_OR_RETURN(CaptureId id,
                            tracker_->begin_capture(0, side_, {.pool = pool, .label = label}));
  if (recorder_ != nullptr) recorder_->capture_begun(*allocator_, id, side_, pool, label);
  absl::Status inside = body();
  auto done = tracker_->end_capture(side_);
  CAPALLOC_RETURN_IF_ERROR(inside);
  if (done.ok()) {
    graphs_.push_back(done->graph);
    captures_.push_back({done->graph, id});
    if (recorder_ != nullptr) recorder_->capture_ended(*allocator_, id, done->new_findings);
  }
  return done;
}

absl::Status ScenarioWorld::replay_once(GraphHandle graph, bool& refused) {
  absl::Status s = tracker_->replay(graph, kDefaultStream);
  refused = absl::IsFailedPrecondition(s) && tracker_->strict();
  if (recorder_ != nullptr && (s.ok() || refused)) {
    recorder_->replayed(*allocator_, capture_of(graph), refused);
  }
  return s;
}

void ScenarioWorld::observe(WorldPoint point) {
  if (observer_) observer_(point, *allocator_);
}

CaptureId ScenarioWorld::capture_of(GraphHandle graph) const {
  for (const auto& [g, id] : captures_) {
    if (g == graph) return id;
  }
  return 0;
}

}  // namespace capalloc::scenarios
