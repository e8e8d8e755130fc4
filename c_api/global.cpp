// c_api/global.cpp: see global.hpp.
#include "c_api/global.hpp"

#include <cstdlib>
#include <memory>
#include <string>

#include "common/config.hpp"
#include "common/log.hpp"
#include "common/status_macros.hpp"
#include "runtime/runtime_factory.hpp"

namespace capalloc::detail {

namespace {

absl::StatusOr<GlobalCapalloc> make_global() {
  // Every variable first (common/config.hpp): an invalid one fails the start
  // the same way, whichever it is, before anything is created.
  CAPALLOC_ASSIGN_OR_RETURN(const std::string kind, config::get_choice(config::Var::kRuntime));
  // The logger applies the level itself when it starts; here it is checked.
  CAPALLOC_RETURN_IF_ERROR(log_level_from_env().status());
  auto options = AllocatorOptions::from_env();
  if (!options.ok()) return options.status();
  auto tracker_options = TrackerOptions::from_env();
  if (!tracker_options.ok()) return tracker_options.status();
  auto chosen = choose_runtime(kind);
  if (!chosen.ok()) return chosen.status();
  auto allocator = Allocator::create(chosen->runtime, *options);
  if (!allocator.ok()) return allocator.status();
  auto tracker = CaptureTracker::create(**allocator, *tracker_options);
  if (!tracker.ok()) return tracker.status();
  GlobalCapalloc g;
  g.allocator = allocator->release();
  g.tracker = tracker->release();
  g.cache = new PersistentCache(*g.allocator);
  g.host_fallback_reason = std::move(chosen->host_fallback_reason);
  return g;
}

}  // namespace

const absl::StatusOr<GlobalCapalloc>& global_capalloc() {
  // Never destroyed (see global.hpp): blocks may be freed from static
  // destructors that run after ours would have.
  static const absl::StatusOr<GlobalCapalloc>* const instance = [] {
    auto* made = new absl::StatusOr<GlobalCapalloc>(make_global());
    if (!made->ok()) log().error("capalloc could not start: {}", made->status().ToString());
    // The event trace (CAPALLOC_TRACE, capalloc_trace_start) is written out at
    // exit: the allocator itself is never destroyed.
    if (made->ok()) {
      std::atexit([] {
        const auto& g = global_capalloc();
        if (g.ok()) g->allocator->stop_trace().IgnoreError();
      });
    }
    return made;
  }();
  return *instance;
}

}  // namespace capalloc::detail
