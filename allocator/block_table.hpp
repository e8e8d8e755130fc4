// allocator/block_table.hpp: the pointer table, every allocated block by its
// address.
//
// Every allocation inserts one entry and every free finds and erases one, so
// the table is on the hot path twice per pair. It is an open-addressing
// table with linear probing, specialised for its keys: addresses are
// non-zero multiples of the allocator's granularity (at least 256), so 0
// marks an empty slot and a multiplicative hash of the address without its
// low zero bits spreads them. Erase shifts later entries of the probe run
// back (no tombstones), so lookups stay short however many frees happen.
//
// Cost: find, insert and erase each hash once and probe a few slots (the
// load factor stays at most 1/2). No heap allocation except when the table
// grows, which happens only while the live set reaches a new maximum; it
// never shrinks. Not thread-safe: the Allocator's lock guards it.
#ifndef CAPALLOC_ALLOCATOR_BLOCK_TABLE_HPP_
#define CAPALLOC_ALLOCATOR_BLOCK_TABLE_HPP_

#include <bit>
#include <cassert>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <utility>

#include "allocator/block.hpp"
#include "common/fibonacci_hash.hpp"

namespace capalloc::detail {

class BlockTable {
 public:
  BlockTable() { rebuild(kInitialCapacity); }
  BlockTable(const BlockTable&) = delete;
  BlockTable& operator=(const BlockTable&) = delete;

  std::size_t size() const { return size_; }

  // The block at `addr`, or nullptr.
  Block* find(std::uintptr_t addr) const {
    for (std::size_t i = home(addr);; i = (i + 1) & mask_) {
      const Slot& s = slots_[i];
      if (s.addr == addr) return s.block;
      if (s.addr == 0) return nullptr;
    }
  }

  // Makes room for one more entry (it may throw std::bad_alloc, the table
  // unchanged), so that the next insert_reserved cannot fail.
  void reserve_one() {
    if ((size_ + 1) * 2 > mask_ + 1) rebuild((mask_ + 1) * 2);
  }
  // Adds `block` under `addr`. Precondition: `addr` is non-zero and absent.
  void insert(std::uintptr_t addr, Block* block) {
    reserve_one();
    insert_reserved(addr, block);
  }
  // insert() after reserve_one(), with no insert between: never throws. The
  // allocation paths reserve before they take a block from a pool, so that
  // no block is lost between the pool and this table.
  void insert_reserved(std::uintptr_t addr, Block* block) noexcept {
    assert((size_ + 1) * 2 <= mask_ + 1);
    place(addr, block);
    ++size_;
  }

  // The slot holding `addr`, or kNoSlot. Valid until the table changes.
  static constexpr std::size_t kNoSlot = ~std::size_t{0};
  std::size_t find_slot(std::uintptr_t addr) const {
    for (std::size_t i = home(addr);; i = (i + 1) & mask_) {
      if (slots_[i].addr == addr) return i;
      if (slots_[i].addr == 0) return kNoSlot;
    }
  }
  Block* block_at(std::size_t slot) const { return slots_[slot].block; }

  // Removes `addr`; false if it was absent.
  bool erase(std::uintptr_t addr) {
    const std::size_t slot = find_slot(addr);
    if (slot == kNoSlot) return false;
    erase_slot(slot);
    return true;
  }

  // Removes the entry in `slot` (from find_slot, the table unchanged since).
  void erase_slot(std::size_t i) {
    // Backward-shift deletion: move up every later entry of the run whose
    // home is not in (i, j], so that no probe run has a hole.
    for (std::size_t j = (i + 1) & mask_;; j = (j + 1) & mask_) {
      if (slots_[j].addr == 0) break;
      const std::size_t h = home(slots_[j].addr);
      const bool stays = i <= j ? (i < h && h <= j) : (i < h || h <= j);
      if (stays) continue;
      slots_[i] = slots_[j];
      i = j;
    }
    slots_[i] = Slot{};
    --size_;
  }

  void clear() {
    for (std::size_t i = 0; i <= mask_; ++i) slots_[i] = Slot{};
    size_ = 0;
  }

  template <typename F>
  void for_each(F&& visit) const {
    for (std::size_t i = 0; i <= mask_; ++i) {
      if (slots_[i].addr != 0) visit(slots_[i].addr, slots_[i].block);
    }
  }

 private:
  struct Slot {
    std::uintptr_t addr = 0;
    Block* block = nullptr;
  };
  static constexpr std::size_t kInitialCapacity = 256;

  std::size_t home(std::uintptr_t addr) const {
    // The address without its (always zero) low bits.
    return fibonacci_slot(addr >> 8, shift_);
  }
  void place(std::uintptr_t addr, Block* block) {
    std::size_t i = home(addr);
    while (slots_[i].addr != 0) i = (i + 1) & mask_;
    slots_[i] = Slot{addr, block};
  }
  void rebuild(std::size_t capacity) {
    // The new slots first: if they cannot be had, the table stays as it was.
    std::unique_ptr<Slot[]> fresh = std::make_unique<Slot[]>(capacity);
    const std::size_t old_capacity = slots_ == nullptr ? 0 : mask_ + 1;
    std::unique_ptr<Slot[]> old = std::exchange(slots_, std::move(fresh));
    mask_ = capacity - 1;
    shift_ = 64 - static_cast<unsigned>(std::countr_zero(capacity));
    for (std::size_t i = 0; i < old_capacity; ++i) {
      if (old[i].addr != 0) place(old[i].addr, old[i].block);
    }
  }

  std::unique_ptr<Slot[]> slots_;
  std::size_t mask_ = 0;
  unsigned shift_ = 64;
  std::size_t size_ = 0;
};

}  // namespace capalloc::detail

#endif  // CAPALLOC_ALLOCATOR_BLOCK_TABLE_HPP_
