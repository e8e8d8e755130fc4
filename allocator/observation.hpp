// allocator/observation.hpp: what listens to the allocator's hot path: the
// retention audit's attribution (tags from the thread's tag scopes,
// allocation stacks) and the event trace.
//
// The allocator holds one AllocatorObserver pointer, null until a listener
// is first turned on (set_record_stacks, a tag scope, start_trace); then it
// points at the allocator's Observation for the rest of its life, so that
// every block allocated from then on has its site written (a block's site is
// never left over from an earlier allocation of the same Block object). With
// the pointer null the hot path pays one predictable branch in allocate and
// one in deallocate.
//
// Called with the allocator's lock held: an observer must not call the
// allocator. Everything in Observation is guarded by that lock.
#ifndef CAPALLOC_ALLOCATOR_OBSERVATION_HPP_
#define CAPALLOC_ALLOCATOR_OBSERVATION_HPP_

#include <cstdint>
#include <memory>

#include "allocator/block.hpp"
#include "allocator/event_trace.hpp"

namespace capalloc::detail {

class AllocatorObserver {
 public:
  virtual ~AllocatorObserver() = default;
  // `block` has just been allocated, its fields set, before it is handed
  // out (and before a capture listener hears of it). The observer may set
  // its tag (when it has none) and its site.
  virtual void on_allocate(Block& block) = 0;
  // The block allocated as `sequence` was freed (the free succeeded).
  virtual void on_free(std::uint64_t sequence) = 0;
  virtual void on_record_stream(const Block& block, StreamHandle stream) = 0;
};

class Observation final : public AllocatorObserver {
 public:
  void on_allocate(Block& block) override;
  void on_free(std::uint64_t sequence) override;
  void on_record_stream(const Block& block, StreamHandle stream) override;

  bool record_stacks = false;
  bool apply_tag_scopes = false;
  std::unique_ptr<EventTrace> trace;
};

}  // namespace capalloc::detail

#endif  // CAPALLOC_ALLOCATOR_OBSERVATION_HPP_
