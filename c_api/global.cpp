// c_api/global.cpp: see global.hpp.
#include "c_api/global.hpp"

#include <cstdlib>
#include <memory>
#include <mutex>

#include "common/log.hpp"
#include "runtime/runtime_factory.hpp"

namespace capalloc::detail {

namespace {

absl::StatusOr<GlobalCapalloc> make_global() {
  const char* kind = std::getenv("CAPALLOC_RUNTIME");
  auto chosen = choose_runtime(kind != nullptr && *kind ? kind : "auto");
  if (!chosen.ok()) return chosen.status();
  auto options = AllocatorOptions::from_env();
  if (!options.ok()) return options.status();
  auto tracker_options = TrackerOptions::from_env();
  if (!tracker_options.ok()) return tracker_options.status();
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

absl::StatusOr<GlobalCapalloc> global_capalloc() {
  static std::once_flag once;
  static absl::StatusOr<GlobalCapalloc>* instance = nullptr;
  std::call_once(once, [] {
    instance = new absl::StatusOr<GlobalCapalloc>(make_global());
    if (!instance->ok()) log().error("capalloc could not start: {}", instance->status().ToString());
  });
  return *instance;
}

}  // namespace capalloc::detail
