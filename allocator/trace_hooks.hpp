// allocator/trace_hooks.hpp: the layers above the allocator (the capture
// tracker, stream-ordered release) add their events to the allocator's
// event trace through these calls. Each takes the allocator's lock, so the
// events fall in order with the allocator's own; each is a no-op when no
// trace runs. Nothing here is public API.
#ifndef CAPALLOC_ALLOCATOR_TRACE_HOOKS_HPP_
#define CAPALLOC_ALLOCATOR_TRACE_HOOKS_HPP_

#include <cstdint>
#include <string>
#include <string_view>

#include "capalloc/allocator.hpp"

namespace capalloc::detail {

struct AllocatorAccess {
  static Allocator::Impl& impl(const Allocator& a) { return *a.impl_; }
};

// Makes `a` apply the calling threads' tag scopes (allocation_sites.hpp)
// that it owns from now on, as an AllocationTagScope does (the C ABI's
// capalloc_push_tag); returns the owner token those scopes carry.
const void* enable_tag_scopes(const Allocator& a);

void trace_capture_begin(const Allocator& a, CaptureId capture, StreamHandle stream,
                         PoolHandle pool, int device, std::string_view label);
void trace_capture_end(const Allocator& a, CaptureId capture);
void trace_replay(const Allocator& a, CaptureId capture);
void trace_graph_destroy(const Allocator& a, CaptureId capture);
// A stream-ordered release of a block (`id`: its sequence) or of memory
// capalloc does not own (`id` 0, `addr`), and its callback having run.
// `request` numbers the release (per queue, from 1), on both lines.
void trace_release(const Allocator& a, std::uint64_t request, std::uint64_t id, const void* addr,
                   StreamHandle stream);
void trace_release_done(const Allocator& a, std::uint64_t request, std::uint64_t id,
                        const void* addr);
// Whether an event trace runs now: callers whose event costs something to
// describe (trace_finding's message) ask first.
bool trace_running(const Allocator& a);
// A finding of the capture tracker: where (`addr`, `size`: the harmed
// bytes), which graph, the victim block, and the finding in one paragraph.
void trace_finding(const Allocator& a, std::string_view severity, const void* addr,
                   std::size_t size, std::uint64_t graph, std::uint64_t victim,
                   std::string_view victim_tag, std::string message);

}  // namespace capalloc::detail

#endif  // CAPALLOC_ALLOCATOR_TRACE_HOOKS_HPP_
