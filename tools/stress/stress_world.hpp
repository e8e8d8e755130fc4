// tools/stress/stress_world.hpp: what the stress executors share (internal to
// tools/stress): the host runtime, the allocator, its tracker and persistent
// cache, the shared graph pools, and the address claims of live blocks.
#ifndef CAPALLOC_TOOLS_STRESS_STRESS_WORLD_HPP_
#define CAPALLOC_TOOLS_STRESS_STRESS_WORLD_HPP_

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <string>
#include <vector>

#include "capalloc/allocator.hpp"
#include "capalloc/capture.hpp"
#include "capalloc/persistent_cache.hpp"
#include "capalloc/runtime.hpp"
#include "tools/stress/stress_driver.hpp"

namespace capalloc::stress {

inline constexpr int kDevices = 2;  // emulated devices of the host runtime

struct World {
  static std::shared_ptr<World> create(std::size_t memory_limit, bool threaded);
  ~World();

  // A new live block's range: the message if it overlaps one already claimed.
  std::optional<std::string> claim(const void* ptr, std::size_t bytes);
  void unclaim(const void* ptr);
  bool is_claimed(const void* ptr) const;  // inside some live block
  std::uint64_t next_cookie();
  // Threaded runs: with every executor between operations, the stats equal
  // the sums of the executors' models.
  std::optional<std::string> check_global();

  bool threaded = false;
  std::shared_ptr<DeviceRuntime> runtime;
  std::unique_ptr<Allocator> allocator;
  std::unique_ptr<CaptureTracker> tracker;
  std::unique_ptr<PersistentCache> cache;
  PoolHandle shared_pools[kDevices] = {};
  // Operations hold it shared; check_global holds it alone.
  std::shared_mutex ops_mu;
  std::vector<Executor::State*> executors;

 private:
  mutable std::mutex claims_mu;
  std::map<std::uintptr_t, std::size_t> claims;  // live blocks by address
  std::atomic<std::uint64_t> cookies{1};
};

}  // namespace capalloc::stress

#endif  // CAPALLOC_TOOLS_STRESS_STRESS_WORLD_HPP_
