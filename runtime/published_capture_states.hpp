// runtime/published_capture_states.hpp: each stream's capture state as the
// host runtime last published it, readable from any thread without the
// runtime's lock.
//
// The allocator asks capture_info at every allocation and free during a
// capture. Under the runtime's registry lock that was two locked atomic
// operations and a hash lookup per question (about 85 instructions); read
// from here it is a few plain loads on x86.
//
// Writers are the runtime's calls that change what capture_info answers
// (create and destroy a stream, begin, join and end a capture, record a node
// into one, invalidate one), all under the runtime's lock, which makes them
// one writer at a time; each publishes after its change, inside the same
// critical section. A reader sees the state of some moment between the
// publications it races with, as under the lock, and everything published
// before a happens-before edge to it (release/acquire on the slot's
// sequence).
//
// A slot is a sequence lock: the writer makes the sequence odd, stores the
// fields, makes it even again; a reader retries when the sequence was odd
// or changed under it. The fields are atomics (stored with release, loaded
// with acquire: plain moves on x86), so there is no data race and no fence,
// which ThreadSanitizer would not model.
//
// Stream handles are small integers handed out in order and never reused, so
// a slot is found by indexing, not hashing: a fixed directory of chunks of
// slots, each chunk allocated when the first stream in it is created and
// freed only with the table. A slot therefore outlives its stream (reading a
// destroyed stream's slot is safe; it says "unknown"). Handles beyond the
// directory (over two million streams created) are never published, and
// their callers take the locked path.
#ifndef CAPALLOC_RUNTIME_PUBLISHED_CAPTURE_STATES_HPP_
#define CAPALLOC_RUNTIME_PUBLISHED_CAPTURE_STATES_HPP_

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "capalloc/runtime.hpp"

namespace capalloc::detail {

class PublishedCaptureStates {
 public:
  PublishedCaptureStates() = default;
  PublishedCaptureStates(const PublishedCaptureStates&) = delete;
  PublishedCaptureStates& operator=(const PublishedCaptureStates&) = delete;

  // --- Writers: the runtime's lock held. ------------------------------------

  // A stream just created (outside any capture). The only writer that
  // allocates (the stream's chunk of slots, the first time); if that throws,
  // the stream is simply not published and its readers take the locked path.
  void publish_created(StreamHandle stream) {
    if (stream >= kSlotsPerChunk * kChunks) return;
    std::atomic<Slot*>& entry = directory_[stream / kSlotsPerChunk];
    if (entry.load(std::memory_order_relaxed) == nullptr) {
      owned_.push_back(std::make_unique<Slot[]>(kSlotsPerChunk));
      entry.store(owned_.back().get(), std::memory_order_release);
    }
    publish_outside(stream);
  }
  // The stream is outside any capture (its capture ended).
  void publish_outside(StreamHandle stream) { store(stream, kKnown, CaptureStatus::kNone, 0, 0); }
  // The stream is a member of capture `id`, whose next node will be at
  // `position`.
  void publish_member(StreamHandle stream, CaptureStatus status, CaptureId id,
                      std::size_t position) {
    store(stream, kKnown, status, id, position);
  }
  // The stream is gone: readers must ask under the lock (and be told so).
  void forget(StreamHandle stream) { store(stream, kUnknown, CaptureStatus::kNone, 0, 0); }

  // --- Readers: any thread, no lock. -----------------------------------------

  // What capture_info answers for `stream`; false when the stream is not
  // published (unknown, destroyed, beyond the directory) or a writer kept
  // the slot busy through every retry: then ask under the lock.
  bool read(StreamHandle stream, CaptureInfo& out) const {
    const Slot* slot = find(stream);
    if (slot == nullptr) return false;
    for (int attempt = 0; attempt < kReadAttempts; ++attempt) {
      const std::uint64_t before = slot->sequence.load(std::memory_order_acquire);
      if ((before & 1) != 0) continue;
      const std::uint64_t word = slot->word.load(std::memory_order_acquire);
      const CaptureId id = slot->id.load(std::memory_order_acquire);
      const std::size_t position = slot->position.load(std::memory_order_acquire);
      if (slot->sequence.load(std::memory_order_relaxed) != before) continue;
      if ((word & kKnown) == 0) return false;
      const auto status = static_cast<CaptureStatus>(word >> kStatusShift);
      if (status == CaptureStatus::kNone) {
        out = CaptureInfo{};
      } else {
        out = CaptureInfo{.status = status,
                          .id = id,
                          .position = position,
                          .graph = static_cast<std::uintptr_t>(id)};
      }
      return true;
    }
    return false;
  }

 private:
  // The slot's word: bit 0 says the stream exists, the bits above hold its
  // CaptureStatus.
  static constexpr std::uint64_t kUnknown = 0;
  static constexpr std::uint64_t kKnown = 1;
  static constexpr int kStatusShift = 1;
  static constexpr int kReadAttempts = 64;
  static constexpr std::size_t kSlotsPerChunk = 512;
  static constexpr std::size_t kChunks = 4096;  // 2M stream handles

  struct Slot {
    std::atomic<std::uint64_t> sequence{0};
    std::atomic<std::uint64_t> word{kUnknown};
    std::atomic<CaptureId> id{0};
    std::atomic<std::size_t> position{0};
  };

  const Slot* find(StreamHandle stream) const {
    if (stream >= kSlotsPerChunk * kChunks) return nullptr;
    const Slot* chunk = directory_[stream / kSlotsPerChunk].load(std::memory_order_acquire);
    return chunk == nullptr ? nullptr : &chunk[stream % kSlotsPerChunk];
  }

  void store(StreamHandle stream, std::uint64_t known, CaptureStatus status, CaptureId id,
             std::size_t position) {
    if (stream >= kSlotsPerChunk * kChunks) return;
    Slot* chunk = directory_[stream / kSlotsPerChunk].load(std::memory_order_relaxed);
    if (chunk == nullptr) return;  // never published: readers take the locked path
    Slot& slot = chunk[stream % kSlotsPerChunk];
    const std::uint64_t sequence = slot.sequence.load(std::memory_order_relaxed);
    slot.sequence.store(sequence + 1, std::memory_order_relaxed);
    // Release stores: a reader that sees any of them sees the odd sequence.
    slot.word.store(known | (static_cast<std::uint64_t>(status) << kStatusShift),
                    std::memory_order_release);
    slot.id.store(id, std::memory_order_release);
    slot.position.store(position, std::memory_order_release);
    slot.sequence.store(sequence + 2, std::memory_order_release);
  }

  std::array<std::atomic<Slot*>, kChunks> directory_{};
  std::vector<std::unique_ptr<Slot[]>> owned_;  // the chunks; writers only
};

}  // namespace capalloc::detail

#endif  // CAPALLOC_RUNTIME_PUBLISHED_CAPTURE_STATES_HPP_
