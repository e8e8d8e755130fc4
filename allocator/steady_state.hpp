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
  // Threads share the allocator: the stream's next requests may go to a
  // shard (a stream in steady state may never come to the general path).
  if (threads_seen) [[unlikely]] maybe_make_shard(device, stream);
  return reinterpret_cast<void*>(block->addr);
}

inline void* Allocator::Impl::allocate_in_shard(detail::StreamShard& shard, int device,
                                                StreamHandle stream, std::size_t bytes,
                                                std::size_t rounded) {
  // The key again (the shard may have been retired and reused since its
  // slot was read), then what the general path must handle: reports from
  // other threads, no room below a peak, no sequence number or spare block.
  if (!shard.enabled || shard.stream != stream || shard.device != device ||
      gone_graphs->any.load(std::memory_order_acquire) ||
      gone_streams->any.load(std::memory_order_acquire)) {
    return nullptr;
  }
  detail::FreeIndex* index = shard.indexes[static_cast<std::size_t>(policy.class_of(rounded))];
  // Room below the peaks: the request's bytes and one block are known
  // now; the block's size (a quick-cache hit may be up to 1/4 larger than
  // `rounded`) only once it is taken, which is undone if it passes.
  // Short of room, the shard first takes some of what the last deal kept
  // back (RoomReserve), else declines.
  AllocatorStats& delta = shard.books.stats;
  const std::int64_t requested_short =
      delta.requested_bytes.current + static_cast<std::int64_t>(bytes) -
      shard.allow_requested_bytes;
  const std::int64_t blocks_short =
      delta.allocated_blocks.current + 1 - shard.allow_allocated_blocks;
  if ((requested_short > 0 &&
       !shard.reserve->take(1, requested_short, shard.allow_requested_bytes)) ||
      (blocks_short > 0 && !shard.reserve->take(2, blocks_short, shard.allow_allocated_blocks))) {
    shard.short_of_room = true;  // a larger share at the next deal
    return nullptr;
  }
  if (index == nullptr || shard.next_sequence == shard.end_sequence ||
      !shard.spares.has_spare()) {
    return nullptr;
  }
  shard.live.reserve_one();  // may throw: before a block leaves the pool
  detail::Pool& pool = *shard.pool;
  detail::Block* block = pool.take_cached_from(*index, rounded, bytes, shard.books);
  if (block == nullptr) block = pool.take_indexed_from(*index, rounded, bytes, shard.books);
  if (block == nullptr) return nullptr;
  if (const std::int64_t bytes_short = delta.allocated_bytes.current - shard.allow_allocated_bytes;
      bytes_short > 0 && !shard.reserve->take(0, bytes_short, shard.allow_allocated_bytes))
      [[unlikely]] {
    // Back into the index (merged), neither the allocation nor the free
    // counted: the general path takes the request and raises the peak.
    pool.give_back(block, shard.books);
    --delta.allocations;
    --delta.frees;
    shard.short_of_room = true;
    return nullptr;
  }
  block->sequence = shard.next_sequence++;
  shard.live.insert_reserved(block->addr, block);
  block->handed_out = true;
  return reinterpret_cast<void*>(block->addr);
}

inline bool Allocator::Impl::free_in_shard(detail::StreamShard& shard, std::uintptr_t addr,
                                           int device) {
  if (!shard.enabled || gone_graphs->any.load(std::memory_order_acquire) ||
      gone_streams->any.load(std::memory_order_acquire)) {
    return false;
  }
  const std::size_t slot = shard.live.find_slot(addr);
  if (slot == detail::BlockTable::kNoSlot) return false;
  detail::Block* block = shard.live.block_at(slot);
  // Used on other streams (record_stream, under the allocator's lock): its
  // free waits on their events, which the general path records.
  if ((device != kAnyDevice && device != shard.device) || !block->used_on.empty()) return false;
  shard.live.erase_slot(slot);
  detail::Pool& pool = *shard.pool;
  if (pool.caches_freed(*block)) {
    pool.cache_freed(block, shard.books);
  } else {
    pool.give_back(block, shard.books);
  }
  return true;
}

inline bool Allocator::Impl::free_in_any_shard(std::uintptr_t addr, int device,
                                               detail::StreamShard* first) {
  if (first != nullptr) {
    std::lock_guard lock(first->mu);
    if (free_in_shard(*first, addr, device)) return true;
  }
  const std::size_t made = shard_slots.made();
  for (std::size_t i = 0; i < made; ++i) {
    detail::StreamShard* shard = shard_slots.made(i);
    if (shard == first) continue;
    std::lock_guard lock(shard->mu);
    if (free_in_shard(*shard, addr, device)) return true;
  }
  return false;
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
  if (detail::StreamShard* shard = shard_for(device, stream)) {
    std::lock_guard lock(shard->mu);
    if (void* p = allocate_in_shard(*shard, device, stream, bytes, rounded)) return p;
  }
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

[[gnu::always_inline]] inline bool Allocator::Impl::free_cached(void* ptr, int device,
                                                                 StreamHandle stream) {
  const auto addr = reinterpret_cast<std::uintptr_t>(ptr);
  if (addr == 0) return false;  // 0 marks an empty slot of the table
  // The named stream's shard first (PyTorch names the allocation's), then
  // the others: a caller may name another stream than the allocation's.
  // One load while no shard exists.
  if (shard_slots.made() != 0 &&
      free_in_any_shard(addr, device, shard_slots.find_made(device, stream))) {
    return true;
  }
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
