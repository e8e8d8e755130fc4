// allocator/graph_pools.cpp: graph pools and capture routes.
//
// A graph pool holds the blocks of one or more captures. It lives while it
// has references (the creator's handle, each capture route into it, each
// graph a tracker keeps) or live blocks; then its segments go back to the
// runtime. A pool with references keeps even its free segments: a graph that
// may still replay writes into them, so handing them back to the device
// (where anything could land) would spread the graph's writes further. The
// one exception: with a tracker listening, a pool that no graph and no
// capture holds gives back a destroyed stream's segments on empty_cache
// (no capture takes them again).
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "allocator/allocator_impl.hpp"
#include "common/log.hpp"

namespace capalloc {

using detail::Pool;

absl::StatusOr<Pool*> Allocator::Impl::find_graph_pool(PoolHandle handle) const {
  auto it = pool_devices.find(handle);
  if (it == pool_devices.end()) {
    return absl::NotFoundError(absl::StrFormat(
        "graph pool %d does not exist (never created, or destroyed after its last reference "
        "and block were gone)",
        handle));
  }
  return devices[it->second].graph_pools.at(handle).get();
}

Pool* Allocator::Impl::route_for_slow(int device, CaptureId capture, StreamHandle stream) {
  auto it = routes.find(capture);
  if (it != routes.end() && it->second.pool->device() != device) return nullptr;
  if (it != routes.end()) {
    // An announced capture (PyTorch's): its graph is watched too, from its
    // first allocation, so that the tracker drops its record (and the memory
    // the record keeps mapped) once the graph is gone.
    if (!it->second.watched) {
      it->second.watched = true;
      it->second.stream = stream;
      watch_graph(capture, stream, it->second.pool->handle(), /*holds_pool_ref=*/false);
    }
    last_route_capture = capture;
    last_route_pool = it->second.pool;
    return it->second.pool;
  }
  // A capture nobody announced (a host application capturing through the
  // native API): a private pool, with a reference for the graph until the
  // runtime says the graph is gone.
  const PoolHandle handle = next_pool++;
  auto pool = std::make_unique<Pool>(device, handle, policy, arena);
  Pool* raw = pool.get();
  raw->route_refs = 1;
  raw->graph_holds.insert(capture);  // the unknown graph's, until it is gone
  devices[device].graph_pools.emplace(handle, std::move(pool));
  pool_devices.emplace(handle, device);
  routes.emplace(capture,
                 detail::CaptureRoute{device, raw, stream, /*announced=*/false, /*watched=*/true});
  ++devices[device].routes;
  routed_captures.fetch_add(1, std::memory_order_relaxed);
  detail::log().info("capture {} on device {} was not announced; its allocations go to private "
                     "graph pool {}",
                     capture, device, handle);
  // The runtime says when the capture's graph is gone (or that the capture
  // failed): then the graph's reference goes (apply_gone_graphs).
  watch_graph(capture, stream, handle, /*holds_pool_ref=*/true);
  return raw;
}

bool Allocator::Impl::watch_graph(CaptureId capture, StreamHandle stream, PoolHandle pool,
                                  bool holds_pool_ref) {
  // The watcher only queues; it may run inside the runtime, on any thread.
  std::weak_ptr<detail::GoneGraphs> weak = gone_graphs;
  const absl::Status watching = runtime->watch_capture_graph(stream, [weak, capture] {
    if (auto gone = weak.lock()) {
      std::lock_guard lock(gone->mu);
      gone->captures.push_back(capture);
      gone->any.store(true, std::memory_order_release);
    }
  });
  if (watching.ok()) {
    watched_graphs.emplace(capture, detail::WatchedGraph{pool, holds_pool_ref});
    return true;
  }
  if (!unwatchable_logged) {
    unwatchable_logged = true;
    detail::log().info("graph pools of captures capalloc did not begin are kept for the life of "
                       "the allocator: {}",
                       watching.ToString());
  }
  return false;
}

void Allocator::Impl::apply_gone_graphs() {
  if (!gone_graphs->any.load(std::memory_order_acquire)) return;
  std::vector<CaptureId> captures;
  {
    std::lock_guard lock(gone_graphs->mu);
    captures.swap(gone_graphs->captures);
    gone_graphs->any.store(false, std::memory_order_relaxed);
  }
  for (CaptureId capture : captures) {
    auto it = watched_graphs.find(capture);
    if (it == watched_graphs.end()) continue;
    const detail::WatchedGraph watched = it->second;
    watched_graphs.erase(it);
    // The listener first: the graph's record stops keeping its memory
    // mapped (graph_uses), so that the pool can go below.
    if (listener != nullptr) listener->on_capture_graph_gone(capture);
    // No graph means no capture: its route, if not yet seen to end, ends now.
    if (auto route = routes.find(capture); route != routes.end() && !route->second.announced) {
      drop_route(capture);
    }
    if (auto pool = find_graph_pool(watched.pool);
        watched.holds_pool_ref && pool.ok() && (*pool)->graph_holds.erase(capture) == 1) {
      maybe_destroy_pool(*pool);
    }
  }
}

void Allocator::apply_graph_lifetimes() {
  std::lock_guard lock(impl_->mu);
  impl_->apply_gone_graphs();
}

CaptureId Allocator::Impl::active_capture_on(int device) {
  // Routes of discovered captures end lazily: when their stream is no longer
  // in that capture.
  std::vector<CaptureId> over;
  CaptureId active = 0;
  for (const auto& [id, route] : routes) {
    if (route.device != device) continue;
    auto info = runtime->capture_info(route.stream);
    const bool still = info.ok() && info->status != CaptureStatus::kNone && info->id == id;
    if (still) {
      if (active == 0) active = id;
    } else if (!route.announced) {
      over.push_back(id);
    } else if (active == 0) {
      active = id;  // announced: the tracker ends it; until then it counts
    }
  }
  for (CaptureId id : over) drop_route(id);
  return active;
}

void Allocator::Impl::drop_route(CaptureId capture) {
  if (capture == last_route_capture) {
    last_route_capture = 0;
    last_route_pool = nullptr;
  }
  auto it = routes.find(capture);
  if (it == routes.end()) return;
  Pool* pool = it->second.pool;
  --devices[it->second.device].routes;
  routed_captures.fetch_sub(1, std::memory_order_relaxed);
  routes.erase(it);
  --pool->route_refs;
  maybe_destroy_pool(pool);
}

void Allocator::Impl::destroy_unused_pool(Pool* pool) {
  const int device = pool->device();
  const PoolHandle handle = pool->handle();
  // Not while a capture is routed on the device: a graph launched into it
  // may write this pool's memory, and the capture's record, which keeps
  // such memory mapped (graph_uses), exists only once it ends. Freeing
  // device memory during a capture is illegal on CUDA besides. The pool
  // waits, fully free, for release_free_segments (empty_cache). (A capture
  // that has not allocated is not routed, and a GPU runtime cannot tell the
  // allocator of one cheaply: any_capture_active is always true there.)
  if (devices[device].routes > 0 && !pool->segments().empty()) {
    pool->kept_for_segments = true;
    return;
  }
  if (absl::Status s = release_segments(device, *pool); !s.ok()) {
    detail::log().error("releasing graph pool {}: {}", handle, s.ToString());
  }
  // Memory a live graph's record still names stays, and with it the pool;
  // empty_cache retries once those graphs are gone. So does a segment the
  // runtime failed to release (empty_cache and the destructor retry it).
  if (!pool->segments().empty()) {
    pool->kept_for_segments = true;
    return;
  }
  const AllocatorStats& gone = pool->stats();
  AllocatorStats& retired = devices[device].retired_pools;
  retired.allocated_bytes.peak += gone.allocated_bytes.peak;
  retired.requested_bytes.peak += gone.requested_bytes.peak;
  retired.reserved_bytes.peak += gone.reserved_bytes.peak;
  retired.segments.peak += gone.segments.peak;
  retired.allocated_blocks.peak += gone.allocated_blocks.peak;
  retired.allocations += gone.allocations;
  retired.frees += gone.frees;
  retired.retries += gone.retries;
  retired.ooms += gone.ooms;
  pool_devices.erase(handle);
  devices[device].graph_pools.erase(handle);
}

absl::Status Allocator::Impl::release_segments(int device, Pool& pool,
                                               std::optional<StreamHandle> only_stream,
                                               std::optional<detail::SizeClass> only_class) {
  std::vector<detail::SegmentRange> ranges;
  absl::Status first_error;
  pool.take_free_segments(ranges, only_stream, only_class, [&](const detail::SegmentRange& r) {
    // A segment that a live graph's record reads or writes stays mapped
    // until that graph is destroyed: a replay would touch unmapped memory.
    if (listener != nullptr && listener->graph_uses(device, MemorySpan{r.base, r.bytes})) {
      return true;
    }
    // Released before the pool forgets it: a segment the runtime fails to
    // release is still reserved (a failed cudaFree frees nothing), so it
    // stays in the pool, fully free and counted, and the next release
    // (empty_cache, the pool's destruction, the allocator's destructor)
    // tries again.
    absl::Status s = runtime->release(device, r.base, r.bytes);
    if (!s.ok()) {
      detail::log().error("releasing segment {} of {} bytes failed (kept, to be released "
                          "again): {}",
                          r.base, r.bytes, s.ToString());
      first_error.Update(s);
      return true;
    }
    return false;
  });
  for (const auto& range : ranges) {
    devices[device].segments.erase(reinterpret_cast<std::uintptr_t>(range.base));
  }
  return first_error;
}

absl::Status Allocator::Impl::release_free_segments(int device) {
  // Nothing goes back while a capture is routed on the device (in progress,
  // or ended and awaiting its capture-end hook): what its graph uses is not
  // recorded yet, and freeing device memory during a capture is illegal on
  // CUDA anyway. Routes of discovered captures that are over end first.
  active_capture_on(device);
  if (devices[device].routes > 0) {
    detail::log().debug("device {}: cached memory kept: a capture is routed on it", device);
    return absl::OkStatus();
  }
  detail::DeviceState& state = devices[device];
  absl::Status result = release_segments(device, *state.default_pool);
  std::vector<Pool*> unreferenced;
  for (auto& [handle, pool] : state.graph_pools) {
    if (!pool->referenced()) {
      unreferenced.push_back(pool.get());
    } else if (listener != nullptr && pool->graph_holds.empty() && pool->route_refs == 0) {
      // Held by handles alone, with a tracker listening: it holds the pool
      // for every graph it keeps, so none replays into it, and no capture
      // allocates from it now (and release_segments still keeps what a
      // live graph's record names). Its free segments stay for the next
      // capture, except orphans (a destroyed stream's), which no capture
      // ever takes: kept, a pool captured into on short-lived streams would
      // grow by a capture's footprint per stream, for good. Without a
      // tracker nothing says which graphs replay into the pool (a caller's
      // handle may stand for them, as PyTorch's pool handles do): kept.
      result.Update(release_segments(device, *pool, kNoStream));
    }
  }
  for (Pool* pool : unreferenced) {
    result.Update(release_segments(device, *pool));
    maybe_destroy_pool(pool);  // one whose graphs kept memory goes once that is released
  }
  return result;
}

// --- Public API ---------------------------------------------------------------

absl::StatusOr<PoolHandle> Allocator::create_graph_pool(int device) {
  Impl& m = *impl_;
  if (absl::Status s = m.check_device(device); !s.ok()) return s;
  std::lock_guard lock(m.mu);
  const PoolHandle handle = m.next_pool++;
  auto pool = std::make_unique<Pool>(device, handle, m.policy, m.arena);
  pool->handle_refs = 1;
  m.devices[device].graph_pools.emplace(handle, std::move(pool));
  m.pool_devices.emplace(handle, device);
  return handle;
}

absl::StatusOr<Pool*> Allocator::Impl::find_handle_pool(PoolHandle handle,
                                                         std::string_view call) const {
  auto pool = find_graph_pool(handle);
  if (!pool.ok()) return absl::NotFoundError(absl::StrCat(std::string(call), ": ", std::string(pool.status().message())));
  if ((*pool)->handle_refs == 0) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "%s: every handle to graph pool %d was released (release_graph_pool); the pool lives on "
        "only for the captures and graphs that still use it, which hold references of their "
        "own. Create a new pool",
        call, handle));
  }
  return *pool;
}

absl::Status Allocator::retain_graph_pool(PoolHandle handle) {
  Impl& m = *impl_;
  std::lock_guard lock(m.mu);
  auto pool = m.find_handle_pool(handle, "retain_graph_pool");
  if (!pool.ok()) return pool.status();
  ++(*pool)->handle_refs;
  return absl::OkStatus();
}

absl::Status Allocator::release_graph_pool(PoolHandle handle) {
  Impl& m = *impl_;
  std::lock_guard lock(m.mu);
  auto pool = m.find_handle_pool(handle, "release_graph_pool");
  if (!pool.ok()) return pool.status();
  --(*pool)->handle_refs;
  m.maybe_destroy_pool(*pool);
  return absl::OkStatus();
}

absl::Status Allocator::hold_graph_pool(PoolHandle handle, CaptureId capture) {
  Impl& m = *impl_;
  if (capture == 0) return absl::InvalidArgumentError("hold_graph_pool: capture id 0");
  std::lock_guard lock(m.mu);
  auto pool = m.find_handle_pool(handle, "hold_graph_pool");
  if (!pool.ok()) return pool.status();
  if (!(*pool)->graph_holds.insert(capture).second) {
    return absl::AlreadyExistsError(absl::StrFormat(
        "hold_graph_pool: the graph of capture %d already holds graph pool %d", capture, handle));
  }
  return absl::OkStatus();
}

absl::Status Allocator::drop_graph_pool_hold(PoolHandle handle, CaptureId capture) {
  Impl& m = *impl_;
  std::lock_guard lock(m.mu);
  m.apply_gone_graphs();
  auto pool = m.find_graph_pool(handle);
  if (!pool.ok()) return pool.status();
  if (!(*pool)->graph_holds.contains(capture)) {
    return absl::NotFoundError(absl::StrFormat(
        "drop_graph_pool_hold: the graph of capture %d holds no reference on graph pool %d",
        capture, handle));
  }
  // A graph destroyed by its handle may live on: launched into a capture,
  // its nodes are part of that capture's graph, and a replay in flight still
  // runs them. Where the runtime watches the graph and has not reported it
  // gone, the reference goes when it does (apply_gone_graphs).
  if (auto watched = m.watched_graphs.find(capture);
      watched != m.watched_graphs.end() && watched->second.pool == handle) {
    watched->second.holds_pool_ref = true;
    return absl::OkStatus();
  }
  (*pool)->graph_holds.erase(capture);
  m.maybe_destroy_pool(*pool);
  return absl::OkStatus();
}

absl::Status Allocator::begin_allocate_to_pool(int device, CaptureId capture, PoolHandle handle,
                                               StreamHandle stream) {
  Impl& m = *impl_;
  if (absl::Status s = m.check_device(device); !s.ok()) return s;
  if (capture == 0) return absl::InvalidArgumentError("begin_allocate_to_pool: capture id 0");
  std::lock_guard lock(m.mu);
  auto pool = m.find_handle_pool(handle, "begin_allocate_to_pool");
  if (!pool.ok()) return pool.status();
  if ((*pool)->device() != device) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "begin_allocate_to_pool: graph pool %d is on device %d, not %d", handle,
        (*pool)->device(), device));
  }
  if (m.routes.contains(capture)) {
    return absl::AlreadyExistsError(absl::StrFormat(
        "begin_allocate_to_pool: capture %d already allocates to a pool", capture));
  }
  // The capturing stream, when named, must run on the pool's device (where
  // the runtime can tell: MemoryRuntime::stream_device).
  if (stream != kDefaultStream) {
    if (auto on = m.runtime->stream_device(stream); on.ok() && *on != device) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "begin_allocate_to_pool: stream 0x%x runs on device %d, not device %d (graph pool %d's)",
          stream, *on, device, handle));
    }
  }
  ++(*pool)->route_refs;
  detail::CaptureRoute& route =
      m.routes.emplace(capture, detail::CaptureRoute{device, *pool, kDefaultStream, true})
          .first->second;
  ++m.devices[device].routes;
  m.routed_captures.fetch_add(1, std::memory_order_relaxed);
  if (stream != kDefaultStream) {
    // A hold taken for the graph (a tracker's, hold_graph_pool) goes when
    // the runtime reports the graph gone, however it went.
    route.watched = true;
    route.stream = stream;
    m.watch_graph(capture, stream, handle,
                  /*holds_pool_ref=*/(*pool)->graph_holds.contains(capture));
  }
  return absl::OkStatus();
}

absl::Status Allocator::end_allocate_to_pool(CaptureId capture) {
  Impl& m = *impl_;
  CaptureListener* listener = nullptr;
  {
    std::lock_guard lock(m.mu);
    const auto route = m.routes.find(capture);
    if (route == m.routes.end()) {
      return absl::NotFoundError(
          absl::StrFormat("end_allocate_to_pool: capture %d has no pool route", capture));
    }
    // The capture-end hook comes after the capture's end: its graph is then
    // complete, and inspecting it earlier would see part of it.
    if (route->second.watched) {
      auto info = m.runtime->capture_info(route->second.stream);
      if (info.ok() && info->status != CaptureStatus::kNone && info->id == capture) {
        return absl::FailedPreconditionError(absl::StrFormat(
            "end_allocate_to_pool: capture %d is still active on stream 0x%x; end the capture "
            "first (the route stays)",
            capture, route->second.stream));
      }
    }
    m.drop_route(capture);
    if (!m.deferred.empty() || !m.pending.empty()) m.process_pending();
    listener = m.listener;
  }
  if (listener != nullptr) listener->on_capture_pool_end(capture);
  return absl::OkStatus();
}

absl::StatusOr<AllocatorStats> Allocator::pool_stats(PoolHandle handle) const {
  const Impl& m = *impl_;
  std::lock_guard lock(m.mu);
  if (handle == kDefaultPool) {
    return absl::InvalidArgumentError(
        "pool_stats: the default pool has no handle; use stats(device) for a device's total");
  }
  auto pool = m.find_graph_pool(handle);
  if (!pool.ok()) return pool.status();
  return (*pool)->stats();
}

}  // namespace capalloc
