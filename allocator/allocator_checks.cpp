// allocator/allocator_checks.cpp: what the Allocator says about itself:
// diagnosis of pointers it did not hand out, block lookups, the invariant
// check and the one-paragraph description. None of it is on a hot path.
#include <algorithm>
#include <iterator>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "allocator/allocator_impl.hpp"
#include "common/format.hpp"

namespace capalloc {

using detail::Block;
using detail::Pool;
using detail::Segment;

Block* Allocator::Impl::find_block_containing(std::uintptr_t addr) const {
  for (const detail::DeviceState& state : devices) {
    auto it = state.segments.upper_bound(addr);
    if (it == state.segments.begin()) continue;
    const Segment* segment = std::prev(it)->second;
    if (addr >= segment->base + segment->size) continue;
    for (Block* b = segment->first; b != nullptr; b = b->next) {
      if (addr >= b->addr && addr < b->addr + b->size) return b;
    }
  }
  return nullptr;
}

absl::Status Allocator::Impl::diagnose_unknown(const void* ptr, std::string_view call) const {
  const auto addr = reinterpret_cast<std::uintptr_t>(ptr);
  const Block* b = find_block_containing(addr);
  const std::string name(call);
  if (b == nullptr) {
    return absl::NotFoundError(
        absl::StrFormat("%s(%p): capalloc did not allocate this pointer", name, ptr));
  }
  if (b->addr != addr) {
    // Inside a free block: either a pointer into memory nobody holds, or a
    // block freed already whose neighbour's free merged it away. The
    // allocator keeps no record that tells the two apart, so the message
    // names both.
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s(%p): pointer is %d bytes into the %s block at %p (%d bytes, device %d); pass the "
        "block's start address%s",
        name, ptr, addr - b->addr, detail::state_name(b->state), b->ptr(), b->size,
        b->segment->device,
        b->state == BlockState::kFree
            ? " (if allocate() returned this pointer, it was freed already and has merged "
              "with a free neighbour: a double free)"
            : ""));
  }
  if (b->state == BlockState::kFree && !b->handed_out) {
    return absl::NotFoundError(absl::StrFormat(
        "%s(%p): capalloc did not hand out this pointer: it is the start of %d bytes of free "
        "memory in a segment of device %d (a remainder of a split, or a freed block merged with "
        "it), not an address allocate() returned",
        name, ptr, b->size, b->segment->device));
  }
  return absl::FailedPreconditionError(absl::StrFormat(
      "%s(%p): block is already %s (double free or use after free; size %d, device %d)", name,
      ptr, b->state == BlockState::kFree ? "free" : "freed and waiting on stream events", b->size,
      b->segment->device));
}

absl::StatusOr<BlockInfo> Allocator::block_info(const void* ptr) const {
  const Impl& m = *impl_;
  std::lock_guard lock(m.mu);
  const Block* b = m.find_block_containing(reinterpret_cast<std::uintptr_t>(ptr));
  if (b == nullptr) {
    return absl::NotFoundError(
        absl::StrFormat("block_info(%p): capalloc did not allocate this pointer", ptr));
  }
  return m.info_of(*b);
}

std::vector<SegmentInfo> Allocator::segments(int device) const {
  const Impl& m = *impl_;
  std::vector<SegmentInfo> out;
  if (!m.check_device(device).ok()) return out;
  std::lock_guard lock(m.mu);
  out.reserve(m.devices[device].segments.size());
  for (const auto& [base, segment] : m.devices[device].segments) {
    SegmentInfo info;
    info.base = reinterpret_cast<const void*>(segment->base);
    info.size = segment->size;
    info.device = segment->device;
    info.stream = segment->stream;
    info.pool = segment->pool->handle();
    for (const Block* b = segment->first; b != nullptr; b = b->next) {
      info.blocks.push_back(m.info_of(*b));
    }
    out.push_back(std::move(info));
  }
  return out;
}

std::vector<BlockInfo> Allocator::live_blocks(int device, std::vector<MemorySpan> spans) const {
  const Impl& m = *impl_;
  std::vector<BlockInfo> out;
  if (!m.check_device(device).ok() || spans.empty()) return out;
  std::sort(spans.begin(), spans.end(),
            [](const MemorySpan& a, const MemorySpan& b) { return a.begin() < b.begin(); });
  std::lock_guard lock(m.mu);
  const auto& segments = m.devices[device].segments;
  // One pass in address order over the segments the spans touch; `span_at`
  // only moves forward, so the cost is blocks walked plus spans.
  std::size_t span_at = 0;
  const Block* last_reported = nullptr;
  auto seg_it = segments.upper_bound(spans.front().begin());
  if (seg_it != segments.begin()) --seg_it;
  for (; seg_it != segments.end() && span_at < spans.size(); ++seg_it) {
    const Segment* segment = seg_it->second;
    const std::uintptr_t seg_end = segment->base + segment->size;
    while (span_at < spans.size() && spans[span_at].end() <= segment->base) ++span_at;
    if (span_at == spans.size()) break;
    if (spans[span_at].begin() >= seg_end) {
      // Jump to the segment holding the next span.
      auto next = segments.upper_bound(spans[span_at].begin());
      if (next != segments.begin()) --next;
      if (next->first > seg_it->first) seg_it = std::prev(next);
      continue;
    }
    for (const Block* b = segment->first; b != nullptr && span_at < spans.size(); b = b->next) {
      const MemorySpan block_span{b->ptr(), b->size};
      while (span_at < spans.size() && spans[span_at].end() <= block_span.begin()) ++span_at;
      if (span_at == spans.size()) break;
      // Spans are sorted by start; any span overlapping this block starts
      // before the block ends. Look ahead without consuming.
      for (std::size_t k = span_at; k < spans.size() && spans[k].begin() < block_span.end(); ++k) {
        if (spans[k].overlaps(block_span)) {
          if (b->state == BlockState::kAllocated && b != last_reported) {
            out.push_back(m.info_of(*b));
            last_reported = b;
          }
          break;
        }
      }
    }
  }
  return out;
}

absl::Status Allocator::CheckInvariants() const {
  const Impl& m = *impl_;
  std::lock_guard lock(m.mu);
  std::size_t allocated = 0;
  for (std::size_t d = 0; d < m.devices.size(); ++d) {
    const detail::DeviceState& state = m.devices[d];
    std::vector<const Pool*> pools = {state.default_pool.get()};
    for (const auto& [handle, pool] : state.graph_pools) pools.push_back(pool.get());
    std::size_t pool_segments = 0;
    for (const Pool* pool : pools) {
      if (absl::Status s = pool->check_invariants(); !s.ok()) {
        return absl::InternalError(absl::StrCat("device ", d, ", pool ", pool->handle(), ": ",
                                                std::string(s.message())));
      }
      pool_segments += pool->segments().size();
      // A graph pool with no reference and no block goes as soon as its
      // segments do (maybe_destroy_pool). Segments that a live graph's
      // record reads or writes stay mapped, and the pool with them, until
      // empty_cache finds them unused, and so do segments the runtime failed
      // to release (Pool::kept_for_segments): such a pool is expected, one
      // without segments is not.
      if (pool->is_graph_pool() && !pool->referenced() && pool->blocks_in_use() == 0 &&
          pool->segments().empty()) {
        return absl::InternalError(absl::StrFormat(
            "device %d: graph pool %d has no reference, no block and no segment yet was not "
            "destroyed",
            d, pool->handle()));
      }
    }
    if (state.segments.size() != pool_segments) {
      return absl::InternalError(absl::StrFormat("device %d: segment map holds %d, pools %d", d,
                                                 state.segments.size(), pool_segments));
    }
    std::uintptr_t previous_end = 0;
    for (const auto& [base, segment] : state.segments) {
      if (base < previous_end) {
        return absl::InternalError(absl::StrFormat("device %d: segments overlap at 0x%x", d, base));
      }
      previous_end = base + segment->size;
      for (const Block* b = segment->first; b != nullptr; b = b->next) {
        if (b->state != BlockState::kAllocated) continue;
        ++allocated;
        if (m.find_live(b->addr) != b) {
          return absl::InternalError(
              absl::StrFormat("allocated block 0x%x is missing from the pointer table", b->addr));
        }
      }
    }
  }
  if (allocated != m.live_count()) {
    return absl::InternalError(absl::StrFormat(
        "pointer tables hold %d blocks, the segments %d allocated", m.live_count(), allocated));
  }
  if (absl::Status s = m.check_shards(); !s.ok()) return s;
  // The table of known streams found before holds known streams, each with
  // its device, in its own slot (or the default stream: an empty slot).
  for (std::size_t slot = 0; slot < std::size(m.seen_streams); ++slot) {
    const Impl::SeenStream& seen = m.seen_streams[slot];
    if (seen.stream == kDefaultStream) continue;
    auto known = m.known_streams.find(seen.stream);
    if (Impl::seen_stream_slot(seen.stream) != slot || known == m.known_streams.end() ||
        known->second != seen.device) {
      return absl::InternalError(absl::StrFormat(
          "slot %d of the known streams found before names stream 0x%x, which is not known "
          "there with device %d",
          slot, seen.stream, seen.device));
    }
  }
  absl::flat_hash_map<const Block*, std::uint32_t> pending_counts;
  for (const auto& p : m.pending) ++pending_counts[p.block];
  for (const auto& [block, count] : pending_counts) {
    if (block->state != BlockState::kPendingFree || block->pending_events != count) {
      return absl::InternalError(absl::StrFormat(
          "pending block 0x%x: state %s, %d events expected, %d queued", block->addr,
          detail::state_name(block->state), block->pending_events, count));
    }
  }
  for (const Block* block : m.deferred) {
    if (block->state != BlockState::kPendingFree || pending_counts.contains(block)) {
      return absl::InternalError(absl::StrFormat(
          "deferred block 0x%x is %s or also has events queued", block->addr,
          detail::state_name(block->state)));
    }
  }
  std::vector<int> routes_by_device(m.devices.size(), 0);
  for (const auto& [id, route] : m.routes) {
    if (route.pool == nullptr || route.pool->route_refs <= 0) {
      return absl::InternalError(
          absl::StrFormat("capture %d routes to a pool without a reference", id));
    }
    ++routes_by_device[static_cast<std::size_t>(route.device)];
  }
  for (std::size_t d = 0; d < m.devices.size(); ++d) {
    if (m.devices[d].routes != routes_by_device[d]) {
      return absl::InternalError(absl::StrFormat("device %d counts %d routes; %d route there", d,
                                                 m.devices[d].routes, routes_by_device[d]));
    }
  }
  if (m.routed_captures.load() != static_cast<int>(m.routes.size())) {
    return absl::InternalError(absl::StrFormat("routed_captures is %d; there are %d routes",
                                               m.routed_captures.load(), m.routes.size()));
  }
  return absl::OkStatus();
}

std::string Allocator::describe() const {
  const Impl& m = *impl_;
  std::lock_guard lock(m.mu);
  std::string out = absl::StrFormat(
      "capalloc on the %s runtime, %d device(s); sizes round to %s; small requests (<= %s) share "
      "%s segments, medium (<= %s) share %s segments, larger ones get their own.\n",
      m.runtime->name(), m.devices.size(), detail::bytes(m.policy.granularity),
      detail::bytes(m.policy.small_request_limit), detail::bytes(m.policy.small_segment_bytes),
      detail::bytes(m.policy.medium_request_limit), detail::bytes(m.policy.large_segment_bytes));
  for (std::size_t d = 0; d < m.devices.size(); ++d) {
    absl::StrAppend(&out, "device ", d, ": ",
                    detail::describe_stats(m.device_stats(static_cast<int>(d))), "\n");
    for (const auto& [handle, pool] : m.devices[d].graph_pools) {
      absl::StrAppend(&out, "  graph pool ", handle, " (", pool->handle_refs, " handle, ",
                      pool->route_refs, " route and ", pool->graph_holds.size(), " graph refs): ",
                      detail::describe_stats(pool->stats()), "\n");
    }
  }
  return out;
}

}  // namespace capalloc
