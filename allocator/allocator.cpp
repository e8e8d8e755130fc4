// allocator/allocator.cpp: the Allocator's policy over its pools.
//
// One mutex guards everything (as PyTorch's per-device allocator does per
// device); runtime calls made under it never call back into the allocator.
//
// What this file owns:
//  - the pointer table: every allocated block by address (pending-free
//    blocks are not in it; a second free of them is a double free);
//  - the segment map per device, ordered by address, to diagnose pointers
//    capalloc did not hand out and pointers into the middle of a block;
//  - pending frees: a block used on other streams is freed only when events
//    recorded on those streams at free time have completed. They are polled
//    (never waited for) on each allocation while any are pending;
//  - the out-of-memory policy: release cached segments, retry once, then
//    fail with the request, the device and its reserved/allocated bytes.
//
// Hot path cost (steady state, no pending frees): allocate = lock, one hash
// lookup for the stream's free index, FreeIndex::find (two bit scans), at
// most one split, one hash insert; deallocate = lock, one hash find+erase, at
// most two merges, one FreeIndex::insert. No heap allocation once the block
// arena and the pointer table have grown to the working set.
#include <algorithm>
#include <bit>
#include <limits>
#include <mutex>
#include <string>
#include <vector>

#include "absl/container/btree_map.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "allocator/block.hpp"
#include "allocator/format.hpp"
#include "allocator/log.hpp"
#include "allocator/pool.hpp"
#include "capalloc/allocator.hpp"

namespace capalloc {

using detail::Block;
using detail::Pool;
using detail::Segment;

namespace {

// Interned block tags: id 0 is the empty tag.
class TagTable {
 public:
  std::uint32_t intern(std::string_view tag) {
    if (tag.empty()) return 0;
    // Debian's Abseil has its own string_view type, hence the conversion.
    auto it = ids_.find(absl::string_view(tag.data(), tag.size()));
    if (it != ids_.end()) return it->second;
    names_.emplace_back(tag);
    const auto id = static_cast<std::uint32_t>(names_.size());
    ids_.emplace(names_.back(), id);
    return id;
  }
  std::string name(std::uint32_t id) const { return id == 0 ? std::string() : names_[id - 1]; }

 private:
  std::vector<std::string> names_;
  absl::flat_hash_map<std::string, std::uint32_t> ids_;
};

struct PendingEvent {
  Block* block;
  EventHandle event;
  int device;
};

}  // namespace

struct DeviceState {
  std::unique_ptr<Pool> default_pool;
  absl::btree_map<std::uintptr_t, Segment*> segments;  // by base address
  std::vector<EventHandle> spare_events;
};

struct Allocator::Impl {
  std::shared_ptr<DeviceRuntime> runtime;
  AllocatorOptions options;
  detail::SizePolicy policy;

  mutable std::mutex mu;
  detail::BlockArena arena;
  std::vector<DeviceState> devices;
  absl::flat_hash_map<std::uintptr_t, Block*> live;
  std::vector<PendingEvent> pending;
  TagTable tags;
  std::uint64_t next_sequence = 1;

  ~Impl();
  absl::Status check_device(int device) const;
  Block* find_block_containing(std::uintptr_t addr) const;
  absl::Status diagnose_unknown(const void* ptr, std::string_view call) const;
  absl::StatusOr<Block*> take_new_segment(Pool& pool, int device, StreamHandle stream,
                                          std::size_t rounded, std::size_t requested);
  absl::StatusOr<void*> reserve_relaxed(int device, std::size_t bytes);
  void process_pending();
  absl::Status release_free_segments(int device);
  absl::StatusOr<EventHandle> acquire_event(int device);
  AllocatorStats device_stats(int device) const;
  BlockInfo info_of(const Block& block) const;
};

Allocator::Impl::~Impl() {
  // Events of pending frees go back to the runtime; segments go back too.
  for (const PendingEvent& p : pending) runtime->destroy_event(p.event).IgnoreError();
  for (std::size_t d = 0; d < devices.size(); ++d) {
    DeviceState& state = devices[d];
    for (EventHandle e : state.spare_events) runtime->destroy_event(e).IgnoreError();
    if (state.default_pool) {
      for (const auto& segment : state.default_pool->segments()) {
        runtime->release(static_cast<int>(d), reinterpret_cast<void*>(segment->base),
                         segment->size)
            .IgnoreError();
      }
    }
  }
  live.clear();
  for (DeviceState& state : devices) state.default_pool.reset();
}

absl::Status Allocator::Impl::check_device(int device) const {
  if (device < 0 || device >= static_cast<int>(devices.size())) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "device %d does not exist: the %s runtime has %d device(s)", device, runtime->name(),
        devices.size()));
  }
  return absl::OkStatus();
}

Block* Allocator::Impl::find_block_containing(std::uintptr_t addr) const {
  for (const DeviceState& state : devices) {
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
  if (b == nullptr) {
    return absl::NotFoundError(
        absl::StrFormat("%s(%p): capalloc did not allocate this pointer", call, ptr));
  }
  if (b->addr != addr) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s(%p): pointer is %d bytes into the %s block at %p (%d bytes, device %d); pass the "
        "block's start address",
        call, ptr, addr - b->addr, detail::state_name(b->state), b->ptr(), b->size,
        b->segment->device));
  }
  return absl::FailedPreconditionError(absl::StrFormat(
      "%s(%p): block is already %s (double free or use after free; size %d, device %d)", call,
      ptr, b->state == BlockState::kFree ? "free" : "freed and waiting on stream events", b->size,
      b->segment->device));
}

absl::StatusOr<void*> Allocator::Impl::reserve_relaxed(int device, std::size_t bytes) {
  // A reservation during someone's capture must not invalidate it: relaxed
  // mode, as PyTorch uses around cudaMalloc.
  const CaptureMode old = runtime->exchange_thread_capture_mode(CaptureMode::kRelaxed);
  auto result = runtime->reserve(device, bytes);
  runtime->exchange_thread_capture_mode(old);
  return result;
}

absl::StatusOr<Block*> Allocator::Impl::take_new_segment(Pool& pool, int device,
                                                         StreamHandle stream, std::size_t rounded,
                                                         std::size_t requested) {
  AllocatorStats& stats = pool.mutable_stats();
  const std::size_t segment_bytes = policy.segment_bytes_for(rounded);
  auto out_of_memory = [&](std::string_view why) {
    ++stats.ooms;
    const AllocatorStats now = device_stats(device);
    return absl::ResourceExhaustedError(absl::StrFormat(
        "out of memory: requested %s (rounded to %s) on device %d of the %s runtime, stream "
        "0x%x: %s. Device %d has %s reserved by capalloc, %s allocated, %s cached free.",
        detail::bytes(requested), detail::bytes(rounded), device, runtime->name(), stream, why,
        device, detail::bytes(now.reserved_bytes.current), detail::bytes(now.allocated_bytes.current),
        detail::bytes(now.reserved_bytes.current - now.allocated_bytes.current)));
  };
  if (auto info = runtime->memory_info(device); info.ok() && rounded > info->total_bytes) {
    return out_of_memory(absl::StrCat("the device has only ", detail::bytes(info->total_bytes),
                                      " in all"));
  }
  auto base = reserve_relaxed(device, segment_bytes);
  if (!base.ok() && absl::IsResourceExhausted(base.status())) {
    ++stats.retries;
    process_pending();
    release_free_segments(device).IgnoreError();
    base = reserve_relaxed(device, segment_bytes);
    if (!base.ok() && absl::IsResourceExhausted(base.status())) {
      return out_of_memory(absl::StrCat("the runtime refused a ", detail::bytes(segment_bytes),
                                        " segment after the cache was released (",
                                        base.status().message(), ")"));
    }
  }
  if (!base.ok()) return base.status();
  Block* block = pool.take_from_new_segment(*base, segment_bytes, stream, rounded, requested);
  devices[device].segments.emplace(block->segment->base, block->segment);
  return block;
}

absl::StatusOr<EventHandle> Allocator::Impl::acquire_event(int device) {
  auto& spare = devices[device].spare_events;
  if (!spare.empty()) {
    EventHandle e = spare.back();
    spare.pop_back();
    return e;
  }
  return runtime->create_event(device);
}

void Allocator::Impl::process_pending() {
  auto keep = pending.begin();
  for (auto it = pending.begin(); it != pending.end(); ++it) {
    auto done = runtime->query_event(it->event);
    if (!done.ok() || !*done) {
      *keep++ = *it;
      continue;
    }
    devices[it->device].spare_events.push_back(it->event);
    if (--it->block->pending_events == 0) it->block->segment->pool->give_back(it->block);
  }
  pending.erase(keep, pending.end());
}

absl::Status Allocator::Impl::release_free_segments(int device) {
  DeviceState& state = devices[device];
  std::vector<detail::SegmentRange> ranges;
  state.default_pool->take_free_segments(ranges);
  for (const auto& range : ranges) state.segments.erase(reinterpret_cast<std::uintptr_t>(range.base));
  absl::Status first_error;
  for (const auto& range : ranges) {
    absl::Status s = runtime->release(device, range.base, range.bytes);
    if (!s.ok()) {
      detail::log().error("releasing segment {} of {} bytes failed: {}", range.base, range.bytes,
                          s.ToString());
      first_error.Update(s);
    }
  }
  return first_error;
}

AllocatorStats Allocator::Impl::device_stats(int device) const {
  return devices[device].default_pool->stats();
}

BlockInfo Allocator::Impl::info_of(const Block& b) const {
  BlockInfo info;
  info.ptr = b.ptr();
  info.size = b.size;
  info.requested = b.requested;
  info.device = b.segment->device;
  info.stream = b.segment->stream;
  info.state = b.state;
  info.lifetime = b.lifetime;
  info.tag = tags.name(b.tag_id);
  info.sequence = b.sequence;
  return info;
}

// --- Public API ---------------------------------------------------------------

absl::StatusOr<std::unique_ptr<Allocator>> Allocator::create(std::shared_ptr<DeviceRuntime> runtime,
                                                             AllocatorOptions options) {
  if (runtime == nullptr) return absl::InvalidArgumentError("Allocator::create: runtime is null");
  if (options.round_granularity < 256 || !std::has_single_bit(options.round_granularity)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "round_granularity %d must be a power of two of at least 256", options.round_granularity));
  }
  if (options.small_segment_bytes < options.small_request_limit ||
      options.large_segment_bytes < options.medium_request_limit ||
      options.small_request_limit > options.medium_request_limit ||
      options.small_segment_bytes % options.round_granularity != 0 ||
      options.large_segment_bytes % options.round_granularity != 0) {
    return absl::InvalidArgumentError(
        "segment sizes must hold their size class's largest request and be multiples of the "
        "granularity");
  }
  const int device_count = runtime->device_count();
  if (device_count <= 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("the ", std::string(runtime->name()), " runtime reports no device"));
  }
  auto impl = std::make_unique<Impl>();
  impl->runtime = std::move(runtime);
  impl->options = options;
  impl->policy = detail::SizePolicy::from(options);
  impl->devices.resize(static_cast<std::size_t>(device_count));
  for (int d = 0; d < device_count; ++d) {
    impl->devices[d].default_pool = std::make_unique<Pool>(d, impl->policy, impl->arena);
  }
  return std::unique_ptr<Allocator>(new Allocator(std::move(impl)));
}

Allocator::Allocator(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Allocator::~Allocator() = default;

DeviceRuntime& Allocator::runtime() const { return *impl_->runtime; }
const AllocatorOptions& Allocator::options() const { return impl_->options; }

absl::StatusOr<void*> Allocator::allocate(std::size_t bytes, int device, StreamHandle stream,
                                          AllocOptions options) {
  Impl& m = *impl_;
  if (bytes == 0) {
    return absl::InvalidArgumentError("allocate: size 0; a zero-byte block has no address to give");
  }
  const std::size_t granularity = m.policy.granularity;
  if (bytes > std::numeric_limits<std::size_t>::max() / 2) {
    return absl::InvalidArgumentError(
        absl::StrFormat("allocate: size %d bytes is not a plausible request", bytes));
  }
  const std::size_t rounded = (bytes + granularity - 1) & ~(granularity - 1);
  std::lock_guard lock(m.mu);
  if (absl::Status s = m.check_device(device); !s.ok()) return s;
  if (!m.pending.empty()) m.process_pending();
  Pool& pool = *m.devices[device].default_pool;
  Block* block = pool.take(stream, rounded, bytes);
  if (block == nullptr) {
    auto fresh = m.take_new_segment(pool, device, stream, rounded, bytes);
    if (!fresh.ok()) return fresh.status();
    block = *fresh;
  }
  block->lifetime = options.lifetime;
  block->tag_id = m.tags.intern(options.tag);
  block->sequence = m.next_sequence++;
  m.live.emplace(block->addr, block);
  return reinterpret_cast<void*>(block->addr);
}

absl::Status Allocator::deallocate(void* ptr, int device) {
  Impl& m = *impl_;
  if (ptr == nullptr) return absl::InvalidArgumentError("deallocate: null pointer");
  std::lock_guard lock(m.mu);
  auto it = m.live.find(reinterpret_cast<std::uintptr_t>(ptr));
  if (it == m.live.end()) return m.diagnose_unknown(ptr, "deallocate");
  Block* block = it->second;
  if (device != kAnyDevice && device != block->segment->device) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "deallocate(%p): the block belongs to device %d, not device %d", ptr,
        block->segment->device, device));
  }
  Pool& pool = *block->segment->pool;
  if (block->used_on.empty()) {
    m.live.erase(it);
    pool.give_back(block);
    return absl::OkStatus();
  }
  // Record an event on every other stream the block was used on; the block
  // is reusable once all have completed. All or nothing: a failure leaves
  // the block allocated.
  const int owner_device = block->segment->device;
  const std::size_t first_new = m.pending.size();
  for (StreamHandle s : block->used_on) {
    auto event = m.acquire_event(owner_device);
    absl::Status status = event.ok() ? m.runtime->record_event(*event, s) : event.status();
    if (!status.ok()) {
      if (event.ok()) m.devices[owner_device].spare_events.push_back(*event);
      for (std::size_t i = first_new; i < m.pending.size(); ++i) {
        m.devices[owner_device].spare_events.push_back(m.pending[i].event);
      }
      m.pending.resize(first_new);
      return absl::Status(status.code(),
                          absl::StrFormat("deallocate(%p): recording an event on stream 0x%x "
                                          "failed, block left allocated: %s",
                                          ptr, s, status.message()));
    }
    m.pending.push_back({block, *event, owner_device});
  }
  block->pending_events = static_cast<std::uint32_t>(block->used_on.size());
  m.live.erase(it);
  pool.mark_pending(block);
  return absl::OkStatus();
}

absl::Status Allocator::record_stream(void* ptr, StreamHandle stream) {
  Impl& m = *impl_;
  std::lock_guard lock(m.mu);
  auto it = m.live.find(reinterpret_cast<std::uintptr_t>(ptr));
  if (it == m.live.end()) return m.diagnose_unknown(ptr, "record_stream");
  Block* block = it->second;
  if (stream == block->segment->stream) return absl::OkStatus();
  if (std::find(block->used_on.begin(), block->used_on.end(), stream) != block->used_on.end()) {
    return absl::OkStatus();
  }
  // Validate the stream now: an unusable stream discovered at free time would
  // leave the block impossible to free.
  if (auto info = m.runtime->capture_info(stream); !info.ok()) {
    return absl::Status(info.status().code(),
                        absl::StrFormat("record_stream(%p, 0x%x): %s", ptr, stream,
                                        info.status().message()));
  }
  block->used_on.push_back(stream);
  return absl::OkStatus();
}

absl::Status Allocator::empty_cache(int device) {
  Impl& m = *impl_;
  std::lock_guard lock(m.mu);
  if (device != kAnyDevice) {
    if (absl::Status s = m.check_device(device); !s.ok()) return s;
  }
  m.process_pending();
  absl::Status result;
  for (int d = 0; d < static_cast<int>(m.devices.size()); ++d) {
    if (device == kAnyDevice || device == d) result.Update(m.release_free_segments(d));
  }
  return result;
}

absl::StatusOr<AllocatorStats> Allocator::stats(int device) const {
  const Impl& m = *impl_;
  std::lock_guard lock(m.mu);
  if (absl::Status s = m.check_device(device); !s.ok()) return s;
  return m.device_stats(device);
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

absl::Status Allocator::CheckInvariants() const {
  const Impl& m = *impl_;
  std::lock_guard lock(m.mu);
  std::size_t allocated = 0;
  for (std::size_t d = 0; d < m.devices.size(); ++d) {
    const DeviceState& state = m.devices[d];
    const Pool& pool = *state.default_pool;
    if (absl::Status s = pool.check_invariants(); !s.ok()) {
      return absl::InternalError(absl::StrCat("device ", d, ": ", s.message()));
    }
    if (state.segments.size() != pool.segments().size()) {
      return absl::InternalError(absl::StrFormat("device %d: segment map holds %d, pool %d", d,
                                                 state.segments.size(), pool.segments().size()));
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
        auto it = m.live.find(b->addr);
        if (it == m.live.end() || it->second != b) {
          return absl::InternalError(
              absl::StrFormat("allocated block 0x%x is missing from the pointer table", b->addr));
        }
      }
    }
  }
  if (allocated != m.live.size()) {
    return absl::InternalError(absl::StrFormat(
        "pointer table holds %d blocks, the segments %d allocated", m.live.size(), allocated));
  }
  absl::flat_hash_map<const Block*, std::uint32_t> pending_counts;
  for (const PendingEvent& p : m.pending) ++pending_counts[p.block];
  for (const auto& [block, count] : pending_counts) {
    if (block->state != BlockState::kPendingFree || block->pending_events != count) {
      return absl::InternalError(absl::StrFormat(
          "pending block 0x%x: state %s, %d events expected, %d queued", block->addr,
          detail::state_name(block->state), block->pending_events, count));
    }
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
    absl::StrAppend(&out, "device ", d, ": ", detail::describe_stats(m.device_stats(static_cast<int>(d))),
                    "\n");
  }
  return out;
}

}  // namespace capalloc
