// allocator/stream_shards.cpp: the allocator's side of the stream shards
// (stream_shards.hpp): folding them in under its lock, dealing allowances
// out when it is released, making and retiring them, and finding their
// blocks on the general path.
#include <algorithm>
#include <new>

#include "absl/strings/str_format.h"

#include "allocator/allocator_impl.hpp"

namespace capalloc {

namespace {

using detail::StreamShard;

// Sequence numbers a shard gets at a time, and the spare blocks it keeps
// (a take splits at most one block; merges give blocks back to it).
constexpr std::uint64_t kSequenceBatch = 4096;
constexpr std::size_t kSpareBlocks = 256;
constexpr std::size_t kMostSpareBlocks = 1024;
// The shares of the room below a pool's peaks that a shard short of room
// gets at a deal, against one for each other shard.
constexpr std::int64_t kShortShares = 3;

// Room times a headroom, both up to 2^63, before the division.
__extension__ using Wide = __int128;

}  // namespace

void Allocator::Impl::fold_shards() noexcept {
  for (const auto& owned : shards) {
    StreamShard& shard = *owned;
    shard.mu.lock();
    if (!shard.in_use) continue;
    detail::PoolBooks& into = shard.pool->books();
    AllocatorStats& delta = shard.books.stats;
    // The allowances kept each current value at or below its peak, so the
    // bump raises no peak.
    const StatCounter* deltas[3] = {&delta.allocated_bytes, &delta.requested_bytes,
                                    &delta.allocated_blocks};
    StatCounter* totals[3] = {&into.stats.allocated_bytes, &into.stats.requested_bytes,
                              &into.stats.allocated_blocks};
    for (std::size_t k = 0; k < 3; ++k) {
      detail::bump(*totals[k], deltas[k]->current);
      StreamShard::Held& held = shard.held[k];
      held.most = std::max(held.most, held.now + deltas[k]->peak);
      held.now += deltas[k]->current;
    }
    into.stats.free_blocks += delta.free_blocks;
    into.stats.pending_free_blocks += delta.pending_free_blocks;
    into.stats.allocations += delta.allocations;
    into.stats.frees += delta.frees;
    into.free_bytes += shard.books.free_bytes;
    delta = AllocatorStats{};
    shard.books.free_bytes = 0;
  }
}

void Allocator::Impl::deal_shards() noexcept {
  // Which shards may serve, and their stream's free indexes as they are now
  // (the general path may have made or dropped some).
  for (const auto& owned : shards) {
    StreamShard& shard = *owned;
    shard.enabled = shard.in_use && observer == nullptr && pending.empty() && deferred.empty() &&
                    !(listener != nullptr && devices[shard.device].routes > 0) &&
                    is_known_stream(shard.stream);
    if (!shard.enabled) continue;
    if (shard.index_generation != shard.pool->index_generation()) {
      shard.index_generation = shard.pool->index_generation();
      for (std::size_t c = 0; c < shard.indexes.size(); ++c) {
        shard.indexes[c] = shard.pool->index_of(shard.stream, static_cast<detail::SizeClass>(c));
      }
    }
    if (shard.next_sequence == shard.end_sequence ||
        (has_checkpoint && shard.next_sequence <= latest_checkpoint)) {
      shard.next_sequence = next_sequence;
      next_sequence += kSequenceBatch;
      shard.end_sequence = next_sequence;
    }
    // Spares from the allocator's arena, and what a shard's merges piled
    // up back to it: blocks move between the shards' arenas and the
    // allocator's (a shard splits a block the general path merges, and the
    // other way round), so an arena of its own would drain or swell.
    try {
      if (shard.spares.spare() < kSpareBlocks) {
        arena.lend(shard.spares, kSpareBlocks - shard.spares.spare());
      }
    } catch (const std::bad_alloc&) {
      // Fewer spares: the shard declines a split it has no block for.
    }
    if (shard.spares.spare() > kMostSpareBlocks) {
      shard.spares.lend(arena, shard.spares.spare() - kSpareBlocks);
    }
  }
  // The room below each pool's peaks, dealt among its shards that may
  // serve so that together they cannot pass a peak: first to each the room
  // up to the most it held (its headroom), then what is left, kShortShares
  // shares to a shard that declined an allocation for want of room since
  // the last deal and one to each other; where the headrooms add up to more
  // than the room, each gets the room in proportion to its headroom.
  for (const auto& owned : shards) {
    StreamShard& shard = *owned;
    if (!shard.enabled) continue;
    const AllocatorStats& stats = shard.pool->stats();
    const StatCounter* totals[3] = {&stats.allocated_bytes, &stats.requested_bytes,
                                    &stats.allocated_blocks};
    std::int64_t* allowances[3] = {&shard.allow_allocated_bytes, &shard.allow_requested_bytes,
                                   &shard.allow_allocated_blocks};
    const std::int64_t mine = shard.short_of_room ? kShortShares : 1;
    for (std::size_t k = 0; k < 3; ++k) {
      auto headroom = [k](const StreamShard& s) {
        return std::max<std::int64_t>(0, s.held[k].most - s.held[k].now);
      };
      std::int64_t headrooms = 0, shares = 0;
      for (const auto& other : shards) {
        if (!other->enabled || other->pool != shard.pool) continue;
        headrooms += headroom(*other);
        shares += other->short_of_room ? kShortShares : 1;
      }
      const std::int64_t room = totals[k]->peak - totals[k]->current;
      std::int64_t dealt;
      if (headrooms <= room) {
        dealt = headroom(shard) + (room - headrooms) / shares * mine;
      } else {
        dealt = static_cast<std::int64_t>(static_cast<Wide>(room) * headroom(shard) / headrooms);
      }
      // Half now; the rest stays in the device's reserve for whichever
      // shard runs short first (RoomReserve::take).
      *allowances[k] = dealt / 2;
    }
  }
  // What is kept back: each device's room less the allowances dealt.
  for (std::size_t d = 0; d < room_reserves.size(); ++d) {
    const AllocatorStats& stats = devices[d].default_pool->stats();
    std::array<std::int64_t, 3> kept = {
        stats.allocated_bytes.peak - stats.allocated_bytes.current,
        stats.requested_bytes.peak - stats.requested_bytes.current,
        stats.allocated_blocks.peak - stats.allocated_blocks.current};
    for (const auto& owned : shards) {
      if (!owned->enabled || owned->device != static_cast<int>(d)) continue;
      kept[0] -= owned->allow_allocated_bytes;
      kept[1] -= owned->allow_requested_bytes;
      kept[2] -= owned->allow_allocated_blocks;
    }
    for (std::size_t k = 0; k < 3; ++k) {
      room_reserves[d]->room[k].store(kept[k], std::memory_order_relaxed);
    }
  }
  for (const auto& owned : shards) owned->short_of_room = false;
  for (const auto& owned : shards) owned->mu.unlock();
}

void Allocator::Impl::maybe_make_shard(int device, StreamHandle stream) noexcept {
  // Not before a second thread has shown itself (here, or by finding the
  // lock taken): one thread gains nothing from shards, and its streams
  // taking turns would pay for them (each general-path call folds and deals
  // every shard; with eight streams in turn on one thread, churn cost 533
  // -> about 1,700 instructions a pair). The thread's identity: its shard
  // hint's address.
  if (!threads_seen) {
    const void* me = &detail::shard_hint;
    if (general_thread != nullptr && general_thread != me) {
      threads_seen = true;
    } else {
      general_thread = me;
      return;
    }
  }
  // Already served, or no slot for it.
  if (shard_slots.find(device, stream) != nullptr || !shard_slots.has_room(device, stream)) return;
  StreamShard* shard = nullptr;
  for (const auto& owned : shards) {
    if (!owned->in_use) {
      shard = owned.get();
      break;
    }
  }
  if (shard == nullptr) {
    if (shards.size() >= kMaxShards) return;
    try {
      while (room_reserves.size() < devices.size()) {
        room_reserves.push_back(std::make_unique<detail::RoomReserve>());
      }
      shards.reserve(shards.size() + 1);
      auto made = std::make_unique<StreamShard>();
      // Held as every shard's is while mu is: deal_shards releases it.
      made->mu.lock();
      shards.push_back(std::move(made));
    } catch (const std::bad_alloc&) {
      return;  // no shard: the stream keeps the one-lock path
    }
    shard = shards.back().get();
    shard_slots.add_made(shard);
    mu.note_sharded();
  }
  shard->device = device;
  shard->stream = stream;
  shard->pool = devices[device].default_pool.get();
  shard->reserve = room_reserves[static_cast<std::size_t>(device)].get();
  shard->in_use = true;
  shard->enabled = false;
  shard->indexes = {};
  shard->index_generation = ~std::uint64_t{0};
  shard->held = {};
  shard->next_sequence = shard->end_sequence = 0;
  shard_slots.publish(device, stream, shard);  // has_room: it cannot fail
}

void Allocator::Impl::retire_shards_of(StreamHandle stream) {
  for (const auto& owned : shards) {
    StreamShard& shard = *owned;
    if (!shard.in_use || shard.stream != stream) continue;
    // Each entry goes to the pointer table before it leaves the shard's:
    // if growing the table throws, every block is still found.
    std::vector<std::uintptr_t> held;
    held.reserve(shard.live.size());
    shard.live.for_each([&](std::uintptr_t addr, detail::Block*) { held.push_back(addr); });
    for (std::uintptr_t addr : held) {
      live.insert(addr, shard.live.find(addr));
      shard.live.erase(addr);
    }
    shard.in_use = false;
    shard.enabled = false;
    shard_slots.withdraw(&shard);
  }
}

detail::Block* Allocator::Impl::find_live(std::uintptr_t addr) const {
  if (detail::Block* block = live.find(addr)) return block;
  for (const auto& shard : shards) {
    if (detail::Block* block = shard->live.find(addr)) return block;
  }
  return nullptr;
}

std::size_t Allocator::Impl::adopt_from_shard(std::uintptr_t addr) {
  for (const auto& shard : shards) {
    const std::size_t in_shard = shard->live.find_slot(addr);
    if (in_shard == detail::BlockTable::kNoSlot) continue;
    live.reserve_one();  // may throw: nothing moved yet
    detail::Block* block = shard->live.block_at(in_shard);
    shard->live.erase_slot(in_shard);
    shard->held[0].now -= static_cast<std::int64_t>(block->size);
    shard->held[1].now -= static_cast<std::int64_t>(block->requested);
    shard->held[2].now -= 1;
    live.insert_reserved(addr, block);
    return live.find_slot(addr);
  }
  return detail::BlockTable::kNoSlot;
}

absl::Status Allocator::Impl::check_shards() const {
  for (std::size_t i = 0; i < shards.size(); ++i) {
    const StreamShard& shard = *shards[i];
    const AllocatorStats& delta = shard.books.stats;
    if (delta.allocated_bytes.current != 0 || delta.requested_bytes.current != 0 ||
        delta.allocated_blocks.current != 0 || delta.free_blocks != 0 ||
        delta.pending_free_blocks != 0 || delta.allocations != 0 || delta.frees != 0 ||
        shard.books.free_bytes != 0) {
      return absl::InternalError(absl::StrFormat("shard %d: deltas left after the fold", i));
    }
    if (!shard.in_use) {
      if (shard.live.size() != 0) {
        return absl::InternalError(
            absl::StrFormat("shard %d is not in use but holds %d blocks", i, shard.live.size()));
      }
      continue;
    }
    if (!shard_slots.publishes(shard.device, shard.stream, &shard)) {
      return absl::InternalError(absl::StrFormat(
          "shard %d (device %d, stream 0x%x) is not in its key's slot", i, shard.device,
          shard.stream));
    }
    if (shard.device < 0 || static_cast<std::size_t>(shard.device) >= devices.size() ||
        shard.pool != devices[shard.device].default_pool.get()) {
      return absl::InternalError(
          absl::StrFormat("shard %d does not serve device %d's default pool", i, shard.device));
    }
    absl::Status bad;
    shard.live.for_each([&](std::uintptr_t addr, const detail::Block* b) {
      if (!bad.ok()) return;
      const detail::Segment& segment = *b->segment;
      if (b->addr != addr || b->state != BlockState::kAllocated || !b->handed_out ||
          segment.pool != shard.pool || segment.stream != shard.stream ||
          live.find(addr) != nullptr) {
        bad = absl::InternalError(absl::StrFormat(
            "shard %d (stream 0x%x) holds block 0x%x, which is not an allocated block of its "
            "stream's segments, or is in the pointer table too",
            i, shard.stream, addr));
      }
    });
    if (!bad.ok()) return bad;
  }
  return absl::OkStatus();
}

std::size_t Allocator::Impl::live_count() const {
  std::size_t count = live.size();
  for (const auto& shard : shards) count += shard->live.size();
  return count;
}

}  // namespace capalloc
