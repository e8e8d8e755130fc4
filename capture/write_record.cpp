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

// Blocks freed since the capture began, for the question "which of them
// may hold memory at capture position p?". A capture reuses a few addresses
// for all its transients, so an address index would offer every transient
// that ever sat on a write's bytes; instead, positions are swept forward:
// each block becomes active at the first position it can occupy (its
// allocation in this capture, else the capture's start) and leaves once
// freed in the capture. Queries at non-decreasing positions cost O(active
// blocks + activations); a position earlier than the last restarts the
// sweep. The active set is a superset of the blocks occupied_at answers
// true for; the caller still asks it.
class FreedDuringCapture {
 public:
  FreedDuringCapture(const BlockHistory& history, const CaptureWindow& window)
      : window_(window), by_first_(history.freed_since(window.device, window.begin_tick)) {
    std::stable_sort(by_first_.begin(), by_first_.end(),
                     [&](const Occupant* a, const Occupant* b) { return first(*a) < first(*b); });
  }
  // Visits the active blocks at `position` overlapping `span`, by start
  // address.
  template <typename F>
  void for_overlapping(MemorySpan span, std::size_t position, F&& visit) {
    if (position < at_) {
      next_ = 0;
      active_.clear();
    }
    at_ = position;
    while (next_ < by_first_.size() && first(*by_first_[next_]) <= position) {
      active_.push_back(by_first_[next_++]);
    }
    std::erase_if(active_, [&](const Occupant* o) { return past(*o, position); });
    hits_.clear();
    for (const Occupant* o : active_) {
      if (o->block.span().overlaps(span)) hits_.push_back(o);
    }
    std::sort(hits_.begin(), hits_.end(), [](const Occupant* a, const Occupant* b) {
      return a->block.span().begin() < b->block.span().begin();
    });
    for (const Occupant* o : hits_) visit(o);
  }

 private:
  std::size_t first(const Occupant& o) const {
    return o.block.capture == window_.capture ? o.block.capture_position : 0;
  }
  bool past(const Occupant& o, std::size_t position) const {
    return o.freed_in_capture == window_.capture && o.freed_at <= position;
  }

  CaptureWindow window_;
  std::vector<const Occupant*> by_first_;
  std::size_t next_ = 0;
  std::size_t at_ = 0;
  std::vector<const Occupant*> active_;
  std::vector<const Occupant*> hits_;
};

}  // namespace

void add_declared_writes(const std::vector<GraphWrite>& writes, const CaptureWindow& window,
                         const BlockHistory& history, WriteRecord& record,
                         std::uint64_t& blocks_visited) {
  WriteEvidence weakest = WriteEvidence::kDeclared;
  if (writes.empty()) {  // nothing to tie: skip listing the capture's frees
    record.precision = weakest;
    return;
  }
  FreedDuringCapture freed(history, window);
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
    freed.for_overlapping(w.span, w.position,
                          [&](const Occupant* o) { candidates.push_back(o); });
    blocks_visited += candidates.size();
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
