// capture/alias_rule.cpp: see alias_rule.hpp.
#include "capture/alias_rule.hpp"

#include <algorithm>
#include <string>
#include <tuple>

#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace capalloc::detail {

namespace {

MemorySpan intersect(MemorySpan a, MemorySpan b) {
  const std::uintptr_t begin = std::max(a.begin(), b.begin());
  const std::uintptr_t end = std::min(a.end(), b.end());
  return end > begin ? MemorySpan{reinterpret_cast<const void*>(begin), end - begin} : MemorySpan{};
}

// True when `record` writes all of `range` whole (kWrite) through `block` at
// capture positions for which `in_window` holds.
template <typename Window>
bool written_whole_by(const IndexedRecord& record, const BlockRef& block, MemorySpan range,
                      Window in_window) {
  auto it = record.by_writer.find(block.sequence);
  if (it == record.by_writer.end()) return false;
  std::vector<MemorySpan> own;
  for (std::size_t i : it->second) {
    const RecordedWrite& w = record.record.writes[i];
    // Only a whole write sets the bytes: an update or state access reads
    // them first and carries what was there on.
    if (w.mode == AccessMode::kWrite && in_window(w.position) && w.span.overlaps(range)) {
      own.push_back(w.span);
    }
  }
  std::sort(own.begin(), own.end(),
            [](const MemorySpan& a, const MemorySpan& b) { return a.begin() < b.begin(); });
  std::uintptr_t covered_to = range.begin();
  for (const MemorySpan& s : own) {
    if (s.begin() > covered_to) return false;
    covered_to = std::max(covered_to, s.end());
    if (covered_to >= range.end()) return true;
  }
  return covered_to >= range.end();
}

// True when the victim's own writes after `after` restore all of `range`:
// the replay then ends with the victim's own data there.
bool rewritten_by_victim(const IndexedRecord& record, const BlockRef& victim, MemorySpan range,
                         std::size_t after) {
  return written_whole_by(record, victim, range, [after](std::size_t p) { return p > after; });
}

// True when the graph writes all of `range` through `block` before position
// `before`: a read there reads the graph's own data of this replay.
bool written_earlier(const IndexedRecord& record, const BlockRef& block, MemorySpan range,
                     std::size_t before) {
  return written_whole_by(record, block, range, [before](std::size_t p) { return p < before; });
}

// True when `spans` together cover all of `range`.
bool covers(std::vector<MemorySpan> spans, MemorySpan range) {
  std::sort(spans.begin(), spans.end(),
            [](const MemorySpan& a, const MemorySpan& b) { return a.begin() < b.begin(); });
  std::uintptr_t covered_to = range.begin();
  for (const MemorySpan& s : spans) {
    if (s.begin() > covered_to) break;
    covered_to = std::max(covered_to, s.end());
  }
  return covered_to >= range.end();
}

std::string name_of(const BlockRef& b) {
  if (b.sequence == 0) return "memory no block held";
  return absl::StrFormat("'%s' (block #%d)", b.tag.empty() ? "untagged" : b.tag, b.sequence);
}

}  // namespace

IndexedRecord::IndexedRecord(WriteRecord r) : record(std::move(r)) {
  by_begin_.reserve(record.writes.size());
  for (std::size_t i = 0; i < record.writes.size(); ++i) {
    by_writer[record.writes[i].writer.sequence].push_back(i);
    by_begin_.push_back(i);
    longest_ = std::max(longest_, record.writes[i].span.bytes);
  }
  std::sort(by_begin_.begin(), by_begin_.end(), [&](std::size_t a, std::size_t b) {
    return record.writes[a].span.begin() < record.writes[b].span.begin();
  });
}

std::vector<std::size_t> IndexedRecord::writes_overlapping(MemorySpan span) const {
  std::vector<std::size_t> out;
  const std::uintptr_t from = span.begin() > longest_ ? span.begin() - longest_ : 0;
  auto it = std::lower_bound(by_begin_.begin(), by_begin_.end(), from,
                             [&](std::size_t i, std::uintptr_t v) {
                               return record.writes[i].span.begin() < v;
                             });
  for (; it != by_begin_.end() && record.writes[*it].span.begin() < span.end(); ++it) {
    if (record.writes[*it].span.overlaps(span)) out.push_back(*it);
  }
  std::sort(out.begin(), out.end());  // capture order, as a scan would give
  return out;
}

void WriteIndex::add(const IndexedRecord& r) {
  DeviceWrites& d = devices_[r.record.device];
  for (std::size_t i = 0; i < r.record.writes.size(); ++i) {
    const MemorySpan& s = r.record.writes[i].span;
    d.by_begin.emplace(s.begin(), Entry{r.record.graph, i, s.end()});
    d.longest = std::max(d.longest, s.bytes);
  }
}

void WriteIndex::remove(const IndexedRecord& r) {
  auto d = devices_.find(r.record.device);
  if (d == devices_.end()) return;
  auto& by_begin = d->second.by_begin;
  for (const RecordedWrite& w : r.record.writes) {
    // A btree erase invalidates every other iterator: compare keys, not an
    // end iterator taken before the erase.
    for (auto it = by_begin.lower_bound(w.span.begin());
         it != by_begin.end() && it->first == w.span.begin();) {
      it = it->second.graph == r.record.graph ? by_begin.erase(it) : std::next(it);
    }
  }
}

std::vector<std::pair<GraphHandle, std::size_t>> WriteIndex::overlapping(int device,
                                                                         MemorySpan span) const {
  std::vector<std::pair<GraphHandle, std::size_t>> out;
  auto d = devices_.find(device);
  if (d == devices_.end() || span.bytes == 0) return out;
  const std::uintptr_t from =
      span.begin() > d->second.longest ? span.begin() - d->second.longest : 0;
  for (auto it = d->second.by_begin.lower_bound(from);
       it != d->second.by_begin.end() && it->first < span.end(); ++it) {
    if (it->second.end > span.begin()) out.emplace_back(it->second.graph, it->second.write);
  }
  return out;
}

void classify(Finding& f, std::vector<VictimAccess> accesses) {
  const auto hazard = [&f](std::string reason) {
    f.severity = Severity::kHazard;
    f.severity_reason = std::move(reason);
  };
  if (f.harm == Harm::kStaleRead) {
    return hazard(absl::StrFormat(
        "a stale read: each replay computes from %s's data instead of the graph's own input",
        name_of(f.victim)));
  }
  if (f.victim.lifetime == Lifetime::kPersistent) {
    return hazard("the victim is persistent: every replay must leave it intact");
  }
  if (f.victim.capture == 0) {
    return hazard("the victim was allocated outside any capture: the program, not a graph, "
                  "owns its data");
  }
  const bool written = std::any_of(accesses.begin(), accesses.end(), [](const VictimAccess& a) {
    return a.access->mode != AccessMode::kRead;
  });
  if (!written) {
    return hazard("no graph writes the victim, so no replay restores it after the clobber");
  }
  // Per graph in replay order; at one position a read comes before a write.
  std::sort(accesses.begin(), accesses.end(), [](const VictimAccess& a, const VictimAccess& b) {
    const auto key = [](const VictimAccess& v) {
      return std::tuple(v.graph, v.access->position, v.access->mode == AccessMode::kWrite);
    };
    return key(a) < key(b);
  });
  std::vector<std::string> writers;
  for (std::size_t i = 0; i < accesses.size();) {
    const GraphHandle graph = accesses[i].graph;
    const std::string_view label = accesses[i].label;
    std::vector<MemorySpan> written_first;
    bool uses_overlap = false;
    for (; i < accesses.size() && accesses[i].graph == graph; ++i) {
      const RecordedWrite& a = *accesses[i].access;
      const MemorySpan piece = intersect(a.span, f.overlap);
      if (piece.bytes == 0) continue;
      uses_overlap = true;
      if (graph == f.graph) {
        return hazard(absl::StrFormat(
            "%s itself uses the victim (%s by %s), and its replay leaves the clobber there",
            label, access_mode_name(a.mode), a.op));
      }
      if (a.mode == AccessMode::kWrite) {
        written_first.push_back(piece);
      } else if (!covers(written_first, piece)) {
        return hazard(absl::StrFormat(
            "%s reads the victim before writing it (%s by %s at capture position %d)", label,
            access_mode_name(a.mode), a.op, a.position));
      }
    }
    if (uses_overlap) writers.emplace_back(label);
  }
  f.severity = Severity::kCrossGraphOutput;
  f.severity_reason =
      writers.empty()
          ? std::string("no graph uses the clobbered bytes, and graphs write the rest of the "
                        "victim: its unused part")
          : absl::StrFormat("every graph that uses the clobbered bytes (%s) writes them whole "
                            "before reading them: an output or scratch, rewritten at each of "
                            "their replays",
                            absl::StrJoin(writers, ", "));
}

std::string fix_for(const Finding& f) {
  const std::string victim = name_of(f.victim);
  if (f.harm == Harm::kStaleRead) {
    if (f.writer.sequence == 0) {
      return absl::StrFormat(
          "%s reads memory that no block held when it was captured (a stale pointer): "
          "capture only launches whose buffers are live",
          f.graph_label);
    }
    return absl::StrFormat(
        "%s still reads through %s, which was freed after the capture: keep %s alive while %s "
        "can replay (the graph outlived a tensor it depends on), or destroy the graph before "
        "freeing it",
        f.graph_label, name_of(f.writer), name_of(f.writer), f.graph_label);
  }
  if (f.victim.capture != 0) {
    return absl::StrFormat(
        "%s was allocated during capture %d and outlives it: allocate it before the capture, "
        "or make it persistent and preallocate it during warmup, so it never takes an address "
        "a graph writes",
        victim, f.victim.capture);
  }
  if (f.writer.sequence == 0) {
    return absl::StrFormat(
        "%s writes memory that no block held when it was captured (a stale pointer): "
        "capture only launches whose buffers are live",
        f.graph_label);
  }
  return absl::StrFormat(
      "%s still writes through %s, which was freed after the capture: keep %s alive while %s "
      "can replay, or destroy the graph before freeing it",
      f.graph_label, name_of(f.writer), name_of(f.writer), f.graph_label);
}

void find_clobbers(const IndexedRecord& r, const BlockRef& victim,
                   const std::vector<std::size_t>& candidates, std::vector<Finding>& out) {
  // One finding per (graph, victim). Its writer is the last clobbering write
  // in capture order (whose data a replay leaves behind); its overlap is the
  // bounding range of all of them.
  Finding* f = nullptr;
  for (std::size_t i : candidates) {
    const RecordedWrite& w = r.record.writes[i];
    if (w.mode == AccessMode::kRead) continue;  // reads never clobber
    if (w.writer.sequence == victim.sequence && victim.sequence != 0) continue;
    const MemorySpan overlap = intersect(w.span, victim.span());
    if (overlap.bytes == 0) continue;
    if (w.evidence != WriteEvidence::kFootprint &&
        rewritten_by_victim(r, victim, overlap, w.position)) {
      continue;
    }
    if (f == nullptr) {
      out.emplace_back();
      f = &out.back();
      f->graph = r.record.graph;
      f->graph_label = r.record.label;
      f->capture = r.record.capture;
      f->victim = victim;
      f->overlap = overlap;
    } else {
      const std::uintptr_t begin = std::min(f->overlap.begin(), overlap.begin());
      const std::uintptr_t end = std::max(f->overlap.end(), overlap.end());
      f->overlap = {reinterpret_cast<const void*>(begin), end - begin};
    }
    ++f->clobbering_writes;
    if (f->clobbering_writes == 1 || w.position >= f->write_position) {
      f->evidence = w.evidence;
      f->writer = w.writer;
      f->write_position = w.position;
      f->write_op = w.op;
      f->write_mode = w.mode;
    }
  }
}

void find_stale_reads(const IndexedRecord& r, const BlockRef& victim,
                      const std::vector<std::size_t>& candidates, std::vector<Finding>& out) {
  // One finding per (graph, victim), named after the first stale read in
  // capture order; `overlap` bounds them all.
  Finding* f = nullptr;
  for (std::size_t i : candidates) {
    const RecordedWrite& a = r.record.writes[i];
    if (a.mode == AccessMode::kWrite) continue;  // reads, updates and state read first
    if (a.writer.sequence == victim.sequence && victim.sequence != 0) continue;
    const MemorySpan overlap = intersect(a.span, victim.span());
    if (overlap.bytes == 0) continue;
    // The graph's own data of this replay, written through that block
    // before: not the victim's.
    if (a.evidence != WriteEvidence::kFootprint && written_earlier(r, a.writer, overlap, a.position)) {
      continue;
    }
    if (f == nullptr) {
      out.emplace_back();
      f = &out.back();
      f->graph = r.record.graph;
      f->graph_label = r.record.label;
      f->capture = r.record.capture;
      f->harm = Harm::kStaleRead;
      f->victim = victim;
      f->overlap = overlap;
    } else {
      const std::uintptr_t begin = std::min(f->overlap.begin(), overlap.begin());
      const std::uintptr_t end = std::max(f->overlap.end(), overlap.end());
      f->overlap = {reinterpret_cast<const void*>(begin), end - begin};
    }
    ++f->clobbering_writes;
    if (f->clobbering_writes == 1 || a.position < f->write_position) {
      f->evidence = a.evidence;
      f->writer = a.writer;
      f->write_position = a.position;
      f->write_op = a.op;
      f->write_mode = a.mode;
    }
  }
}

}  // namespace capalloc::detail
