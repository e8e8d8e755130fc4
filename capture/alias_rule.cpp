// capture/alias_rule.cpp: see alias_rule.hpp.
#include "capture/alias_rule.hpp"

#include <algorithm>
#include <string>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "capture/byte_ranges.hpp"

namespace capalloc::detail {

namespace {

// A std::string_view as absl's StrCat takes it (Debian's Abseil has its own
// string_view type).
absl::string_view text(std::string_view s) { return {s.data(), s.size()}; }

// The victim's accesses in `record` that overlap `range`.
std::vector<const RecordedWrite*> victim_accesses(const IndexedRecord& record,
                                                  const BlockRef& victim, MemorySpan range) {
  std::vector<const RecordedWrite*> out;
  for (std::size_t i : record.accesses_through(victim.sequence)) {
    const RecordedWrite& a = record.record.writes[i];
    if (a.span.overlaps(range)) out.push_back(&a);
  }
  return out;
}

// The bytes of `range`, written through another block by node `clobber`,
// that some replay order the graph's edges allow leaves harmed: those that
// the victim's own whole writes ordered after the clobber do not restore,
// and those an access through the victim may read while they still hold the
// clobber (any read not ordered before the clobber, unless a whole write
// through the victim lies between them on a path of edges). At one node a
// read comes before a write. Touches count as reads and never restore;
// `optimistic`: every touch (its mode unknown; the first touch of a block
// born in the capture is even inferred to write) counts as a whole write
// instead: the harm left then is harm no unknown mode could prevent.
bool writes_whole(const RecordedWrite& a, bool optimistic) {
  return a.mode == AccessMode::kWrite || (optimistic && a.mode == AccessMode::kTouch);
}

// Sets `harmed` to the bytes left harmed, as a range set. `own`: the
// victim's accesses in `record` overlapping `range` (victim_accesses).
void left_clobbered(const IndexedRecord& record, const std::vector<const RecordedWrite*>& own,
                    MemorySpan range, std::size_t clobber, bool optimistic,
                    ClobberScratch& scratch, std::vector<MemorySpan>& harmed) {
  harmed.clear();
  // Nothing through the victim there: the whole range stays clobbered.
  if (own.empty()) {
    harmed.push_back(range);
    return;
  }
  const GraphOrder& order = record.order;
  scratch.restored.clear();
  bool restored_whole = false;  // one restoring write covers the range (common: the
                                // victim's own output write after a transient's)
  for (const RecordedWrite* a : own) {
    if (writes_whole(*a, optimistic) && order.before(clobber, a->position)) {
      if (a->span.begin() <= range.begin() && a->span.end() >= range.end()) {
        restored_whole = true;
        break;
      }
      scratch.restored.push_back(a->span);
    }
  }
  if (!restored_whole) subtract_into(range, scratch.restored, harmed);
  for (const RecordedWrite* a : own) {
    if (writes_whole(*a, optimistic) || a->position == clobber ||
        order.before(a->position, clobber)) {
      continue;
    }
    scratch.between.clear();
    for (const RecordedWrite* w : own) {
      if (writes_whole(*w, optimistic) && order.before(clobber, w->position) &&
          order.before(w->position, a->position)) {
        scratch.between.push_back(w->span);
      }
    }
    subtract_into(intersect(range, a->span), scratch.between, harmed);
  }
  merge_in_place(harmed);
}

// The bytes of `range` (a part of `victim`), read through another block by
// node `reader`, that some replay order lets the read take from the victim
// rather than from the replay's own data: those that no whole write (through
// any block) ordered before the read provides, which come from before the
// replay, and those that a write through the victim itself may put there
// after the last whole write (one not ordered after the read, with no whole
// write between it and the read on a path of edges): the victim's data,
// written in the same replay. `optimistic`: touches may provide bytes, and
// never write them otherwise.
std::vector<MemorySpan> read_from_outside(const IndexedRecord& record, MemorySpan range,
                                          std::size_t reader, std::uint64_t victim,
                                          bool optimistic) {
  const GraphOrder& order = record.order;
  const std::vector<std::size_t> overlapping = record.writes_overlapping(range);
  std::vector<MemorySpan> earlier;
  for (std::size_t i : overlapping) {
    const RecordedWrite& w = record.record.writes[i];
    if (writes_whole(w, optimistic) && order.before(w.position, reader)) {
      earlier.push_back(w.span);
    }
  }
  std::vector<MemorySpan> stale = subtract(range, std::move(earlier));
  for (std::size_t i : overlapping) {
    const RecordedWrite& w = record.record.writes[i];
    const bool may_write = w.mode != AccessMode::kRead &&
                           (!optimistic || w.mode != AccessMode::kTouch);
    if (!may_write || w.writer.sequence != victim || victim == 0 || w.position == reader ||
        order.before(reader, w.position)) {
      continue;
    }
    std::vector<MemorySpan> restored;  // whole writes between it and the read
    for (std::size_t j : overlapping) {
      const RecordedWrite& p = record.record.writes[j];
      if (writes_whole(p, optimistic) && order.before(w.position, p.position) &&
          order.before(p.position, reader)) {
        restored.push_back(p.span);
      }
    }
    for (const MemorySpan& s : subtract(intersect(w.span, range), std::move(restored))) {
      stale.push_back(s);
    }
  }
  return merged(std::move(stale));
}

// True when a whole write (mode kWrite) through the block `read` goes
// through, ordered before it, covers `range`.
bool covered_before(const IndexedRecord& record, const RecordedWrite& read, MemorySpan range) {
  if (read.writer.sequence == 0) return false;
  for (std::size_t i : record.accesses_through(read.writer.sequence)) {
    const RecordedWrite& w = record.record.writes[i];
    if (w.mode == AccessMode::kWrite && w.span.begin() <= range.begin() &&
        w.span.end() >= range.end() && record.order.before(w.position, read.position)) {
      return true;
    }
  }
  return false;
}

// True when an access through `victim` that may write (any mode but kRead)
// overlaps `range` and is not ordered after node `reader` (nor at it): the
// writes read_from_outside's second part weighs (non-optimistic reading).
bool victim_may_write_first(const IndexedRecord& record, const BlockRef& victim,
                            MemorySpan range, std::size_t reader) {
  if (victim.sequence == 0) return false;
  for (std::size_t i : record.accesses_through(victim.sequence)) {
    const RecordedWrite& w = record.record.writes[i];
    if (w.mode == AccessMode::kRead || !w.span.overlaps(range)) continue;
    if (w.position == reader || record.order.before(reader, w.position)) continue;
    return true;
  }
  return false;
}

std::string describe_path(const std::vector<std::size_t>& path) {
  std::string out;
  for (std::size_t p : path) absl::StrAppend(&out, out.empty() ? "node " : " -> node ", p);
  return out;
}

std::string name_of(const BlockRef& b) {
  if (b.sequence == 0) return "memory no block held";
  const std::string_view tag = b.tag.empty() ? std::string_view("untagged") : b.tag;
  return absl::StrCat("'", absl::string_view(tag.data(), tag.size()), "' (block #", b.sequence,
                      ")");
}

}  // namespace

IndexedRecord::IndexedRecord(WriteRecord r, GraphOrder o)
    : record(std::move(r)), order(std::move(o)) {
  record.order_from_edges = order.from_edges();
  const std::size_t n = record.writes.size();
  by_begin_.reserve(n);
  // (block, write) pairs in block order, capture order within a block: a
  // capture's writes usually come in that order already.
  std::vector<std::pair<std::uint64_t, std::size_t>> keyed;
  keyed.reserve(n);
  for (std::size_t i = 0; i < n; ++i) {
    keyed.emplace_back(record.writes[i].writer.sequence, i);
    by_begin_.push_back(i);
    longest_ = std::max(longest_, record.writes[i].span.bytes);
  }
  if (!std::is_sorted(keyed.begin(), keyed.end())) std::sort(keyed.begin(), keyed.end());
  by_writer_.reserve(n);
  std::size_t groups = 0;
  for (std::size_t i = 0; i < n; ++i) {
    by_writer_.push_back(keyed[i].second);
    groups += i == 0 || keyed[i].first != keyed[i - 1].first;
  }
  writer_groups_.reserve(groups);
  for (std::size_t i = 0; i < n; ++i) {
    if (i == 0 || keyed[i].first != keyed[i - 1].first) {
      writer_groups_.push_back({keyed[i].first, i, i});
    }
    ++writer_groups_.back().last;
  }
  std::sort(by_begin_.begin(), by_begin_.end(), [&](std::size_t a, std::size_t b) {
    return record.writes[a].span.begin() < record.writes[b].span.begin();
  });
  // A block born in this capture holds nothing defined until the graph first
  // uses it: its first touches (none of its accesses ordered before them)
  // are taken to write it.
  for (const WriterGroup& group : writer_groups_) {
    const absl::Span<const std::size_t> accesses(by_writer_.data() + group.first,
                                                 group.last - group.first);
    if (group.sequence == 0 || record.writes[accesses.front()].writer.capture != record.capture) {
      continue;
    }
    for (std::size_t i : accesses) {
      RecordedWrite& t = record.writes[i];
      if (t.mode != AccessMode::kTouch) continue;
      t.inferred_write = std::none_of(accesses.begin(), accesses.end(), [&](std::size_t j) {
        return order.before(record.writes[j].position, t.position);
      });
    }
  }
}

absl::Span<const std::size_t> IndexedRecord::accesses_through(std::uint64_t sequence) const {
  auto it = std::lower_bound(
      writer_groups_.begin(), writer_groups_.end(), sequence,
      [](const WriterGroup& g, std::uint64_t s) { return g.sequence < s; });
  if (it == writer_groups_.end() || it->sequence != sequence) return {};
  return {by_writer_.data() + it->first, it->last - it->first};
}

std::vector<std::size_t> IndexedRecord::writes_overlapping(MemorySpan span) const {
  std::vector<std::size_t> out;
  writes_overlapping(span, out);
  return out;
}

void IndexedRecord::writes_overlapping(MemorySpan span, std::vector<std::size_t>& out) const {
  out.clear();
  const std::uintptr_t from = span.begin() > longest_ ? span.begin() - longest_ : 0;
  auto it = std::lower_bound(by_begin_.begin(), by_begin_.end(), from,
                             [&](std::size_t i, std::uintptr_t v) {
                               return record.writes[i].span.begin() < v;
                             });
  for (; it != by_begin_.end() && record.writes[*it].span.begin() < span.end(); ++it) {
    if (record.writes[*it].span.overlaps(span)) out.push_back(*it);
  }
  std::sort(out.begin(), out.end());  // capture order, as a scan would give
}

void WriteIndex::add(const IndexedRecord& r) {
  DeviceWrites& d = devices_[r.record.device];
  for (std::size_t i = 0; i < r.record.writes.size(); ++i) {
    const MemorySpan& s = r.record.writes[i].span;
    d.add(s.begin(), s.bytes, Entry{r.record.graph, i, s.end()});
  }
  // By block: one entry per block the record accesses, not per access.
  // `added` numbers the accesses in write order, as one pass would.
  const std::uint64_t base = added_;
  added_ += r.record.writes.size();
  if (!index_writers_) return;
  r.for_each_writer([&](std::uint64_t sequence, absl::Span<const std::size_t>) {
    if (sequence == 0) return;
    by_writer_[sequence].push_back({&r, base});
  });
}

std::vector<std::pair<GraphHandle, std::size_t>> WriteIndex::through(
    std::uint64_t sequence) const {
  std::vector<std::pair<GraphHandle, std::size_t>> out;
  auto it = by_writer_.find(sequence);
  if (it == by_writer_.end()) return out;
  std::vector<ThroughEntry>& entries = through_entries_;
  entries.clear();
  for (const Accessor& a : it->second) {
    for (std::size_t i : a.record->accesses_through(sequence)) {
      entries.push_back(
          {a.record->record.writes[i].span.begin(), a.base + i, a.record->record.graph, i});
    }
  }
  visited_ += entries.size();
  std::sort(entries.begin(), entries.end(), [](const ThroughEntry& a, const ThroughEntry& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.added < b.added;
  });
  out.reserve(entries.size());
  for (const ThroughEntry& e : entries) out.emplace_back(e.graph, e.write);
  return out;
}

void WriteIndex::remove(const IndexedRecord& r) {
  if (index_writers_) {
    r.for_each_writer([&](std::uint64_t sequence, absl::Span<const std::size_t>) {
      auto t = by_writer_.find(sequence);
      if (sequence == 0 || t == by_writer_.end()) return;
      auto& accessors = t->second;
      accessors.erase(std::remove_if(accessors.begin(), accessors.end(),
                                     [&](const Accessor& a) { return a.record == &r; }),
                      accessors.end());
      if (accessors.empty()) by_writer_.erase(t);
    });
  }
  auto d = devices_.find(r.record.device);
  if (d == devices_.end()) return;
  for (const RecordedWrite& w : r.record.writes) {
    d->second.erase_all(w.span.begin(), w.span.bytes,
                        [&](const Entry& e) { return e.graph == r.record.graph; });
  }
}

std::vector<std::pair<GraphHandle, std::size_t>> WriteIndex::overlapping(int device,
                                                                         MemorySpan span) const {
  std::vector<std::pair<GraphHandle, std::size_t>> out;
  overlapping(device, span, out);
  return out;
}

void WriteIndex::overlapping(int device, MemorySpan span,
                             std::vector<std::pair<GraphHandle, std::size_t>>& out) const {
  out.clear();
  auto d = devices_.find(device);
  if (d == devices_.end()) return;
  d->second.for_candidates(span, visited_, [&](std::uintptr_t, const Entry& e) {
    if (e.end > span.begin()) out.emplace_back(e.graph, e.write);
    return true;
  });
}

void classify(Finding& f, std::vector<VictimAccess>& accesses) {
  const auto hazard = [&f](std::string reason) {
    f.severity = Severity::kHazard;
    f.severity_reason = std::move(reason);
  };
  // A record of footprint evidence says which blocks the capture allocated,
  // not what the graph writes: whether any harm happens is not known. The
  // rules below would name a severity the evidence cannot back.
  if (f.evidence == WriteEvidence::kFootprint) {
    f.severity = Severity::kPossible;
    f.severity_reason =
        "footprint evidence only: capalloc saw this capture's allocations and frees, not what its "
        "graph writes, so every block allocated in it counts as written; whether the replay "
        "harms the victim is not known (inspected or declared evidence would tell)";
    return;
  }
  const auto possible = [&f](std::string reason) {
    f.severity = Severity::kPossible;
    f.severity_reason = std::move(reason);
  };
  if (f.mode_unknown) {
    return possible(absl::StrCat(
        "the ", f.harm == Harm::kStaleRead ? "stale read" : "clobber",
        " rests on an access of unknown mode (an inspected touch: a pointer in a kernel's "
        "parameters): it happens only if that kernel ",
        f.harm == Harm::kStaleRead ? "reads those bytes" : "writes those bytes"));
  }
  if (f.harm == Harm::kStaleRead) {
    return hazard(absl::StrCat("a stale read: each replay computes from ", name_of(f.victim),
                               "'s data instead of the graph's own input"));
  }
  if (f.victim.lifetime == Lifetime::kPersistent) {
    return hazard("the victim is persistent: every replay must leave it intact");
  }
  if (f.victim.capture == 0) {
    return hazard("the victim was allocated outside any capture: the program, not a graph, "
                  "owns its data");
  }
  const auto surely_writes = [](const RecordedWrite& a) {
    return a.mode != AccessMode::kRead && a.mode != AccessMode::kTouch;
  };
  const bool written = std::any_of(accesses.begin(), accesses.end(), [&](const VictimAccess& a) {
    return surely_writes(*a.access) || a.access->inferred_write;
  });
  if (!written) {
    const bool touched = std::any_of(accesses.begin(), accesses.end(), [](const VictimAccess& a) {
      return a.access->mode == AccessMode::kTouch;
    });
    if (touched) {
      return possible("no graph surely writes the victim: only touches of unknown mode might "
                      "restore it after the clobber");
    }
    return hazard("no graph writes the victim, so no replay restores it after the clobber");
  }
  // Per graph: each read must be covered by that graph's whole writes ordered
  // before it on a path of its edges (at one node a read comes first). A
  // verdict that hinges on a touch's unknown mode, or on a write inferred
  // from a touch, is `possible`.
  std::stable_sort(accesses.begin(), accesses.end(),
                   [](const VictimAccess& a, const VictimAccess& b) { return a.graph < b.graph; });
  std::vector<absl::string_view> writers;  // labels of the records, which outlive this call
  std::vector<MemorySpan> used;  // harmed bytes some graph uses (and writes first)
  std::string uncertain;         // why the verdict hinges on a mode not known
  for (std::size_t i = 0; i < accesses.size();) {
    const GraphHandle graph = accesses[i].graph;
    const std::string_view label = accesses[i].label;
    std::size_t end = i;
    while (end < accesses.size() && accesses[end].graph == graph) ++end;
    bool uses_overlap = false;
    for (std::size_t k = i; k < end; ++k) {
      const RecordedWrite& a = *accesses[k].access;
      const GraphOrder& order = *accesses[k].order;
      for (const MemorySpan& range : f.ranges) {
        const MemorySpan piece = intersect(a.span, range);
        if (piece.bytes == 0) continue;
        uses_overlap = true;
        used.push_back(piece);
        if (graph == f.graph) {
          if (a.mode == AccessMode::kTouch) {
            uncertain = absl::StrCat(text(label), " itself touches the victim (", text(a.op),
                                     ", mode unknown)");
            continue;
          }
          return hazard(absl::StrCat(text(label), " itself uses the victim (",
                                     access_mode_name(a.mode), " by ", text(a.op),
                                     "), and its replay leaves the clobber there"));
        }
        if (a.mode == AccessMode::kWrite) continue;
        if (a.inferred_write) {
          uncertain = absl::StrCat(text(label), "'s first use of the victim (", text(a.op), " at node ",
                                   a.position, ") is a touch taken to write it");
          continue;
        }
        std::vector<MemorySpan> definite, inferred;
        for (std::size_t j = i; j < end; ++j) {
          const RecordedWrite& w = *accesses[j].access;
          if (!order.before(w.position, a.position)) continue;
          if (w.mode == AccessMode::kWrite) definite.push_back(w.span);
          if (w.mode == AccessMode::kWrite || w.mode == AccessMode::kTouch) {
            inferred.push_back(w.span);
          }
        }
        if (covers(std::move(definite), piece)) continue;
        if (a.mode == AccessMode::kTouch) {
          uncertain = absl::StrCat(text(label), " touches the victim (", text(a.op), " at node ", a.position,
                                   ", mode unknown) before any write of it");
          continue;
        }
        if (covers(std::move(inferred), piece)) {
          uncertain = absl::StrCat(text(label),
                                   " reads the victim after a touch that may have written it (",
                                   text(a.op), " at node ", a.position, ")");
          continue;
        }
        return hazard(absl::StrCat(
            text(label), " may read the victim before writing it (", access_mode_name(a.mode),
            " by ", text(a.op), " at node ", a.position,
            ", which no whole write of those bytes precedes on a path of ",
            order.from_edges() ? "the graph's edges" : "capture order", ")"));
      }
    }
    if (uses_overlap) writers.push_back(text(label));
    i = end;
  }
  if (!uncertain.empty()) {
    return possible(absl::StrCat(uncertain, ": whether it reads the clobbered bytes first is not "
                                 "known (inspected evidence gives no mode)"));
  }
  f.severity = Severity::kCrossGraphOutput;
  std::size_t used_bytes = 0;
  for (const MemorySpan& u : merged(std::move(used))) used_bytes += u.bytes;
  const std::size_t unused_bytes = f.harmed_bytes() - used_bytes;
  const std::string unused =
      unused_bytes == 0
          ? std::string()
          : absl::StrCat(unused_bytes,
                         " clobbered byte(s) no graph uses: the unused part of a block graphs "
                         "write (an eager reader of them would see the clobber)");
  if (writers.empty()) {
    f.severity_reason = unused;
  } else {
    f.severity_reason = absl::StrCat(
        "every graph that uses the clobbered bytes (", absl::StrJoin(writers, ", "),
        ") writes them whole before reading them: an output or scratch, rewritten at each of "
        "their replays",
        unused.empty() ? std::string() : absl::StrCat("; ", unused));
  }
}

std::string fix_for(const Finding& f) {
  if (f.harm == Harm::kStaleRead) {
    if (f.writer.sequence == 0) {
      return absl::StrCat(f.graph_label,
                          " reads memory that no block held when it was captured (a stale "
                          "pointer): capture only launches whose buffers are live");
    }
    const std::string writer = name_of(f.writer);
    return absl::StrCat(f.graph_label, " still reads through ", writer,
                        ", which was freed after the capture: keep ", writer, " alive while ",
                        f.graph_label,
                        " can replay (the graph outlived a tensor it depends on), or destroy "
                        "the graph before freeing it");
  }
  if (f.victim.capture != 0) {
    return absl::StrCat(name_of(f.victim), " was allocated during capture ", f.victim.capture,
                        " and outlives it: allocate it before the capture, or make it "
                        "persistent and preallocate it during warmup, so it never takes an "
                        "address a graph writes");
  }
  if (f.writer.sequence == 0) {
    return absl::StrCat(f.graph_label,
                        " writes memory that no block held when it was captured (a stale "
                        "pointer): capture only launches whose buffers are live");
  }
  const std::string writer = name_of(f.writer);
  return absl::StrCat(f.graph_label, " still writes through ", writer,
                      ", which was freed after the capture: keep ", writer, " alive while ",
                      f.graph_label, " can replay, or destroy the graph before freeing it");
}

namespace {

// Starts or extends the finding of (r's graph, victim) with `ranges`, the
// bytes one access harms.
Finding& add_to_finding(Finding*& f, const IndexedRecord& r, const BlockRef& victim, Harm harm,
                        const std::vector<MemorySpan>& ranges, std::vector<Finding>& out) {
  if (f == nullptr) {
    out.emplace_back();
    f = &out.back();
    f->graph = r.record.graph;
    f->graph_label = r.record.label;
    f->capture = r.record.capture;
    f->harm = harm;
    f->victim = victim;
  }
  f->ranges.insert(f->ranges.end(), ranges.begin(), ranges.end());
  f->ranges = merged(std::move(f->ranges));
  f->overlap = {f->ranges.front().ptr, f->ranges.back().end() - f->ranges.front().begin()};
  ++f->clobbering_writes;
  return *f;
}

void name_access(Finding& f, const RecordedWrite& a) {
  f.evidence = a.evidence;
  f.writer = a.writer;
  f.write_position = a.position;
  f.write_op = a.op;
  f.write_mode = a.mode;
}

void set_order(Finding& f, const GraphOrder& order, std::string text,
               std::vector<std::size_t> path = {}) {
  f.order_from_edges = order.from_edges();
  if (!order.from_edges()) text += " (capture order: the runtime gave no edges)";
  f.order = std::move(text);
  f.order_path = std::move(path);
}

bool overlaps_any(const MemorySpan& span, const std::vector<MemorySpan>& set) {
  return std::any_of(set.begin(), set.end(), [&](const MemorySpan& s) { return s.overlaps(span); });
}

// The order evidence of the clobber node `clobber` leaves on `left`: how it
// relates to the victim's own accesses of those bytes.
void describe_clobber_order(Finding& f, const IndexedRecord& r, const BlockRef& victim,
                            std::size_t clobber, const std::vector<MemorySpan>& left) {
  const GraphOrder& order = r.order;
  if (f.evidence == WriteEvidence::kFootprint) {
    f.order_from_edges = false;
    f.order = "none: footprint evidence places no write at any node";
    f.order_path.clear();
    return;
  }
  std::vector<const RecordedWrite*> own;
  for (const RecordedWrite* a : victim_accesses(r, victim, victim.span())) {
    if (overlaps_any(a->span, left)) own.push_back(a);
  }
  std::sort(own.begin(), own.end(), [](const RecordedWrite* a, const RecordedWrite* b) {
    return a->position < b->position;
  });
  for (const RecordedWrite* a : own) {
    if (order.unordered(clobber, a->position)) {
      return set_order(f, order,
                       absl::StrCat("unordered: no path of edges joins node ", clobber,
                                    " (the write through ", name_of(f.writer), ") and node ",
                                    a->position, " (the victim's ", access_mode_name(a->mode),
                                    " by ", text(a->op), "), so a replay may run the clobber after it"));
    }
  }
  for (auto it = own.rbegin(); it != own.rend(); ++it) {
    if ((*it)->mode == AccessMode::kWrite && order.before((*it)->position, clobber)) {
      std::vector<std::size_t> path = order.path((*it)->position, clobber);
      return set_order(f, order,
                       absl::StrCat("after: ", describe_path(path),
                                    "; the clobber follows the victim's own write at node ",
                                    (*it)->position, " in every replay"),
                       std::move(path));
    }
  }
  for (const RecordedWrite* a : own) {
    if (a->mode != AccessMode::kWrite && order.before(clobber, a->position)) {
      std::vector<std::size_t> path = order.path(clobber, a->position);
      return set_order(f, order,
                       absl::StrCat("before a read: ", describe_path(path), "; the victim's ",
                                    access_mode_name(a->mode), " by ", text(a->op),
                                    " reads the clobbered bytes with no whole write of them in "
                                    "between"),
                       std::move(path));
    }
  }
  set_order(f, order,
            absl::StrCat("no rewrite: nothing the graph does through the victim after node ",
                         clobber, " restores the clobbered bytes"));
}

// The order evidence of the stale read at node `reader` of `stale`.
void describe_stale_order(Finding& f, const IndexedRecord& r, std::size_t reader,
                          const std::vector<MemorySpan>& stale) {
  const GraphOrder& order = r.order;
  if (f.evidence == WriteEvidence::kFootprint) {
    f.order_from_edges = false;
    f.order = "none: footprint evidence places no read at any node";
    f.order_path.clear();
    return;
  }
  for (const MemorySpan& range : stale) {
    for (std::size_t i : r.writes_overlapping(range)) {
      const RecordedWrite& w = r.record.writes[i];
      if (w.mode == AccessMode::kWrite && order.unordered(w.position, reader)) {
        return set_order(f, order,
                         absl::StrCat("unordered: node ", w.position,
                                      " writes these bytes, but no path of edges orders it "
                                      "before the read at node ",
                                      reader));
      }
    }
  }
  set_order(f, order,
            absl::StrCat("no earlier write: no node on a path of edges before the read at node ",
                         reader, " writes these bytes, so they come from before the replay"));
}

}  // namespace

void find_clobbers(const IndexedRecord& r, const BlockRef& victim,
                   const std::vector<std::size_t>& candidates, std::vector<Finding>& out,
                   ClobberScratch& scratch) {
  // One finding per (graph, victim). Its writer is the last clobbering write
  // in capture order (the data a capture-order replay leaves behind); its ranges are the
  // exact bytes left clobbered (footprint: the whole overlap, an upper bound).
  Finding* f = nullptr;
  // The access that names the finding, and the bytes it left clobbered: its
  // order evidence is described once, after the loop (only the last named
  // access's description would stand).
  std::size_t named_position = 0;
  std::vector<MemorySpan>& named_left = scratch.named_left;
  named_left.clear();
  // The victim's own accesses (per candidate: those overlapping its bytes).
  const absl::Span<const std::size_t> through = r.accesses_through(victim.sequence);
  std::vector<const RecordedWrite*>& own = scratch.own;
  // Each candidate's harmed bytes, pessimistic and optimistic.
  std::vector<MemorySpan>& left = scratch.left;
  std::vector<MemorySpan>& left_optimistic = scratch.left_optimistic;
  for (std::size_t i : candidates) {
    const RecordedWrite& w = r.record.writes[i];
    if (w.mode == AccessMode::kRead) continue;  // reads never clobber
    if (w.writer.sequence == victim.sequence && victim.sequence != 0) continue;
    const MemorySpan overlap = intersect(w.span, victim.span());
    if (overlap.bytes == 0) continue;
    const bool footprint = w.evidence == WriteEvidence::kFootprint;
    own.clear();
    if (!footprint) {
      for (std::size_t k : through) {
        const RecordedWrite& a = r.record.writes[k];
        if (a.span.overlaps(overlap)) own.push_back(&a);
      }
    }
    if (footprint) {
      left.assign(1, overlap);
    } else {
      left_clobbered(r, own, overlap, w.position, /*optimistic=*/false, scratch, left);
    }
    if (left.empty()) continue;
    // Whether only a mode the evidence does not give makes this harm: the
    // clobbering access is a touch, or inferred writes would undo it. The
    // optimistic reading differs from the one above only through the
    // victim's touches: without any, it leaves the same (non-empty) bytes.
    const bool own_touches = std::any_of(own.begin(), own.end(), [](const RecordedWrite* a) {
      return a->mode == AccessMode::kTouch;
    });
    bool unknown = !footprint && w.mode == AccessMode::kTouch;
    if (!footprint && !unknown && own_touches) {
      left_clobbered(r, own, overlap, w.position, /*optimistic=*/true, scratch, left_optimistic);
      unknown = left_optimistic.empty();
    }
    Finding& g = add_to_finding(f, r, victim, Harm::kClobber, left, out);
    g.mode_unknown = (g.clobbering_writes == 1 || g.mode_unknown) && unknown;
    if (g.clobbering_writes == 1 || w.position >= g.write_position) {
      name_access(g, w);
      named_position = w.position;
      named_left.swap(left);  // `left` is refilled for the next candidate
    }
    // Footprint and touches give whole blocks: upper bounds, labelled so.
    g.ranges_exact = g.ranges_exact && w.evidence != WriteEvidence::kFootprint &&
                     w.mode != AccessMode::kTouch;
  }
  if (f != nullptr) describe_clobber_order(*f, r, victim, named_position, named_left);
}

void find_stale_reads(const IndexedRecord& r, const BlockRef& victim,
                      const std::vector<std::size_t>& candidates, std::vector<Finding>& out) {
  // One finding per (graph, victim), named after the first stale read in
  // capture order; its ranges are the bytes read from the victim. Its order
  // evidence is described once, for the access that names it.
  Finding* f = nullptr;
  std::size_t named_position = 0;
  std::vector<MemorySpan> named_stale;
  const bool victim_untouched = victim.sequence == 0 || r.accesses_through(victim.sequence).empty();
  for (std::size_t i : candidates) {
    const RecordedWrite& a = r.record.writes[i];
    if (a.mode == AccessMode::kWrite) continue;  // reads, updates and state read first
    if (a.writer.sequence == victim.sequence && victim.sequence != 0) continue;
    // A touch through a block born in this capture that comes after its
    // first use (the inferred write) is the graph using its own data. The
    // first use itself may read what the memory held (a read of an
    // uninitialized block), so it stays a possible stale read.
    if (a.mode == AccessMode::kTouch && a.writer.sequence != 0 &&
        a.writer.capture == r.record.capture && !a.inferred_write) {
      continue;
    }
    const MemorySpan overlap = intersect(a.span, victim.span());
    if (overlap.bytes == 0) continue;
    // Bytes the graph wrote earlier in this replay, through any block, are
    // its own data, not the victim's.
    const bool footprint = a.evidence == WriteEvidence::kFootprint;
    // The common case, answered from the reading block's own accesses: a
    // whole write through it, ordered before the read, covers the bytes,
    // and no access through the victim that may write those bytes can come
    // before the read (only such a write could put the victim's data back):
    // read_from_outside would find nothing stale. In a graph whose own
    // output lands on its freed transients (every layer of a model reusing
    // one address), this settles each read from the blocks' own accesses
    // instead of listing every write on its bytes.
    if (!footprint && covered_before(r, a, overlap) &&
        (victim_untouched || !victim_may_write_first(r, victim, overlap, a.position))) {
      continue;
    }
    const std::vector<MemorySpan> stale =
        footprint ? std::vector<MemorySpan>{overlap}
                  : read_from_outside(r, overlap, a.position, victim.sequence,
                                      /*optimistic=*/false);
    if (stale.empty()) continue;
    const bool unknown = !footprint && (a.mode == AccessMode::kTouch ||
                                        read_from_outside(r, overlap, a.position,
                                                          victim.sequence, true)
                                            .empty());
    Finding& g = add_to_finding(f, r, victim, Harm::kStaleRead, stale, out);
    g.mode_unknown = (g.clobbering_writes == 1 || g.mode_unknown) && unknown;
    if (g.clobbering_writes == 1 || a.position < g.write_position) {
      name_access(g, a);
      named_position = a.position;
      named_stale = stale;
    }
    g.ranges_exact = g.ranges_exact && a.evidence != WriteEvidence::kFootprint &&
                     a.mode != AccessMode::kTouch;
  }
  if (f != nullptr) describe_stale_order(*f, r, named_position, named_stale);
}

}  // namespace capalloc::detail
