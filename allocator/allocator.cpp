// allocator/allocator.cpp: allocation, free, record_stream and stats (frees
// that wait on other streams are in pending_frees.cpp); see
// allocator_impl.hpp for the state and its invariants.
//
// The steady-state allocation and free (no capture, nothing pending) are
// in steady_state.hpp, inline for their callers here and in c_api.cpp: the
// lock once, a quick-cache pop or push (else the free index with a split or
// merges), one pointer-table insert or find+erase. No heap allocation once
// the block arena and the pointer table have grown to the working set, and
// no listener call, log line or capture bookkeeping outside captures.
#include <algorithm>
#include <bit>
#include <limits>
#include <mutex>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "allocator/allocator_impl.hpp"
#include "allocator/listener_lock.hpp"
#include "allocator/steady_state.hpp"
#include "allocator/trace_hooks.hpp"
#include "common/format.hpp"
#include "common/guarded.hpp"
#include "common/log.hpp"

namespace capalloc {

using detail::Block;
using detail::Pool;


Allocator::Impl::~Impl() {
  // The last chance to give these back: what the runtime fails to take is
  // left to it (a failed cudaFree frees nothing), and said.
  auto destroy_event = [&](EventHandle e) {
    if (absl::Status s = runtime->destroy_event(e); !s.ok()) {
      detail::log().error("allocator teardown: destroying event {:#x} failed, left to the "
                          "runtime: {}",
                          e, s.ToString());
    }
  };
  for (const auto& p : pending) destroy_event(p.event);
  for (std::size_t d = 0; d < devices.size(); ++d) {
    detail::DeviceState& state = devices[d];
    for (EventHandle e : state.spare_events) destroy_event(e);
    for (const auto& [base, segment] : state.segments) {
      if (absl::Status s = runtime->release(static_cast<int>(d), reinterpret_cast<void*>(base),
                                            segment->size);
          !s.ok()) {
        detail::log().error("allocator teardown: releasing segment {:#x} of {} bytes on device "
                            "{} failed, left to the runtime: {}",
                            base, segment->size, d, s.ToString());
      }
    }
  }
  live.clear();
  for (auto& state : devices) {
    state.graph_pools.clear();
    state.default_pool.reset();
  }
}

absl::Status Allocator::Impl::refuse_persistent(int device, StreamHandle stream,
                                                std::size_t bytes, std::string_view tag,
                                                const detail::CaptureContext& ctx) {
  CaptureId capture = ctx.capture;
  std::string where = absl::StrFormat("stream 0x%x is capturing", stream);
  if (capture == 0) {
    if (options.capture_guard_scope == CaptureGuardScope::kStream || !ctx.device_may_capture) {
      return absl::OkStatus();
    }
    capture = active_capture_on(device);
    if (capture == 0) return absl::OkStatus();
    where = absl::StrFormat("capture %d is active on device %d", capture, device);
  }
  return absl::FailedPreconditionError(absl::StrFormat(
      "persistent allocation '%s' (%s on device %d) refused: %s (capture %d). A block that "
      "must outlive graph replays cannot be allocated during a capture: it may take an address "
      "the graph's replays write. Fix: preallocate it during warmup, before any capture "
      "(PersistentCache::preallocate(%d, \"%s\", %d)).",
      tag.empty() ? "<untagged>" : std::string(tag), detail::bytes(bytes), device, where,
      capture, device, std::string(tag), bytes));
}

void Allocator::Impl::notify(BlockEvent::Kind kind, const Block& block, CaptureId capture,
                             std::size_t position, std::uintptr_t graph) {
  if (listener == nullptr) return;
  const BlockEvent event = event_of(kind, block, capture, position, graph);
  listener->on_block_event(event);
}

// Built in place: info_of's prvalue initializes `block` directly (no
// BlockInfo built apart and copied in, whose wide loads spanned the narrow
// stores that had just built it: a failed store-to-load forward on every
// event, perf on part 1 of capalloc_bench_capture), and every member is
// named (one left to its default initializer made GCC zero the whole event
// with a rep stos first).
BlockEvent Allocator::Impl::event_of(BlockEvent::Kind kind, const Block& b, CaptureId capture,
                                     std::size_t position, std::uintptr_t graph) const {
  return BlockEvent{.kind = kind,
                    .block = info_of(b),
                    .capture = capture,
                    .position = position,
                    .capture_graph = graph};
}

AllocatorStats Allocator::Impl::device_stats(int device) const {
  const detail::DeviceState& state = devices[device];
  AllocatorStats total = state.default_pool->stats();
  auto add = [](StatCounter& into, const StatCounter& from) {
    into.current += from.current;
    into.peak += from.peak;  // an upper bound: pools peak at different times
  };
  // Destroyed graph pools add their cumulative counters (their current
  // values are 0: a pool goes only when empty).
  std::vector<const AllocatorStats*> pools = {&state.retired_pools};
  for (const auto& [handle, pool] : state.graph_pools) pools.push_back(&pool->stats());
  for (const AllocatorStats* from : pools) {
    const AllocatorStats& s = *from;
    add(total.allocated_bytes, s.allocated_bytes);
    add(total.requested_bytes, s.requested_bytes);
    add(total.reserved_bytes, s.reserved_bytes);
    add(total.segments, s.segments);
    add(total.allocated_blocks, s.allocated_blocks);
    total.free_blocks += s.free_blocks;
    total.pending_free_blocks += s.pending_free_blocks;
    total.allocations += s.allocations;
    total.frees += s.frees;
    total.retries += s.retries;
    total.ooms += s.ooms;
  }
  return total;
}

// --- Public API ---------------------------------------------------------------

absl::StatusOr<std::unique_ptr<Allocator>> Allocator::create(std::shared_ptr<MemoryRuntime> runtime,
                                                             AllocatorOptions options) {
  if (runtime == nullptr) return absl::InvalidArgumentError("Allocator::create: runtime is null");
  if (options.round_granularity < 256 || !std::has_single_bit(options.round_granularity)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "round_granularity %d must be a power of two of at least 256", options.round_granularity));
  }
  if (options.small_segment_bytes % options.round_granularity != 0 ||
      options.large_segment_bytes % options.round_granularity != 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "round_granularity %d must divide the segment sizes (small_segment_bytes %d, "
        "large_segment_bytes %d): with the default segments, at most 2 MiB",
        options.round_granularity, options.small_segment_bytes, options.large_segment_bytes));
  }
  if (options.small_segment_bytes < options.small_request_limit ||
      options.large_segment_bytes < options.medium_request_limit ||
      options.small_request_limit > options.medium_request_limit) {
    return absl::InvalidArgumentError(
        "segment sizes must hold their size class's largest request");
  }
  const int device_count = runtime->device_count();
  if (device_count <= 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("the ", std::string(runtime->name()), " runtime reports no device"));
  }
  auto impl = std::make_unique<Impl>();
  impl->device_runtime = dynamic_cast<DeviceRuntime*>(runtime.get());
  impl->runtime = std::move(runtime);
  impl->options = options;
  impl->policy = detail::SizePolicy::from(options);
  impl->devices.resize(static_cast<std::size_t>(device_count));
  for (int d = 0; d < device_count; ++d) {
    impl->devices[d].default_pool =
        std::make_unique<Pool>(d, kDefaultPool, impl->policy, impl->arena);
  }
  if (absl::Status s = impl->start_observing(options); !s.ok()) return s;
  // The watcher only queues (it runs inside the runtime's destroy_stream),
  // and lets go once the allocator is gone.
  std::weak_ptr<detail::GoneStreams> weak = impl->gone_streams;
  impl->runtime->watch_stream_destruction([weak](StreamHandle stream) {
    auto gone = weak.lock();
    if (gone == nullptr) return false;
    std::lock_guard lock(gone->mu);
    gone->streams.push_back(stream);
    gone->any.store(true, std::memory_order_release);
    return true;
  });
  return std::unique_ptr<Allocator>(new Allocator(std::move(impl)));
}

Allocator::Allocator(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Allocator::~Allocator() = default;

MemoryRuntime& Allocator::runtime() const { return *impl_->runtime; }

DeviceRuntime* Allocator::device_runtime() const { return impl_->device_runtime; }
const AllocatorOptions& Allocator::options() const { return impl_->options; }

absl::StatusOr<void*> Allocator::allocate(std::size_t bytes, int device, StreamHandle stream,
                                          AllocOptions options) {
  return detail::guarded("allocate", [&] {
    return impl_->allocate(bytes, device, stream, options, /*cache_tried=*/false);
  });
}

absl::StatusOr<void*> Allocator::Impl::allocate(std::size_t bytes, int device,
                                                StreamHandle stream, const AllocOptions& request,
                                                bool cache_tried) {
  Impl& m = *this;
  if (bytes == 0) {
    return absl::InvalidArgumentError("allocate: size 0; a zero-byte block has no address to give");
  }
  if (bytes > std::numeric_limits<std::size_t>::max() / 2) {
    return absl::InvalidArgumentError(
        absl::StrFormat("allocate: size %d bytes is not a plausible request", bytes));
  }
  if (static_cast<std::size_t>(device) >= m.devices.size()) return m.check_device(device);
  const std::size_t granularity = m.policy.granularity;
  const std::size_t rounded = (bytes + granularity - 1) & ~(granularity - 1);

  // Ask the runtime about the stream before taking the lock.
  detail::CaptureContext ctx;
  ctx.device_may_capture = m.runtime->any_capture_active(device);
  if (ctx.device_may_capture) {
    auto info = m.runtime->capture_info(stream);
    if (!info.ok()) {
      // An unknown stream is the same error with or without a capture on
      // the device: check_stream's.
      std::lock_guard lock(m.mu);
      if (absl::Status s = m.check_stream(stream, "allocate"); !s.ok()) return s;
      return info.status();
    }
    if (info->status != CaptureStatus::kNone) {
      ctx.capture = info->id;
      ctx.position = info->position;
      ctx.graph = info->graph;
    }
  }

  // The steady state: in the stream's shard, under its lock alone, else
  // under the allocator's (allocate_cached_locked); anything else takes the
  // general path below.
  const bool steady = !cache_tried && ctx.capture == 0 &&
                      request.lifetime == Lifetime::kTransient && request.tag.empty() &&
                      request.owner.empty();
  if (steady) {
    if (detail::StreamShard* shard = m.shard_for(device, stream)) {
      std::lock_guard shard_lock(shard->mu);
      if (void* p = m.allocate_in_shard(*shard, device, stream, bytes, rounded)) {
        detail::shard_hint = {m.allocator_id, shard};
        return p;
      }
    }
  }
  std::lock_guard lock(m.mu);
  if (steady) {
    if (void* p = m.allocate_cached_locked(bytes, rounded, device, stream)) return p;
  }
  if (absl::Status s = m.check_stream(stream, "allocate", device); !s.ok()) return s;
  if (request.lifetime == Lifetime::kPersistent) {
    if (absl::Status s = m.refuse_persistent(device, stream, bytes, request.tag, ctx); !s.ok()) {
      return s;
    }
  }
  if (!m.pending.empty() || !m.deferred.empty()) m.process_pending();
  if (m.gone_graphs->any.load(std::memory_order_acquire)) m.apply_gone_graphs();
  Pool* routed = ctx.capture != 0 ? m.route_for(device, ctx.capture, stream) : nullptr;
  if (ctx.capture != 0 && routed == nullptr) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "allocate: capture %d allocates to a graph pool of another device than device %d "
        "(begin_allocate_to_pool named that pool); allocate for the pool's device",
        ctx.capture, device));
  }
  Pool& pool = ctx.capture != 0 ? *routed : *m.devices[device].default_pool;
  // What needs host memory and can fail (it throws) comes before the take or
  // undoes it, so that no block is lost between the pool and the pointer
  // table; Allocator::allocate turns the throw into kResourceExhausted.
  // (Abseil's hash tables, which hold streams and interned tags, are not
  // exception-safe on a failed rehash: tests/alloc_failure_test.cpp.)
  const std::uint32_t tag_id = request.tag.empty() ? 0 : detail::intern_id(request.tag);
  const std::uint32_t owner_id = request.owner.empty() ? 0 : detail::intern_id(request.owner);
  m.live.reserve_one();
  const Pool::AllocationPeaks peaks = pool.allocation_peaks();
  Block* block = pool.take(stream, rounded, bytes);
  if (block == nullptr) {
    auto fresh = m.take_new_segment(pool, device, stream, rounded, bytes);
    if (!fresh.ok()) return fresh.status();
    block = *fresh;
  }
  block->lifetime = request.lifetime;
  block->tag_id = tag_id;
  block->owner_id = owner_id;
  block->sequence = m.next_sequence++;
  block->capture = ctx.capture;
  block->capture_position = ctx.position;
  m.live.insert_reserved(block->addr, block);
  if (m.observer != nullptr) m.observe_allocation(pool, block, peaks);
  if (ctx.capture != 0) {
    try {
      m.notify(BlockEvent::Kind::kAllocate, *block, ctx.capture, ctx.position, ctx.graph);
    } catch (...) {
      m.undo_allocation(pool, block, peaks, /*observed=*/m.observer != nullptr);
      throw;
    }
  }
  // Only now: the double-free diagnosis tells a block someone held from
  // memory never handed out.
  block->handed_out = true;
  // The stream's next steady-state requests may go to a shard of its own.
  if (ctx.capture == 0 && !pool.is_graph_pool()) m.maybe_make_shard(device, stream);
  return reinterpret_cast<void*>(block->addr);
}

void Allocator::Impl::observe_allocation(Pool& pool, Block* block,
                                         const Pool::AllocationPeaks& peaks) {
  try {
    observer->on_allocate(*block);
  } catch (...) {
    undo_allocation(pool, block, peaks, /*observed=*/false);
    throw;
  }
}

void Allocator::Impl::undo_allocation(Pool& pool, Block* block,
                                      const Pool::AllocationPeaks& peaks, bool observed) noexcept {
  if (observed) {
    try {
      observer->on_free(block->sequence);
    } catch (...) {  // the trace misses the free; the allocator's state does not
    }
  }
  live.erase(block->addr);
  pool.untake(block, peaks);
}

absl::Status Allocator::deallocate(void* ptr, int device) {
  return impl_->deallocate(ptr, device, /*as_owner=*/nullptr, /*try_cache=*/true);
}

absl::Status Allocator::deallocate_owned(void* ptr, std::string_view owner) {
  return impl_->deallocate(ptr, kAnyDevice, &owner, /*try_cache=*/false);
}

absl::Status Allocator::Impl::deallocate(void* ptr, int device,
                                         const std::string_view* as_owner,
                                         bool try_cache) {
  Impl& m = *this;
  if (ptr == nullptr) return absl::InvalidArgumentError("deallocate: null pointer");
  const auto addr = reinterpret_cast<std::uintptr_t>(ptr);
  // A block a shard handed out is freed there, under the shard's lock
  // alone: the calling thread's last shard first, then the others.
  if (try_cache && m.shard_slots.made() != 0) {
    const detail::ShardHint hint = detail::shard_hint;
    if (m.free_in_any_shard(addr, device, hint.allocator == m.allocator_id ? hint.shard : nullptr)) {
      return absl::OkStatus();
    }
  }
  std::lock_guard lock(m.mu);
  // One lock and one pointer-table lookup for both paths: the steady state
  // (free_cached_locked) when no report is waiting, else the general path
  // with the block that lookup found. (Blocks born in captures take the
  // general path, and used to pay the lock and the lookup twice.) A block
  // of a shard's table is found there and moves to the pointer table only
  // once its free goes ahead (live_slot, below): a refused free moves
  // nothing.
  Block* block = nullptr;
  const bool reports = m.gone_graphs->any.load(std::memory_order_acquire) ||
                       m.gone_streams->any.load(std::memory_order_acquire);
  if (reports) m.apply_runtime_reports();
  std::size_t slot = m.live.find_slot(addr);  // free_block's, when known
  if (slot != detail::BlockTable::kNoSlot) {
    if (!reports && try_cache && m.free_cached_locked(slot, device)) return absl::OkStatus();
    block = m.live.block_at(slot);
  } else if (!m.shards.empty()) {
    block = m.find_live(addr);
  }
  if (block == nullptr) return m.diagnose_unknown(ptr, "deallocate");
  const int owner = block->segment->device;
  if (device != kAnyDevice && device != owner) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "deallocate(%p): the block belongs to device %d, not device %d", ptr, owner, device));
  }
  if (block->owner_id != 0 || as_owner != nullptr) {
    const std::string_view block_owner = detail::interned(block->owner_id);
    if (as_owner == nullptr) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "deallocate(%p): the block has an owner and a plain free would leave the owner "
          "handing out a freed address; release it with %s",
          ptr, std::string(block_owner)));
    }
    if (*as_owner != block_owner) {
      return absl::PermissionDeniedError(absl::StrFormat(
          "deallocate_owned(%p): the block's owner is '%s', not '%s'", ptr,
          std::string(block_owner), std::string(*as_owner)));
    }
  }
  // The listener hears of the frees that matter to a tracker: every free of a
  // block allocated during a capture, whenever it happens (the tracker keeps
  // such blocks and must not take them for live after their memory is
  // reused), and every free while a capture is routed on the device, with
  // the capture position of the block's stream if that stream is capturing.
  const bool tell = m.listener != nullptr && (block->capture != 0 || m.devices[owner].routes > 0);
  CaptureInfo at_free;  // outside any capture unless the stream is capturing
  // An orphan's stream was destroyed (nothing to ask: it captures nothing).
  if (tell && block->segment->stream != kNoStream) {
    if (auto info = m.runtime->capture_info(block->segment->stream);
        info.ok() && info->status != CaptureStatus::kNone) {
      at_free = *info;
    }
  }
  // Described before the free, which may merge the block away.
  const BlockEvent freed =
      tell ? m.event_of(BlockEvent::Kind::kFree, *block, at_free.id, at_free.position,
                        at_free.graph)
           : BlockEvent{};
  const std::uint64_t sequence = block->sequence;
  // The table is unchanged since the lookup: free_block reuses its slot.
  // A block of a shard's table moves to the pointer table now (it may
  // throw, before anything changed).
  if (slot == detail::BlockTable::kNoSlot) slot = m.live_slot(addr);
  if (absl::Status s = m.free_block(block, slot); !s.ok()) return s;
  if (m.observer != nullptr) m.observer->on_free(sequence);
  // Told only once the free has happened: a free that failed (its block left
  // allocated) must not look like one to the tracker.
  if (tell) m.listener->on_block_event(freed);
  return absl::OkStatus();
}

absl::Status Allocator::record_stream(void* ptr, StreamHandle stream) {
  Impl& m = *impl_;
  std::lock_guard lock(m.mu);
  Block* block = m.find_live(reinterpret_cast<std::uintptr_t>(ptr));
  if (block == nullptr) return m.diagnose_unknown(ptr, "record_stream");
  // Validate the stream first, even one the block already names (its own
  // stream, or one recorded before): that stream may have been destroyed
  // since, and a destroyed stream is refused like any unknown one. An
  // unusable stream discovered at free time would leave the block
  // impossible to free. (check_stream only forgets destroyed streams; the
  // block stays where it is.)
  if (absl::Status s = m.check_stream(stream, "record_stream"); !s.ok()) return s;
  if (stream == block->segment->stream) return absl::OkStatus();
  if (std::find(block->used_on.begin(), block->used_on.end(), stream) != block->used_on.end()) {
    return absl::OkStatus();
  }
  block->used_on.push_back(stream);
  if (m.observer != nullptr) m.observer->on_record_stream(*block, stream);
  return absl::OkStatus();
}

absl::Status Allocator::empty_cache(int device) {
  Impl& m = *impl_;
  std::lock_guard lock(m.mu);
  if (device != kAnyDevice) {
    if (absl::Status s = m.check_device(device); !s.ok()) return s;
  }
  m.apply_gone_streams();
  // Routes go before pending frees are processed: frees deferred while a
  // capture was routed on the device get their events only once no route is
  // left, and the routes of captures that are over (a graph destroyed, a
  // native capture ended that nobody announced) end here.
  m.apply_gone_graphs();
  for (int d = 0; d < static_cast<int>(m.devices.size()); ++d) {
    if (device == kAnyDevice || device == d) m.active_capture_on(d);
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
  if (absl::Status s = m.check_device(device); !s.ok()) return s;
  std::lock_guard lock(m.mu);
  return m.device_stats(device);
}

absl::Status Allocator::set_capture_listener(CaptureListener* listener) {
  std::lock_guard lock(impl_->mu);
  if (listener != nullptr && impl_->listener != nullptr && impl_->listener != listener) {
    return absl::AlreadyExistsError(
        "set_capture_listener: the allocator already has a capture listener (one "
        "CaptureTracker per allocator)");
  }
  impl_->listener = listener;
  return absl::OkStatus();
}

void detail::with_listener_lock(const Allocator& a, absl::FunctionRef<void()> fn) {
  std::lock_guard lock(detail::AllocatorAccess::impl(a).mu);
  fn();
}

}  // namespace capalloc
