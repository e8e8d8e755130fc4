// c_api/torch_pools.cpp: PyTorch's graph-pool hooks in the C ABI
// (beginAllocateToPool, endAllocateToPool, releasePool), which the C++ shim
// python/capalloc/_torch_shim.cpp sets on a CUDAPluggableAllocator.
//
// PyTorch names a pool by a MempoolId_t (a pair of integers) per device and
// announces it before the capture exists: the capture id is known only at
// its first allocation. So a begin is kept "underway" with its filter, and
// capalloc_torch_malloc asks the filters of the device's underway begins,
// the first time a capture allocates, which pool the capture belongs to;
// the capture is then routed there (Allocator::begin_allocate_to_pool). The
// end ends those routes, which makes the tracker inspect the captured graph
// while it still exists (CaptureListener::on_capture_pool_end), and returns
// the findings that concern the capture.
#include <atomic>
#include <cstdint>
#include <deque>
#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "c_api/c_api_support.hpp"
#include "c_api/global.hpp"
#include "capalloc/allocator.hpp"
#include "capalloc/capalloc.h"
#include "capalloc/capture.hpp"

namespace capalloc::detail {
namespace {

using TorchPoolKey = std::tuple<int, std::uint64_t, std::uint64_t>;  // device, MempoolId_t

std::string describe(const TorchPoolKey& key) {
  return absl::StrFormat("PyTorch pool (%d, %d) on device %d", std::get<1>(key),
                         std::get<2>(key), std::get<0>(key));
}

// One beginAllocateToPool not yet ended.
struct Underway {
  capalloc_stream_filter filter = nullptr;
  void* context = nullptr;
  std::vector<CaptureId> captures;  // the captures the filter accepted
};

struct TorchPool {
  PoolHandle handle = kDefaultPool;
  int uses = 0;                  // begins minus releases (PyTorch's use_count)
  std::deque<Underway> underway;  // oldest first
};

struct TorchPools {
  std::mutex mu;
  std::map<TorchPoolKey, TorchPool> pools;
  absl::flat_hash_set<CaptureId> routed;  // captures routed by a filter, until their end
};

TorchPools& torch_pools() {
  static auto* pools = new TorchPools;  // never destroyed, like the global allocator
  return *pools;
}

absl::Status check_pool_id(const char* call, std::uint64_t a, std::uint64_t b) {
  if (a == 0 && b == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        call, ": pool (0, 0) names no pool (PyTorch gives every capture a pool id)"));
  }
  return absl::OkStatus();
}

absl::Status unknown_pool(const char* call, const TorchPoolKey& key) {
  return absl::NotFoundError(absl::StrCat(call, ": ", describe(key),
                                          " is not known: never begun, or released"));
}

// Whether strict mode (as set now) refuses this finding at a capture's end,
// as the replay guard would refuse a replay.
bool strict_refuses(const CaptureTracker& tracker, const Finding& f) {
  if (f.waived || !tracker.strict()) return false;
  return f.severity == Severity::kHazard ||
         (f.severity == Severity::kPossible && tracker.strict_possible());
}

}  // namespace

constinit std::atomic<int> torch_begins_underway{0};
constinit std::atomic<Allocator*> torch_allocator{nullptr};
constinit std::atomic<Allocator*> torch_unrouted_allocator{nullptr};

namespace {

// A begin is now underway: no steady-state path until every one has ended.
// Requires torch_pools().mu.
void torch_begin_underway() {
  torch_begins_underway.fetch_add(1, std::memory_order_release);
  torch_unrouted_allocator.store(nullptr, std::memory_order_release);
}

// A begin has ended; the last one republishes the allocator. Requires
// torch_pools().mu.
void torch_begin_ended() {
  if (torch_begins_underway.fetch_sub(1, std::memory_order_release) == 1) {
    torch_unrouted_allocator.store(torch_allocator.load(std::memory_order_acquire),
                                   std::memory_order_release);
  }
}

}  // namespace

void note_torch_allocator(Allocator* a) {
  std::lock_guard lock(torch_pools().mu);
  torch_allocator.store(a, std::memory_order_release);
  if (torch_begins_underway.load(std::memory_order_acquire) == 0) {
    torch_unrouted_allocator.store(a, std::memory_order_release);
  }
}

absl::Status route_torch_capture_underway(const GlobalCapalloc& g, int device, void* stream) {
  TorchPools& tp = torch_pools();
  const auto handle = reinterpret_cast<StreamHandle>(stream);
  auto info = g.allocator->runtime().capture_info(handle);
  // An unusable stream: the allocation reports it.
  if (!info.ok() || info->status != CaptureStatus::kActive) return absl::OkStatus();
  // A stream of another device: the allocation refuses it, and the capture
  // must not be routed to this device's pool on the way (its later
  // allocations for the stream's own device would find that route).
  if (auto on = g.allocator->runtime().stream_device(handle); on.ok() && *on != device) {
    return absl::OkStatus();
  }
  std::lock_guard lock(tp.mu);
  if (tp.routed.contains(info->id)) return absl::OkStatus();
  for (auto& [key, pool] : tp.pools) {
    if (std::get<0>(key) != device) continue;
    for (Underway& u : pool.underway) {
      if (u.filter != nullptr && u.filter(u.context, stream) == 0) continue;
      const absl::Status routed = g.allocator->begin_allocate_to_pool(device, info->id, pool.handle);
      // Already routed (a capture begun through capalloc_capture_begin):
      // it keeps its own pool.
      if (routed.code() == absl::StatusCode::kAlreadyExists) return absl::OkStatus();
      if (!routed.ok()) return routed;
      u.captures.push_back(info->id);
      tp.routed.insert(info->id);
      return absl::OkStatus();
    }
  }
  return absl::OkStatus();
}

}  // namespace capalloc::detail

namespace {

using capalloc::detail::GlobalCapalloc;
using capalloc::detail::TorchPool;
using capalloc::detail::TorchPoolKey;
using capalloc::detail::with_global;

capalloc_status null_argument(const char* call, const char* what) {
  return capalloc::detail::report_c_status(
      absl::InvalidArgumentError(absl::StrCat(call, ": ", what, " is NULL")));
}

}  // namespace

extern "C" {

capalloc_status capalloc_torch_begin_allocate_to_pool(int device, uint64_t pool_a,
                                                      uint64_t pool_b,
                                                      capalloc_stream_filter filter,
                                                      void* context) {
  constexpr const char* kCall = "capalloc_torch_begin_allocate_to_pool";
  return with_global([&](const GlobalCapalloc& g) -> absl::Status {
    if (absl::Status s = capalloc::detail::check_pool_id(kCall, pool_a, pool_b); !s.ok()) return s;
    auto& tp = capalloc::detail::torch_pools();
    std::lock_guard lock(tp.mu);
    const TorchPoolKey key{device, pool_a, pool_b};
    auto it = tp.pools.find(key);
    if (it == tp.pools.end()) {
      auto handle = g.allocator->create_graph_pool(device);
      if (!handle.ok()) return handle.status();
      it = tp.pools.emplace(key, TorchPool{*handle, 0, {}}).first;
    }
    it->second.underway.push_back({filter, context, {}});
    ++it->second.uses;
    capalloc::detail::torch_begin_underway();
    return absl::OkStatus();
  });
}

capalloc_status capalloc_torch_end_allocate_to_pool(int device, uint64_t pool_a, uint64_t pool_b,
                                                    const char** findings_json) {
  constexpr const char* kCall = "capalloc_torch_end_allocate_to_pool";
  return with_global([&](const GlobalCapalloc& g) -> absl::Status {
    if (absl::Status s = capalloc::detail::check_pool_id(kCall, pool_a, pool_b); !s.ok()) return s;
    auto& tp = capalloc::detail::torch_pools();
    const TorchPoolKey key{device, pool_a, pool_b};
    std::vector<capalloc::CaptureId> ended;
    {
      std::lock_guard lock(tp.mu);
      auto it = tp.pools.find(key);
      if (it == tp.pools.end()) return capalloc::detail::unknown_pool(kCall, key);
      auto& underway = it->second.underway;
      if (underway.empty()) {
        return absl::FailedPreconditionError(absl::StrCat(
            kCall, ": no capture allocates to ", capalloc::detail::describe(key),
            " (an end without a begin, or a second end)"));
      }
      // Ends each route; a capture still active refuses, and the begin stays
      // underway with the routes not yet ended. A route the tracker already
      // ended is ended: the tracker ends the routes of captures it finds over
      // (CaptureTracker::check, the capture-end hook of another pool's end),
      // and that must not leave this begin underway for good.
      auto& captures = underway.front().captures;
      while (!captures.empty()) {
        const capalloc::CaptureId id = captures.front();
        if (absl::Status s = g.allocator->end_allocate_to_pool(id);
            !s.ok() && s.code() != absl::StatusCode::kNotFound) {
          return s;
        }
        captures.erase(captures.begin());
        tp.routed.erase(id);
        ended.push_back(id);
      }
      underway.pop_front();
      capalloc::detail::torch_begin_ended();
    }
    // The routes' end had the tracker inspect the graphs; every capture that
    // ended is recorded by check() at the latest.
    std::vector<capalloc::Finding> mine;
    if (!ended.empty()) {
      for (capalloc::Finding& f : g.tracker->check()) {
        for (capalloc::CaptureId id : ended) {
          if (f.capture == id || f.victim.capture == id) {
            mine.push_back(std::move(f));
            break;
          }
        }
      }
    }
    std::string& json = capalloc::detail::c_json_slot();
    json = capalloc::findings_to_json(mine);
    if (findings_json != nullptr) *findings_json = json.c_str();
    std::size_t refused = 0;
    const capalloc::Finding* first = nullptr;
    for (const capalloc::Finding& f : mine) {
      if (!capalloc::detail::strict_refuses(*g.tracker, f)) continue;
      if (first == nullptr) first = &f;
      ++refused;
    }
    if (first != nullptr) {
      return absl::FailedPreconditionError(absl::StrCat(
          "capalloc strict mode: the capture into ", capalloc::detail::describe(key), " has ",
          refused, refused == 1 ? " finding" : " findings",
          " strict mode refuses (capalloc.check() lists them; capalloc.waive() accepts one "
          "judged benign); the first: ",
          first->summary()));
    }
    return absl::OkStatus();
  });
}

capalloc_status capalloc_torch_release_pool(int device, uint64_t pool_a, uint64_t pool_b) {
  constexpr const char* kCall = "capalloc_torch_release_pool";
  return with_global([&](const GlobalCapalloc& g) -> absl::Status {
    if (absl::Status s = capalloc::detail::check_pool_id(kCall, pool_a, pool_b); !s.ok()) return s;
    auto& tp = capalloc::detail::torch_pools();
    std::lock_guard lock(tp.mu);
    const TorchPoolKey key{device, pool_a, pool_b};
    auto it = tp.pools.find(key);
    if (it == tp.pools.end()) return capalloc::detail::unknown_pool(kCall, key);
    if (it->second.uses > 1) {
      --it->second.uses;
      return absl::OkStatus();
    }
    if (!it->second.underway.empty()) {
      return absl::FailedPreconditionError(absl::StrCat(
          kCall, ": ", capalloc::detail::describe(key),
          " has a capture underway; end it (capalloc_torch_end_allocate_to_pool) first"));
    }
    if (absl::Status s = g.allocator->release_graph_pool(it->second.handle); !s.ok()) return s;
    tp.pools.erase(it);
    return absl::OkStatus();
  });
}

capalloc_status capalloc_torch_pool(int device, uint64_t pool_a, uint64_t pool_b, uint64_t* pool,
                                    int* uses) {
  if (pool == nullptr) return null_argument("capalloc_torch_pool", "pool");
  return with_global([&](const GlobalCapalloc&) -> absl::Status {
    auto& tp = capalloc::detail::torch_pools();
    std::lock_guard lock(tp.mu);
    const TorchPoolKey key{device, pool_a, pool_b};
    auto it = tp.pools.find(key);
    if (it == tp.pools.end()) return capalloc::detail::unknown_pool("capalloc_torch_pool", key);
    *pool = it->second.handle;
    if (uses != nullptr) *uses = it->second.uses;
    return absl::OkStatus();
  });
}

capalloc_status capalloc_get_strict(int* out) {
  if (out == nullptr) return null_argument("capalloc_get_strict", "out");
  return with_global([&](const GlobalCapalloc& g) -> absl::Status {
    *out = g.tracker->strict() ? (g.tracker->strict_possible() ? 2 : 1) : 0;
    return absl::OkStatus();
  });
}

}  // extern "C"
