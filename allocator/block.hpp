// allocator/block.hpp: blocks, segments and the arena that recycles blocks.
//
// A Segment is one reservation from the DeviceRuntime. Its Blocks tile it
// exactly, in address order, linked through `prev`/`next` (physical
// neighbours). A block is allocated, free (in its pool's FreeIndex) or
// pending-free (freed by the caller, waiting on events recorded on the other
// streams it was used on). Two free physical neighbours never coexist unless
// one of them is in a QuickCache (quick_cache.hpp): a block filed in the
// FreeIndex has merged with its free neighbours, and a cached one merges
// when the cache is drained.
//
// Block objects come from a BlockArena: a free list over chunks that are
// never returned, so that splitting and merging allocate no heap memory once
// the arena is warm.
#ifndef CAPALLOC_ALLOCATOR_BLOCK_HPP_
#define CAPALLOC_ALLOCATOR_BLOCK_HPP_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "capalloc/allocator.hpp"
#include "capalloc/runtime.hpp"

namespace capalloc::detail {

class FreeIndex;
class Pool;
struct Segment;

// Which segments serve a request (SizePolicy::class_of): small requests
// share small segments, medium ones large segments; an oversize request gets
// a segment of its own (split later like any other), filed apart so that
// the cache can give oversize segments back without touching the others.
enum class SizeClass : std::uint8_t { kSmall, kLarge, kOversize };

struct alignas(64) Block {
  std::uintptr_t addr = 0;
  std::size_t size = 0;       // rounded size; blocks tile their segment
  std::size_t requested = 0;  // what the caller asked for (allocated blocks)
  Block* prev = nullptr;      // physical neighbours in the segment
  Block* next = nullptr;
  Block* free_prev = nullptr;  // links of the FreeIndex bin list
  Block* free_next = nullptr;
  Segment* segment = nullptr;
  BlockState state = BlockState::kFree;
  Lifetime lifetime = Lifetime::kTransient;
  bool in_free_index = false;
  bool in_quick_cache = false;  // free, unmerged, in its index's QuickCache
  // The FreeIndex bin the block is filed in (while in_free_index), so that a
  // removal does not map its size to the bin again.
  std::uint16_t free_bin = 0;
  // allocate() returned this block's address since the address last became
  // a block start (split or merge), so a free of it now is a double free;
  // false for a remainder nobody was given.
  bool handed_out = false;
  std::uint32_t tag_id = 0;
  std::uint32_t owner_id = 0;  // interned AllocOptions::owner; 0: none
  std::uint32_t pending_events = 0;  // events still to complete (kPendingFree)
  std::uint32_t site_id = 0;  // allocation site (allocation_sites.hpp); 0: none
  std::uint64_t sequence = 0;        // allocation sequence number
  CaptureId capture = 0;             // capture the block was allocated in
  std::size_t capture_position = 0;  // position in that capture
  // Streams other than the owner's the block was used on (record_stream).
  absl::InlinedVector<StreamHandle, 2> used_on;

  bool is_free() const { return state == BlockState::kFree; }
  const void* ptr() const { return reinterpret_cast<const void*>(addr); }
};

// Segments are owned by a stream: every block carved from one is handed out
// on that stream only, so reuse never races with work of another stream.
struct Segment {
  std::uintptr_t base = 0;
  std::size_t size = 0;
  int device = 0;
  StreamHandle stream = kDefaultStream;
  SizeClass size_class = SizeClass::kSmall;  // which requests it serves (SizePolicy)
  Pool* pool = nullptr;
  FreeIndex* index = nullptr;  // the free index of (pool, stream, size class)
  Block* first = nullptr;
  // Its stream was destroyed: once fully free, the next stream of the pool
  // that needs a segment of its class adopts it (Pool::take_from_orphan).
  bool orphaned = false;

  bool fully_free() const { return first != nullptr && first->next == nullptr && first->is_free(); }
};

class BlockArena {
 public:
  BlockArena() = default;
  BlockArena(const BlockArena&) = delete;
  BlockArena& operator=(const BlockArena&) = delete;

  // A block with every field reset. Allocates a chunk only when the free list
  // is empty.
  Block* make() {
    if (free_list_ == nullptr) grow();
    Block* b = free_list_;
    free_list_ = b->next;
    b->next = nullptr;
    --spare_;
    return b;
  }

  // Whether make() has a block without allocating.
  bool has_spare() const { return free_list_ != nullptr; }
  // Blocks on the free list.
  std::size_t spare() const { return spare_; }
  // Moves `n` blocks of the free list to `to` (a stream shard's, and
  // back), growing first when fewer are spare (it may throw).
  void lend(BlockArena& to, std::size_t n) {
    while (spare_ < n) grow();
    for (std::size_t i = 0; i < n; ++i) {
      Block* b = free_list_;
      free_list_ = b->next;
      b->next = to.free_list_;
      to.free_list_ = b;
    }
    spare_ -= n;
    to.spare_ += n;
  }

  void recycle(Block* b) {
    b->used_on.clear();
    auto used_on = std::move(b->used_on);  // keep the (inline) storage
    *b = Block{};
    b->used_on = std::move(used_on);
    b->next = free_list_;
    free_list_ = b;
    ++spare_;
  }

 private:
  static constexpr std::size_t kChunkBlocks = 256;
  void grow() {
    chunks_.push_back(std::make_unique<Block[]>(kChunkBlocks));
    Block* chunk = chunks_.back().get();
    for (std::size_t i = 0; i < kChunkBlocks; ++i) {
      chunk[i].next = free_list_;
      free_list_ = &chunk[i];
    }
    spare_ += kChunkBlocks;
  }

  std::vector<std::unique_ptr<Block[]>> chunks_;
  Block* free_list_ = nullptr;
  std::size_t spare_ = 0;
};

}  // namespace capalloc::detail

#endif  // CAPALLOC_ALLOCATOR_BLOCK_HPP_
