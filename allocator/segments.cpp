// allocator/segments.cpp: where a pool gets a new segment when nothing it
// holds fits a request (Allocator::Impl::take_new_segment): the size of the
// segment, what goes back to the runtime first, the retry after an
// out-of-memory, and the error that says why a request failed; and the
// device and capture checks that decide what may be released. The
// segment's blocks are the pool's (pool.cpp); split out of allocator.cpp.
#include <cstdint>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "allocator/allocator_impl.hpp"
#include "common/format.hpp"

namespace capalloc {

using detail::Block;
using detail::Pool;

absl::Status Allocator::Impl::check_device(int device) const {
  if (device < 0 || device >= static_cast<int>(devices.size())) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "device %d does not exist: the %s runtime has %d device(s)", device, runtime->name(),
        devices.size()));
  }
  return absl::OkStatus();
}

absl::StatusOr<void*> Allocator::Impl::reserve_relaxed(int device, std::size_t bytes) {
  // A reservation during someone's capture must not invalidate it: relaxed
  // mode, as PyTorch uses around cudaMalloc.
  const CaptureMode old = runtime->exchange_thread_capture_mode(CaptureMode::kRelaxed);
  auto result = runtime->reserve(device, bytes);
  runtime->exchange_thread_capture_mode(old);
  return result;
}

bool Allocator::Impl::runtime_capturing(int device, StreamHandle stream) const {
  if (!runtime->any_capture_active(device)) return false;
  auto info = runtime->capture_info(stream);
  return !info.ok() || info->status != CaptureStatus::kNone;
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
        device, detail::bytes(now.reserved_bytes.current),
        detail::bytes(now.allocated_bytes.current),
        detail::bytes(now.reserved_bytes.current - now.allocated_bytes.current)));
  };
  // A destroyed stream's fully free segment of this class serves first: no
  // reservation, and no release of it later.
  if (Block* adopted = pool.take_from_orphan(stream, segment_bytes, rounded, requested)) {
    return adopted;
  }
  if (auto info = runtime->memory_info(device); info.ok() && rounded > info->total_bytes) {
    return out_of_memory(
        absl::StrCat("the device has only ", detail::bytes(info->total_bytes), " in all"));
  }
  // An oversize request that no cached oversize block fits, when the pool's
  // cached free memory would exceed 1/kCachedShare of what it reserves:
  // the stream's fully free oversize segments, which fit no request of this
  // size, go back before a new one is reserved. This keeps peak reserved
  // within about 10% of peak requested, where PyTorch keeps them until out
  // of memory; below the share they stay cached, so that sizes that come
  // back (a training step's) find them. Not while a capture is under way:
  // releasing memory then is illegal.
  // Destroyed streams' segments (orphans) count on neither side: the rule
  // cannot release them (they are no stream's), and counted they would
  // make it release the requesting stream's own segments, again and again.
  constexpr std::int64_t kCachedShare = 10;
  if (policy.class_of(rounded) == detail::SizeClass::kOversize) {
    const Pool::OrphanedBytes orphaned = pool.orphaned_bytes();
    if ((pool.cached_free_bytes() - orphaned.free) * kCachedShare >
            stats.reserved_bytes.current - orphaned.reserved +
                static_cast<std::int64_t>(segment_bytes) &&
        events_allowed(device) && !runtime_capturing(device, stream)) {
      release_segments(device, pool, stream, detail::SizeClass::kOversize).IgnoreError();
    }
  }
  auto base = reserve_relaxed(device, segment_bytes);
  if (!base.ok() && absl::IsResourceExhausted(base.status())) {
    ++stats.retries;
    // Releasing segments frees device memory, which synchronizes the device:
    // illegal while a capture is under way (PyTorch skips its cache release
    // then too). With a capture routed on the device, retry as is.
    const bool released = events_allowed(device) && !runtime_capturing(device, stream);
    if (released) {
      process_pending();
      release_free_segments(device).IgnoreError();
    }
    base = reserve_relaxed(device, segment_bytes);
    if (!base.ok() && absl::IsResourceExhausted(base.status())) {
      return out_of_memory(absl::StrCat(
          "the runtime refused a ", detail::bytes(segment_bytes), " segment ",
          released ? "after the cache was released"
                   : "(the cache was kept: a capture is under way on the device, and releasing "
                     "memory during it is illegal)",
          " (", std::string(base.status().message()), ")"));
    }
  }
  if (!base.ok()) return base.status();
  // Nothing is lost past the reservation: if the bookkeeping cannot get
  // host memory (it throws), the segment goes back to the runtime, and the
  // pool and the device's segment map do not keep it.
  auto& by_base = devices[device].segments;
  const auto key = reinterpret_cast<std::uintptr_t>(*base);
  try {
    const auto entry = by_base.emplace(key, nullptr).first;
    try {
      Block* block = pool.take_from_new_segment(*base, segment_bytes, stream, rounded, requested);
      entry->second = block->segment;
      return block;
    } catch (...) {
      by_base.erase(key);
      throw;
    }
  } catch (...) {
    runtime->release(device, *base, segment_bytes).IgnoreError();
    throw;
  }
}

}  // namespace capalloc
