// allocator/steady_state.hpp: the steady-state allocation and free
// (Allocator::Impl::allocate_cached, allocate_cached_locked, free_cached,
// free_cached_locked), defined here, inline, for their callers:
// allocator.cpp (Allocator::allocate and deallocate, Impl::deallocate) and
// c_api.cpp (capalloc_torch_malloc and _free).
//
// Why a header: the torch entry points are a few instructions around this
// path. Called out of line, each paid a frame of its own (six registers
// saved and restored to keep its arguments for the general path) besides
// the path's: 36 instructions per allocation+free pair on small-block churn
// (callgrind, 600 -> 564). Inlined, the exported function and the path share one frame, and
// what the C ABI adds is its own checks (size 0, the allocator found, the
// thread's last error). Include it only where these are called.
#ifndef CAPALLOC_ALLOCATOR_STEADY_STATE_HPP_
#define CAPALLOC_ALLOCATOR_STEADY_STATE_HPP_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <mutex>

#include "allocator/allocator_impl.hpp"

namespace capalloc {

// Inline into allocate_cached and Impl::allocate, its two callers: it is
// most of the steady-state allocation.
[[gnu::always_inline]] inline void* Allocator::Impl::allocate_cached_locked(
    std::size_t bytes, std::size_t rounded, int device, StreamHandle stream) {
  // A stream checked before and not reported destroyed since (the last
  // test rules out a report not yet applied), of the allocation's device:
  // the default stream or one of the last two checked, by comparison, else
  // any other known one (recall_known_stream). A stream never checked, or
  // of another device, takes the general path, which checks it.
  if ((!recent_stream_on(stream, device) && !recall_known_stream(stream, device)) ||
      !pending.empty() || !deferred.empty() || gone_graphs->any.load(std::memory_order_acquire) ||
      gone_streams->any.load(std::memory_order_acquire)) {
    return nullptr;
  }
  // The quick cache first, then the free index (a miss here is cheaper
  // than the general path's: no second capture check, no second lock).
  // Room in the pointer table first: growing it may throw, and must not
  // after a block has left the pool.
  live.reserve_one();
  detail::Pool& pool = *devices[device].default_pool;
  // Only an observer can fail past the take; its undo needs the peaks.
  detail::Pool::AllocationPeaks peaks;
  if (observer != nullptr) [[unlikely]] peaks = pool.allocation_peaks();
  detail::Block* block = pool.take_cached(stream, rounded, bytes);
  if (block == nullptr) block = pool.take_indexed(stream, rounded, bytes);
  if (block == nullptr) return nullptr;
  // The per-allocation fields were reset when the block was freed (or
  // made by a split), whether it was cached or filed in the index.
  block->sequence = next_sequence++;
  live.insert_reserved(block->addr, block);
  if (observer != nullptr) observe_allocation(pool, block, peaks);
  block->handed_out = true;
  return reinterpret_cast<void*>(block->addr);
}

[[gnu::always_inline]] inline void* Allocator::Impl::allocate_cached(std::size_t bytes, int device,
                                                                     StreamHandle stream) {
  // Any size the pool may hold: the quick cache serves small ones, the free
  // index the rest. 0 and implausible sizes (allocate() says why) and
  // unknown devices take the general path.
  if (bytes - 1 >= std::numeric_limits<std::size_t>::max() / 2 ||
      static_cast<std::size_t>(device) >= devices.size()) {
    return nullptr;
  }
  if (runtime->any_capture_active(device)) {
    auto info = runtime->capture_info(stream);
    if (!info.ok() || info->status != CaptureStatus::kNone) return nullptr;
  }
  const std::size_t rounded = (bytes + policy.granularity - 1) & ~(policy.granularity - 1);
  std::lock_guard lock(mu);
  return allocate_cached_locked(bytes, rounded, device, stream);
}

// Inline into free_cached and Impl::deallocate (allocator.cpp), its two
// callers: Impl::deallocate tries it under its own lock, with its own
// pointer-table lookup, so that a block it declines (every capture block)
// costs one lock and one lookup, not two of each.
[[gnu::always_inline]] inline bool Allocator::Impl::free_cached_locked(std::size_t slot,
                                                                      int device) {
  detail::Block* block = live.block_at(slot);
  const detail::Segment& segment = *block->segment;
  detail::Pool& pool = *segment.pool;
  if ((device != kAnyDevice && device != segment.device) || block->owner_id != 0 ||
      block->capture != 0 || !block->used_on.empty() || pool.is_graph_pool() ||
      (listener != nullptr && devices[segment.device].routes > 0) ||
      (!recent_stream(segment.stream) && !is_known_stream(segment.stream))) {
    return false;
  }
  live.erase_slot(slot);
  const std::uint64_t sequence = block->sequence;
  // Past the cache's share (or too large for it), the block merges into the
  // free index at once, as Impl::free_block would do with it, under this
  // lock: the general path would take the lock and find the block again.
  if (pool.caches_freed(*block)) {
    pool.cache_freed(block);
  } else {
    pool.give_back(block);
  }
  if (observer != nullptr) observer->on_free(sequence);
  return true;
}

[[gnu::always_inline]] inline bool Allocator::Impl::free_cached(void* ptr, int device) {
  const auto addr = reinterpret_cast<std::uintptr_t>(ptr);
  if (addr == 0) return false;  // 0 marks an empty slot of the table
  std::lock_guard lock(mu);
  if (gone_graphs->any.load(std::memory_order_acquire) ||
      gone_streams->any.load(std::memory_order_acquire)) {
    return false;
  }
  const std::size_t slot = live.find_slot(addr);
  return slot != detail::BlockTable::kNoSlot && free_cached_locked(slot, device);
}

}  // namespace capalloc

#endif  // CAPALLOC_ALLOCATOR_STEADY_STATE_HPP_
