// tools/stress/stress_world.cpp: what the stress executors share (see
// stress_world.hpp).
#include "tools/stress/stress_world.hpp"

#include "absl/strings/str_format.h"

namespace capalloc::stress {

std::shared_ptr<World> World::create(std::size_t memory_limit, bool threaded) {
  auto world = std::make_shared<World>();
  world->threaded = threaded;
  HostRuntimeOptions options;
  options.device_count = kDevices;
  options.memory_limit_per_device = memory_limit;
  world->runtime = make_host_runtime(options).value();
  AllocatorOptions allocator_options;
  // Threads capture on their own streams at once: each refuses persistent
  // requests only on its own capturing stream.
  if (threaded) allocator_options.capture_guard_scope = CaptureGuardScope::kStream;
  world->allocator = Allocator::create(world->runtime, allocator_options).value();
  world->tracker = CaptureTracker::create(*world->allocator).value();
  world->cache = std::make_unique<PersistentCache>(*world->allocator);
  for (int d = 0; d < kDevices; ++d)
    world->shared_pools[d] = world->allocator->create_graph_pool(d).value();
  return world;
}

World::~World() {
  cache.reset();
  tracker.reset();
  if (allocator)
    for (PoolHandle p : shared_pools) allocator->release_graph_pool(p).IgnoreError();
  allocator.reset();
}

std::optional<std::string> World::claim(const void* ptr, std::size_t bytes) {
  std::lock_guard lock(claims_mu);
  const auto begin = reinterpret_cast<std::uintptr_t>(ptr);
  auto next = claims.lower_bound(begin);
  if (next != claims.end() && next->first < begin + bytes) {
    return absl::StrFormat("new block [%#x, +%d) overlaps live block [%#x, +%d)", begin, bytes,
                           next->first, next->second);
  }
  if (next != claims.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second > begin) {
      return absl::StrFormat("new block [%#x, +%d) overlaps live block [%#x, +%d)", begin, bytes,
                             prev->first, prev->second);
    }
  }
  claims.emplace(begin, bytes);
  return std::nullopt;
}

void World::unclaim(const void* ptr) {
  std::lock_guard lock(claims_mu);
  claims.erase(reinterpret_cast<std::uintptr_t>(ptr));
}

bool World::is_claimed(const void* ptr) const {
  std::lock_guard lock(claims_mu);
  const auto p = reinterpret_cast<std::uintptr_t>(ptr);
  auto next = claims.upper_bound(p);
  if (next == claims.begin()) return false;
  auto prev = std::prev(next);
  return prev->first + prev->second > p;
}

std::uint64_t World::next_cookie() { return cookies.fetch_add(1, std::memory_order_relaxed); }

}  // namespace capalloc::stress
