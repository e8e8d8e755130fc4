// allocator/listener_lock.hpp: the allocator's lock, lent to its capture
// listener.
//
// The allocator calls its CaptureListener (on_block_event,
// on_capture_graph_gone) with its lock held, one call at a time, so what a
// listener only writes from those calls is guarded by that lock already.
// The capture tracker keeps its event log so, and takes the lock through
// this call when it reads the log (drain_log) or orders its own events
// against the allocator's (a capture's begin tick): a listener event then
// takes no lock of its own (it used to take the log's spin lock, whose
// exchange waited for the store buffer to drain on every allocation and
// free during a capture). Lock order: the caller's locks, then the
// allocator's; never called with the allocator's lock held (not from a
// listener call). Nothing here is public API.
#ifndef CAPALLOC_ALLOCATOR_LISTENER_LOCK_HPP_
#define CAPALLOC_ALLOCATOR_LISTENER_LOCK_HPP_

#include "absl/functional/function_ref.h"
#include "capalloc/allocator.hpp"

namespace capalloc::detail {

// Runs `fn` with `a`'s lock held.
void with_listener_lock(const Allocator& a, absl::FunctionRef<void()> fn);

}  // namespace capalloc::detail

#endif  // CAPALLOC_ALLOCATOR_LISTENER_LOCK_HPP_
