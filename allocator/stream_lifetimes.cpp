// allocator/stream_lifetimes.cpp: which streams the allocator accepts, and
// what it forgets when a stream is destroyed.
//
// A stream is checked the first time a call names it (the runtime's
// capture_info must know it: the host runtime knows exactly which streams
// exist; CUDA and HIP answer for any live handle) and remembered until the
// runtime reports it destroyed (MemoryRuntime::watch_stream_destruction).
// Limit: on CUDA and HIP a stream that the application destroys natively,
// behind the runtime's back, stays remembered; a later stream that gets the
// same handle is then simply the same stream to capalloc.
//
// When a stream is destroyed its work has run (destroy_stream waits for it):
// its record_stream uses stop holding frees back, and the segments it owned
// become orphans, owned by no stream (docs/design.md "Stream lifetimes"):
// the default pool's are adopted by streams needing a segment of their class,
// or given back by empty_cache and the out-of-memory retry; a graph pool's
// are never adopted, and go back once no graph or capture holds the pool.
#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "allocator/allocator_impl.hpp"

namespace capalloc {

using detail::Block;

absl::Status Allocator::Impl::remember_stream(StreamHandle stream, std::string_view call,
                                              int device) {
  if (!known_streams.contains(stream)) {
    if (auto info = runtime->capture_info(stream); !info.ok()) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s: stream 0x%x is not a live stream of the %s runtime (never created, or already "
          "destroyed): %s",
          std::string(call), stream, runtime->name(), std::string(info.status().message())));
    }
    // Its device, asked once: any failure (a runtime that cannot tell)
    // leaves it unknown, and the stream usable on every device as before.
    auto runs_on = runtime->stream_device(stream);
    known_streams.emplace(stream, runs_on.ok() ? *runs_on : kAnyDevice);
  }
  // A stream of another device stays known (it is a live stream) but does
  // not become one of the last checked.
  if (device != kAnyDevice) {
    if (absl::Status s = check_stream_device(stream, device, call); !s.ok()) return s;
  }
  note_recent(stream, known_streams.find(stream)->second);
  return absl::OkStatus();
}

absl::Status Allocator::Impl::check_stream_device(StreamHandle stream, int device,
                                                  std::string_view call) const {
  const int own = device_of_stream(stream);
  if (own == kAnyDevice || own == device) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrFormat(
      "%s: stream 0x%x runs on device %d, not device %d; allocate on a stream of device %d "
      "(or the default stream)",
      std::string(call), stream, own, device, device));
}

void Allocator::Impl::apply_gone_streams() {
  if (!gone_streams->any.load(std::memory_order_acquire)) return;
  std::vector<StreamHandle> streams;
  {
    std::lock_guard lock(gone_streams->mu);
    streams.swap(gone_streams->streams);
    gone_streams->any.store(false, std::memory_order_relaxed);
  }
  // One pass over the live and deferred blocks for every stream reported
  // since the last call, however many there are.
  std::sort(streams.begin(), streams.end());
  streams.erase(std::unique(streams.begin(), streams.end()), streams.end());
  auto gone = [&streams](StreamHandle s) {
    return std::binary_search(streams.begin(), streams.end(), s);
  };
  auto forget = [&gone](Block* block) {
    auto& used = block->used_on;
    used.erase(std::remove_if(used.begin(), used.end(), gone), used.end());
  };
  for (StreamHandle stream : streams) {
    forget_known_stream(stream);
    if (last_known_stream == stream) {
      last_known_stream = kDefaultStream;
      last_known_device = kAnyDevice;
    }
    if (previous_known_stream == stream) {
      previous_known_stream = kDefaultStream;
      previous_known_device = kAnyDevice;
    }
  }
  for_each_live([&](std::uintptr_t, Block* block) {
    if (!block->used_on.empty()) forget(block);
  });
  // Frees deferred only for these streams' sake complete now. (Events
  // already recorded on them have completed too: process_pending sees them.)
  auto keep = deferred.begin();
  for (Block* block : deferred) {
    forget(block);
    if (!block->used_on.empty()) {
      *keep++ = block;
      continue;
    }
    detail::Pool* pool = block->segment->pool;
    pool->give_back(block);
    maybe_destroy_pool(pool);
  }
  deferred.erase(keep, deferred.end());
  for (int d = 0; d < static_cast<int>(devices.size()); ++d) {
    // The default pool keeps the streams' segments for other streams to
    // adopt (Pool::take_from_orphan) until empty_cache or an out-of-memory
    // retry gives them back: releasing them here would synchronize the
    // device inside whatever allocator call applies the report.
    // Graph pools' segments of the streams belong to no stream either (a
    // free of their blocks then asks the dead stream nothing, and a stream
    // given its handle owns none of them), but no capture adopts them: a
    // graph may still write there (Pool::take_from_orphan serves the
    // default pool only).
    for (StreamHandle stream : streams) {
      devices[d].default_pool->orphan_stream(stream);
      for (auto& [handle, pool] : devices[d].graph_pools) pool->orphan_stream(stream);
    }
    if (!events_allowed(d)) continue;  // a capture is routed: no release now
    std::vector<detail::Pool*> unreferenced;
    for (auto& [handle, pool] : devices[d].graph_pools) {
      if (!pool->referenced()) unreferenced.push_back(pool.get());
    }
    // Their fully free orphans, those of earlier reports included.
    for (detail::Pool* pool : unreferenced) release_segments(d, *pool, kNoStream).IgnoreError();
    // A pool kept only for its segments goes with the last of them.
    for (detail::Pool* pool : unreferenced) maybe_destroy_pool(pool);
  }
}

}  // namespace capalloc
