// capalloc/release.hpp: stream-ordered release. A ReleaseQueue runs a
// callback that gives memory back (a DLPack deleter, a pool's free, a Python
// object's last reference) only once the work enqueued on a stream up to
// the request has completed, without blocking the caller.
//
// Field report 001 (a DLPack deleter called while the kernel that reads the
// memory is still being prepared) is the failure this prevents: the
// consumer hands the deleter to the queue instead of calling it.
//
// Example:
//
//   auto queue = capalloc::ReleaseQueue::create(*tracker).value();
//   rt->launch_kernel(stream, reads_x);                 // asynchronous
//   queue->release(0, stream, [x] { producer_free(x); }, {{x, bytes}})
//       .IgnoreError();                                 // returns at once
//   // producer_free(x) runs on capalloc's progress thread once reads_x has run
//
// How it works: release() records an event on the stream (the runtime's
// event, as cudaEventRecord) and queues the callback. A thread the queue owns
// polls the events of its pending releases (cudaEventQuery: never a wait
// inside the runtime) and runs each callback once its event has completed, so
// releases make progress even if the application never calls capalloc again.
// No user code runs inside a stream callback or the runtime, and the queue
// calls no runtime function from inside one.
//
// Graphs. A release requested on a stream that is capturing waits until the
// graph that capture builds is gone: the capture failed, or the graph and
// every executable graph made from it were destroyed (replays use the
// memory at the addresses of capture time); then the stream's work up to
// then is waited for as above. A release naming `memory` that a live
// graph's write record reads or writes (CaptureTracker: the graphs captured
// through it and the native captures it recorded) waits until no such graph
// is left. A capture still in progress on another stream has no record yet,
// so it does not hold a release: release on the capturing stream itself.
//
// Teardown. The destructor (and drain()) first releases the tensors still
// imported through a DlpackImports over the queue (capalloc/dlpack.hpp, in
// stream order, with a warning giving their number), then stops the thread
// and runs every pending release: each waits for its event
// (cudaEventSynchronize), then its
// callback runs on the destroying thread; releases still held by a live
// graph or capture run too, with a warning naming how many (after teardown
// nothing in capalloc can hold them any longer). A release requested after
// drain() waits for the stream's work and runs before release() returns.
//
// Thread safety: every method may be called from any thread, a callback
// included (a callback may request another release). Callbacks run one at a
// time, on the progress thread, in no promised order across streams, and in
// request order on one stream (a release held by a graph lets later ones
// pass); a callback must not throw (a throw is logged and dropped) and must
// not call drain(). The queue must be destroyed before
// the tracker and the runtime it was created over.
#ifndef CAPALLOC_RELEASE_HPP_
#define CAPALLOC_RELEASE_HPP_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "capalloc/export.h"
#include "capalloc/runtime.hpp"

namespace capalloc {

class CaptureTracker;

// What a queue has done so far: counts, so that tests can assert on them.
struct ReleaseQueueStats {
  std::uint64_t requested = 0;           // release() calls accepted
  std::uint64_t completed = 0;           // callbacks run (by the thread or at teardown)
  std::uint64_t pending = 0;             // accepted, callback not yet run
  std::uint64_t held_by_graphs = 0;      // pending and waiting on a graph (capture or record)
  std::uint64_t run_at_teardown = 0;     // callbacks run by drain() or the destructor
  std::uint64_t forced_at_teardown = 0;  // of those, still held by a graph then
};

class CAPALLOC_API ReleaseQueue {
 public:
  // Called once. It may free memory, call capalloc, or request another
  // release; it must not throw.
  using Callback = absl::AnyInvocable<void() &&>;

  // A queue over `runtime`, without graph records: only captures hold its
  // releases. Starts the progress thread (kInternal if it cannot be started).
  static absl::StatusOr<std::unique_ptr<ReleaseQueue>> create(MemoryRuntime& runtime);
  // A queue over the tracker's runtime that also holds a release of memory
  // one of the tracker's graphs reads or writes.
  static absl::StatusOr<std::unique_ptr<ReleaseQueue>> create(const CaptureTracker& tracker);

  // Runs every pending release (see Teardown above), then joins the thread.
  ~ReleaseQueue();
  ReleaseQueue(const ReleaseQueue&) = delete;
  ReleaseQueue& operator=(const ReleaseQueue&) = delete;

  // Runs `callback` once the work enqueued on `stream` (of `device`) up to
  // this call has completed, and, when `memory` is given, once no live graph
  // reads or writes it. Never waits for the stream. Errors, changing
  // nothing and keeping the callback unrun (it is destroyed with the call):
  // kInvalidArgument for an empty callback or an unknown device or memory
  // span of zero bytes; the runtime's error for a stream it does not know
  // (kNotFound on the host runtime); kFailedPrecondition for a stream whose
  // capture was invalidated (end it first: its graph will never exist);
  // kUnimplemented for a capturing stream on a runtime that cannot tell when
  // a graph is gone (HIP 5.2); the runtime's error when recording the event
  // fails.
  absl::Status release(int device, StreamHandle stream, Callback callback,
                       std::vector<MemorySpan> memory = {});

  // Teardown now: stops the thread and runs every pending release as the
  // destructor does. Later releases run before release() returns. Idempotent.
  // kFailedPrecondition when called from a callback (the progress thread).
  //
  // fork(): the progress thread does not exist in a child, and the pending
  // releases are the parent's. In a child, release() and drain() are
  // kFailedPrecondition (`fork() child`), DlpackImports::import too, and
  // teardown (the destructor, the exit handler) leaves everything alone:
  // nothing inherited runs twice, and exit does not hang.
  absl::Status drain();

  ReleaseQueueStats stats() const;
  MemoryRuntime& runtime() const;

 private:
  friend class DlpackImports;
  // Teardown (drain(), the destructor) calls each hook first, on the
  // tearing-down thread, so that a DlpackImports over the queue releases
  // what it still holds (through release(): in stream order). Every
  // teardown call runs them, even after the first drain(). A hook must not
  // remove a hook.
  std::uint64_t add_teardown_hook(absl::AnyInvocable<void()> hook);
  void remove_teardown_hook(std::uint64_t id);
  // kFailedPrecondition in a fork() child of the process that made the
  // queue (its progress thread does not exist there).
  absl::Status check_process(const char* call) const;
  // release() for a stream the caller knows was live and has since been
  // destroyed (destroy_stream waited for its work): nothing is left to wait
  // for on it, so the callback runs in request order once no live graph uses
  // `memory` (at once after teardown). DlpackImports uses it for a tensor
  // whose import stream is gone.
  absl::Status release_after_stream_destroyed(int device, StreamHandle stream, Callback callback,
                                              std::vector<MemorySpan> memory);

  struct Impl;
  explicit ReleaseQueue(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace capalloc

#endif  // CAPALLOC_RELEASE_HPP_
