// capture/write_record.cpp: see write_record.hpp.
#include "capture/write_record.hpp"

#include <algorithm>

#include "common/interned_strings.hpp"

namespace capalloc::detail {

bool occupied_at(const Occupant& o, const CaptureWindow& window, std::size_t position) {
  const bool freed_before = o.freed_in_capture == window.capture && o.freed_at <= position;
  if (o.block.capture == window.capture) {
    // Allocated in this capture: from its allocation position until its free.
    return o.block.capture_position <= position && !freed_before;
  }
  // Allocated before the capture (by another capture or none), and not freed
  // before it began. A block another capture allocated after this one began
  // was in another pool, or in a shared pool after this capture freed the
  // memory: it does not hold memory this capture writes.
  if (o.block.capture != 0 && o.alloc_tick > window.begin_tick) return false;
  if (o.live()) return true;
  return o.free_tick > window.begin_tick && !freed_before;
}

namespace {

// Blocks freed since the capture began, by start address, for overlap
// queries that cost O(log n + hits) per write instead of O(frees).
class FreedDuringCapture {
 public:
  FreedDuringCapture(const BlockHistory& history, const CaptureWindow& window)
      : freed_(history.freed_since(window.device, window.begin_tick)) {
    std::sort(freed_.begin(), freed_.end(), [](const Occupant* a, const Occupant* b) {
      return a->block.span().begin() < b->block.span().begin();
    });
    for (const Occupant* o : freed_) longest_ = std::max(longest_, o->block.size);
  }
  template <typename F>
  void for_overlapping(MemorySpan span, F&& visit) const {
    const std::uintptr_t from = span.begin() > longest_ ? span.begin() - longest_ : 0;
    auto it = std::lower_bound(freed_.begin(), freed_.end(), from,
                               [](const Occupant* o, std::uintptr_t v) {
                                 return o->block.span().begin() < v;
                               });
    for (; it != freed_.end() && (*it)->block.span().begin() < span.end(); ++it) {
      if ((*it)->block.span().overlaps(span)) visit(*it);
    }
  }

 private:
  std::vector<const Occupant*> freed_;
  std::size_t longest_ = 0;
};

}  // namespace

void add_declared_writes(const std::vector<GraphWrite>& writes, const CaptureWindow& window,
                         const BlockHistory& history, WriteRecord& record) {
  WriteEvidence weakest = WriteEvidence::kDeclared;
  const FreedDuringCapture freed(history, window);
  std::vector<const Occupant*> candidates;
  std::vector<MemorySpan> covered;
  record.writes.reserve(record.writes.size() + writes.size());
  // Nodes of one kernel come in runs: intern its name once per run.
  std::string_view op;
  const std::string* op_of = nullptr;
  for (const GraphWrite& w : writes) {
    weakest = std::max(weakest, w.evidence);
    if (op_of == nullptr || *op_of != w.op) {
      op = intern(w.op);
      op_of = &w.op;
    }
    covered.clear();
    candidates.clear();
    history.live_overlapping(window.device, w.span, candidates);
    freed.for_overlapping(w.span, [&](const Occupant* o) { candidates.push_back(o); });
    if (w.mode == AccessMode::kTouch) {
      // A pointer into a block touches that block, whole; one into no block
      // (or a block's end) touches nothing: it is not a pointer to memory.
      for (const Occupant* o : candidates) {
        if (!occupied_at(*o, window, w.position)) continue;
        // Two parameters of one node into one block are one touch. The
        // runtimes list a node's accesses together.
        bool seen = false;
        for (auto r = record.writes.rbegin(); r != record.writes.rend() && !seen; ++r) {
          if (r->position != w.position) break;
          seen = r->mode == AccessMode::kTouch && r->writer.sequence == o->block.sequence;
        }
        if (!seen) {
          record.writes.push_back(
              {o->block.span(), o->block, w.position, op, w.evidence, AccessMode::kTouch});
        }
        break;  // blocks do not overlap at one position
      }
      continue;
    }
    for (const Occupant* o : candidates) {
      if (!occupied_at(*o, window, w.position)) continue;
      const std::uintptr_t begin = std::max(w.span.begin(), o->block.span().begin());
      const std::uintptr_t end = std::min(w.span.end(), o->block.span().end());
      const MemorySpan piece{reinterpret_cast<const void*>(begin), end - begin};
      record.writes.push_back({piece, o->block, w.position, op, w.evidence, w.mode});
      covered.push_back(piece);
    }
    // What no block held is written through no block.
    if (covered.size() > 1) std::sort(covered.begin(), covered.end(),
              [](const MemorySpan& a, const MemorySpan& b) { return a.begin() < b.begin(); });
    std::uintptr_t at = w.span.begin();
    auto gap = [&](std::uintptr_t end) {
      if (end > at) {
        record.writes.push_back(
            {{reinterpret_cast<const void*>(at), end - at}, BlockRef{}, w.position, op, w.evidence,
             w.mode});
      }
    };
    for (const MemorySpan& piece : covered) {
      gap(piece.begin());
      at = std::max(at, piece.end());
    }
    gap(w.span.end());
  }
  record.precision = weakest;
}

void add_footprint_writes(const std::vector<std::uint64_t>& allocated, const BlockHistory& history,
                          WriteRecord& record) {
  for (std::uint64_t sequence : allocated) {
    const Occupant* o = history.find(sequence);
    if (o == nullptr) continue;
    record.writes.push_back({o->block.span(), o->block, o->block.capture_position, "footprint",
                             WriteEvidence::kFootprint});
  }
  record.precision = WriteEvidence::kFootprint;
}

}  // namespace capalloc::detail
