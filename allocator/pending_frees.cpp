// allocator/pending_frees.cpp: frees that must wait for other streams.
//
// A block used on streams besides its owner (record_stream) is reusable only
// after events recorded on those streams at free time have completed. Events
// are polled on allocation, never waited for. While a capture is routed on
// the device, or one of the block's streams is capturing, no event is
// recorded or queried (either would join or break the capture): such frees
// wait in `deferred` until the captures are over. See allocator_impl.hpp.
#include <algorithm>
#include <string>

#include "absl/strings/str_format.h"
#include "allocator/allocator_impl.hpp"

namespace capalloc {

using detail::Block;
using detail::Pool;

absl::StatusOr<EventHandle> Allocator::Impl::acquire_event(int device) {
  auto& spare = devices[device].spare_events;
  if (!spare.empty()) {
    EventHandle e = spare.back();
    spare.pop_back();
    return e;
  }
  return runtime->create_event(device);
}

absl::Status Allocator::Impl::record_free_events(Block* block) {
  // All or nothing: on failure no event stays queued for the block.
  // Each event is made on its stream's device (an event can be recorded
  // only on a stream of its own device), as PyTorch's allocator makes it:
  // a block of one device recorded on another device's stream is freed
  // once that stream's work is done. A stream whose device the runtime
  // cannot tell gets one of the block's device.
  const int block_device = block->segment->device;
  const std::size_t first_new = pending.size();
  auto& used = block->used_on;
  auto give_back_event = [this](EventHandle event, int device) {
    devices[static_cast<std::size_t>(device)].spare_events.push_back(event);
  };
  for (std::size_t i = 0; i < used.size();) {
    const StreamHandle s = used[i];
    const int stream_device = device_of_stream(s);
    const int device = stream_device == kAnyDevice ||
                               static_cast<std::size_t>(stream_device) >= devices.size()
                           ? block_device
                           : stream_device;
    auto event = acquire_event(device);
    absl::Status status = event.ok() ? runtime->record_event(*event, s) : event.status();
    if (status.ok()) {
      pending.push_back({block, *event, device});
      ++i;
      continue;
    }
    if (event.ok()) give_back_event(*event, device);
    // Destroyed by another thread since free_block asked capture_info: its
    // work has run (destroy_stream waits for it), so the free needs no
    // event on it. The runtime must say so itself (capture_info: not
    // found); any other failure fails the free.
    if (absl::IsNotFound(status)) {
      if (auto info = runtime->capture_info(s); absl::IsNotFound(info.status())) {
        used.erase(used.begin() + static_cast<std::ptrdiff_t>(i));
        continue;
      }
    }
    for (std::size_t j = first_new; j < pending.size(); ++j) {
      give_back_event(pending[j].event, pending[j].device);
    }
    pending.resize(first_new);
    return absl::Status(status.code(),
                        absl::StrFormat("recording an event on stream 0x%x failed: %s", s,
                                        std::string(status.message())));
  }
  block->pending_events = static_cast<std::uint32_t>(pending.size() - first_new);
  return absl::OkStatus();
}

void Allocator::Impl::finish_free(Block* block) {
  Pool* pool = block->segment->pool;
  pool->give_back(block);
  maybe_destroy_pool(pool);
}

void Allocator::Impl::process_pending() {
  // Frees deferred during captures whose streams are no longer capturing.
  if (!deferred.empty()) {
    auto keep = deferred.begin();
    for (Block* block : deferred) {
      const int device = block->segment->device;
      bool ready = events_allowed(device);
      for (StreamHandle s : block->used_on) {
        if (!ready) break;
        auto info = runtime->capture_info(s);
        ready = info.ok() && info->status == CaptureStatus::kNone;
      }
      if (!ready || !record_free_events(block).ok()) {
        *keep++ = block;
      } else if (block->pending_events == 0) {
        finish_free(block);  // its streams were all destroyed meanwhile
      }
    }
    deferred.erase(keep, deferred.end());
  }
  auto keep = pending.begin();
  for (auto it = pending.begin(); it != pending.end(); ++it) {
    bool done = false;
    // Neither the event's device nor the block's may have a capture routed
    // (they differ after record_stream on another device's stream).
    if (events_allowed(it->device) && events_allowed(it->block->segment->device)) {
      auto queried = runtime->query_event(it->event);
      done = queried.ok() && *queried;
    }
    if (!done) {
      *keep++ = *it;
      continue;
    }
    devices[it->device].spare_events.push_back(it->event);
    Block* block = it->block;
    if (--block->pending_events == 0) finish_free(block);
  }
  pending.erase(keep, pending.end());
}

absl::Status Allocator::Impl::free_block(Block* block, std::size_t slot) {
  Pool& pool = *block->segment->pool;
  auto forget = [&] {
    if (slot != detail::BlockTable::kNoSlot) {
      live.erase_slot(slot);
    } else {
      live.erase(block->addr);
    }
  };
  const int device = block->segment->device;
  // A stream destroyed by another thread a moment ago, whose report the
  // allocator has not applied yet: the runtime no longer knows it, and its
  // work has run (destroy_stream waits for it before forgetting the stream),
  // so the free needs no event on it. Without this, such a free failed with
  // "block left allocated" (a leak under PyTorch, which never retries).
  // One capture_info per stream: it both drops the gone streams and says
  // whether a remaining one is capturing (which defers the free, below).
  bool capturing = false;
  auto& used = block->used_on;
  if (!used.empty()) used.erase(std::remove_if(used.begin(), used.end(),
                            [&](StreamHandle s) {
                              auto info = runtime->capture_info(s);
                              if (info.ok()) {
                                capturing |= info->status != CaptureStatus::kNone;
                                return false;
                              }
                              return info.status().code() == absl::StatusCode::kNotFound;
                            }),
             used.end());
  // Used on other streams: reusable once they pass an event recorded now. An
  // event on a capturing stream would become part of the graph, so such a
  // free waits in `deferred` until the capture is over. (Recording drops
  // the streams destroyed since the check above.)
  bool recorded = false;
  if (!block->used_on.empty() && !capturing && events_allowed(device)) {
    if (absl::Status s = record_free_events(block); !s.ok()) {
      return absl::Status(s.code(), absl::StrFormat("deallocate(%p): %s; block left allocated",
                                                    block->ptr(), std::string(s.message())));
    }
    recorded = true;
  }
  if (block->used_on.empty()) {
    forget();
    detail::Segment* segment = block->segment;
    // The common case: a small block of the default pool, of a stream that
    // lives on, goes to the quick cache for the next request of its size.
    // Graph pools and capture blocks keep the merging path: their pools go
    // when their last block does.
    if (!pool.is_graph_pool() && block->capture == 0 && pool.caches_freed(*block) &&
        (recent_stream(segment->stream) || is_known_stream(segment->stream))) {
      pool.cache_freed(block);
      return absl::OkStatus();
    }
    pool.give_back(block);
    // The last block of a destroyed stream's segment leaves it fully free:
    // an orphan the next stream that needs a segment adopts, or that
    // empty_cache or an out-of-memory retry gives back (a release here
    // would synchronize the device inside a free).
    maybe_destroy_pool(&pool);
    return absl::OkStatus();
  }
  if (!recorded) deferred.push_back(block);
  forget();
  pool.mark_pending(block);
  return absl::OkStatus();
}

}  // namespace capalloc
