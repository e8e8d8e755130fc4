// allocator/stream_shards.hpp: a shard of a device's default pool for one
// stream, so that threads allocating on different streams do not take turns
// on the allocator's lock (docs/design.md, "The lock").
//
// A stream's segments, free indexes and quick caches are its own already:
// what two streams shared on the steady-state path was the lock, the pointer
// table, the pool's counters, the sequence counter and the Block arena. A
// shard holds, under a lock of its own, what its steady-state allocations and
// frees change:
//  - books: the pool's counters as deltas, and an arena of Block objects
//    lent by the allocator's (PoolBooks);
//  - live: a pointer table of the blocks it handed out and that are still
//    allocated;
//  - a batch of sequence numbers;
//  - what it may add to the pool's allocated bytes, requested bytes and
//    allocated blocks without passing their peaks (allowances).
//
// The allocator's lock (Allocator::Impl::GeneralLock) takes every shard's
// lock after its own and folds each shard's deltas into its pool, so that
// whatever runs under it sees the whole state, exact, and may change any of
// it; releasing it deals out fresh allowances, sequence numbers and spare
// blocks, and decides whether each shard may serve at all (`enabled`), then
// lets the shards go. A peak is never passed without the allocator's lock:
// the allowances of a pool's shards add up to the room below its peaks, so
// an allocation that would pass one declines to the general path, which
// raises the peak exactly. The general path finds a block of a shard's
// table by searching the shards (Allocator::Impl::find_live).
//
// A shard serves one (device, stream) of a default pool; a thread finds it
// without a lock through ShardSlots (its key published beside one of a
// few slots from the key's hash; checked again under the shard's lock,
// since a shard may be retired and reused).
#ifndef CAPALLOC_ALLOCATOR_STREAM_SHARDS_HPP_
#define CAPALLOC_ALLOCATOR_STREAM_SHARDS_HPP_

#include <algorithm>
#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>

#include "allocator/block.hpp"
#include "allocator/block_table.hpp"
#include "allocator/pool.hpp"
#include "common/fibonacci_hash.hpp"
#include "common/futex_mutex.hpp"

namespace capalloc::detail {

// Room below a device's default pool's peaks that the last deal kept
// back from the shards' allowances (allocated bytes, requested bytes,
// allocated blocks): a shard short of room takes some with a
// compare-and-swap, under its own lock alone, instead of the allocator's
// lock. Set only under the allocator's lock (every shard's held).
struct RoomReserve {
  alignas(64) std::array<std::atomic<std::int64_t>, 3> room{};

  // Moves at least `need` (and up to a quarter of what is kept, if more)
  // into `allowance`; false, nothing moved, when less than `need` is kept.
  bool take(std::size_t k, std::int64_t need, std::int64_t& allowance) {
    std::int64_t kept = room[k].load(std::memory_order_relaxed);
    while (kept >= need) {
      const std::int64_t taking = std::max(need, kept / 4);
      if (room[k].compare_exchange_weak(kept, kept - taking, std::memory_order_relaxed)) {
        allowance += taking;
        return true;
      }
    }
    return false;
  }
};

struct StreamShard {
  // On a cache line of its own: the one line the shard's thread and the
  // allocator's lock both write.
  alignas(64) FutexMutex mu;
  // What follows is written with both this shard's lock and the allocator's
  // held, and read with either.
  alignas(64) int device = 0;
  StreamHandle stream = kDefaultStream;
  Pool* pool = nullptr;  // the device's default pool
  RoomReserve* reserve = nullptr;  // the device's
  bool in_use = false;   // serves (device, stream); else free for reuse
  // The steady-state path may use the shard: nothing the general path must
  // see is set (an observer, pending frees, a listener with a capture routed
  // on the device), the stream is known, and there is a sequence number
  // and a spare block to hand out.
  bool enabled = false;
  // The pool's free indexes of the stream, by SizeClass; null where there is
  // none yet (the general path makes it with the stream's first segment of
  // the class).
  std::array<FreeIndex*, 3> indexes{};
  // The pool's index_generation() when `indexes` were found; ~0: never.
  std::uint64_t index_generation = ~std::uint64_t{0};
  // Room below the pool's peaks, against books.stats' deltas.
  std::int64_t allow_allocated_bytes = 0;
  std::int64_t allow_requested_bytes = 0;
  std::int64_t allow_allocated_blocks = 0;
  // An allocation declined for want of room since the last deal: the
  // shard's share of the room is larger at the next.
  bool short_of_room = false;
  // What the shard's allocations hold (allocated bytes, requested bytes,
  // allocated blocks: net of its frees and of the blocks the general path
  // took from its table), as of the last fold, and the most they held at
  // once. The dealer gives each shard the room up to its own most first:
  // two streams that each keep near their own most leave a pool near its
  // peak, and an even split would send one of them to the general path at
  // every step up.
  struct Held {
    std::int64_t now = 0;
    std::int64_t most = 0;
  };
  std::array<Held, 3> held{};
  // The sequence numbers [next_sequence, end_sequence) are this shard's.
  std::uint64_t next_sequence = 0;
  std::uint64_t end_sequence = 0;
  PoolBooks books;  // deltas since the last fold; its arena is `spares`
  BlockArena spares;
  BlockTable live;

  StreamShard() { books.arena = &spares; }
  StreamShard(const StreamShard&) = delete;
  StreamShard& operator=(const StreamShard&) = delete;
};

// The shards by (device, stream), read without a lock: a shard sits in
// one of kProbe slots from its key's hash, and publishes its key beside the
// slot, so that a lookup compares keys without taking locks; the key is
// checked again under the shard's lock, which alone makes it the shard's
// (a shard may be retired and reused meanwhile). A key whose kProbe slots
// are all taken gets no shard and keeps the one-lock path.
class ShardSlots {
 public:
  static constexpr std::size_t kMaxShards = 16;
  static constexpr int kBits = 6;
  static constexpr std::size_t kSlots = std::size_t{1} << kBits;
  static constexpr std::size_t kProbe = 8;

  static std::size_t home(int device, StreamHandle stream) {
    return fibonacci_slot(static_cast<std::uint64_t>(stream) ^
                              (static_cast<std::uint64_t>(device) << 56),
                          64 - kBits);
  }
  // The shard published for (device, stream), or null.
  StreamShard* find(int device, StreamHandle stream) const {
    return made() == 0 ? nullptr : find_made(device, stream);  // one load while there is none
  }
  // find() once some shard is known to exist.
  StreamShard* find_made(int device, StreamHandle stream) const {
    const std::size_t h = home(device, stream);
    for (std::size_t i = 0; i < kProbe; ++i) {
      const Slot& slot = slots_[(h + i) & (kSlots - 1)];
      if (slot.stream.load(std::memory_order_acquire) == stream &&
          slot.device.load(std::memory_order_acquire) == device) {
        return slot.shard.load(std::memory_order_acquire);
      }
    }
    return nullptr;
  }
  // Whether one of the key's slots is free. Requires the allocator's lock.
  bool has_room(int device, StreamHandle stream) const {
    const std::size_t h = home(device, stream);
    for (std::size_t i = 0; i < kProbe; ++i) {
      if (slots_[(h + i) & (kSlots - 1)].shard.load(std::memory_order_relaxed) == nullptr) {
        return true;
      }
    }
    return false;
  }
  // Publishes `shard` for (device, stream) in a free slot among its key's;
  // false when they are all taken. Requires the allocator's lock.
  bool publish(int device, StreamHandle stream, StreamShard* shard) {
    const std::size_t h = home(device, stream);
    for (std::size_t i = 0; i < kProbe; ++i) {
      Slot& slot = slots_[(h + i) & (kSlots - 1)];
      if (slot.shard.load(std::memory_order_relaxed) != nullptr) continue;
      slot.shard.store(shard, std::memory_order_release);
      slot.device.store(device, std::memory_order_release);
      slot.stream.store(stream, std::memory_order_release);
      return true;
    }
    return false;
  }
  // Unpublishes `shard` (retired). Requires the allocator's lock.
  void withdraw(const StreamShard* shard) {
    for (Slot& slot : slots_) {
      if (slot.shard.load(std::memory_order_relaxed) != shard) continue;
      slot.stream.store(kNoStream, std::memory_order_release);
      slot.device.store(-1, std::memory_order_release);
      slot.shard.store(nullptr, std::memory_order_release);
    }
  }
  // Whether `shard` is published for (device, stream) (CheckInvariants).
  bool publishes(int device, StreamHandle stream, const StreamShard* shard) const {
    return find(device, stream) == shard;
  }
  // Every shard made, in the order made (none is destroyed before the
  // allocator): what a free that names no stream searches.
  std::size_t made() const { return made_count_.load(std::memory_order_acquire); }
  StreamShard* made(std::size_t i) const { return made_[i].load(std::memory_order_relaxed); }
  void add_made(StreamShard* shard) {
    const std::size_t n = made_count_.load(std::memory_order_relaxed);
    made_[n].store(shard, std::memory_order_relaxed);
    made_count_.store(n + 1, std::memory_order_release);
  }

 private:
  struct Slot {
    std::atomic<StreamHandle> stream{kNoStream};
    std::atomic<int> device{-1};
    std::atomic<StreamShard*> shard{nullptr};
  };
  std::array<Slot, kSlots> slots_{};
  std::array<std::atomic<StreamShard*>, kMaxShards> made_{};
  std::atomic<std::size_t> made_count_{0};
};

// The shard this thread last allocated through, and its allocator's id
// (Allocator::Impl::allocator_id): where a free that names no stream
// (Allocator::deallocate) looks first.
struct ShardHint {
  std::uint64_t allocator = 0;
  StreamShard* shard = nullptr;
};
inline thread_local ShardHint shard_hint;

}  // namespace capalloc::detail

#endif  // CAPALLOC_ALLOCATOR_STREAM_SHARDS_HPP_
