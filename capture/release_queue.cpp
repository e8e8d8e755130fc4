// capture/release_queue.cpp: the ReleaseQueue (capalloc/release.hpp).
//
// It lives in the capture layer because it needs both what lies below (the
// runtime's events and capture state) and the capture tracker's records of
// live graphs; nothing below it knows it exists.
//
// State: `pending` holds the releases not yet run, in request order, under
// `mu`. The progress thread takes the whole list out, asks the runtime and
// the tracker about each entry without holding `mu` (so a release() or a
// graph's end never waits for a query), runs the callbacks that are ready,
// and puts the rest back in front of whatever arrived meanwhile. Lock order:
// the runtime's locks, then `mu` (a graph-gone notice runs inside the
// runtime and takes `mu`); `mu` is never held while calling the runtime, the
// tracker or a callback.
//
// Waiting: the runtime has no "wait for any of these events", so the thread
// polls with a back-off (from kMinPoll doubling to kMaxPoll) while releases
// are pending, and sleeps on `wake` when none are. A new request or a
// graph-gone notice wakes it at once.
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <exception>
#include <limits>
#include <list>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_format.h"
#include "allocator/trace_hooks.hpp"
#include "capalloc/allocator.hpp"
#include "capalloc/capture.hpp"
#include "capalloc/release.hpp"
#include "common/guarded.hpp"
#include "common/log.hpp"
#include "common/status_macros.hpp"

namespace capalloc {

namespace {

constexpr std::chrono::microseconds kMinPoll{20};
constexpr std::chrono::microseconds kMaxPoll{2000};

// Shared with the graph-gone notices the runtime may deliver after the
// queue is gone: they only set a flag and wake whoever waits.
struct Wakeup {
  std::mutex mu;
  std::condition_variable cv;
  std::uint64_t generation = 0;  // bumped by every request and notice; guarded by mu
};

struct Entry {
  int device = 0;
  StreamHandle stream = kDefaultStream;
  // Marks the stream's work up to the request (0: not recorded yet, for a
  // release on a capturing stream until its graph is gone).
  EventHandle event = 0;
  // Set for a release requested during a capture: true once its graph is gone.
  std::shared_ptr<std::atomic<bool>> capture_graph_gone;
  std::vector<MemorySpan> memory;
  ReleaseQueue::Callback callback;
  std::uint64_t number = 0;  // the request's number in the event trace
};

}  // namespace

struct CAPALLOC_INTERNAL ReleaseQueue::Impl {
  MemoryRuntime* runtime = nullptr;
  const CaptureTracker* tracker = nullptr;  // null: no graph records hold releases

  std::shared_ptr<Wakeup> wakeup = std::make_shared<Wakeup>();
  // Guarded by wakeup->mu.
  std::list<Entry> pending;
  bool stopping = false;
  bool drained = false;
  absl::flat_hash_map<int, std::vector<EventHandle>> spare_events;  // per device
  ReleaseQueueStats counts;
  std::thread thread;
  std::thread::id thread_id;
  std::mutex hooks_mu;  // held while the hooks run; before teardown_mu
  std::map<std::uint64_t, absl::AnyInvocable<void()>> teardown_hooks;  // guarded by hooks_mu
  std::uint64_t next_hook = 1;                                        // guarded by hooks_mu
  std::mutex teardown_mu;                          // held for the whole of teardown(); before `mu`
  std::atomic<std::thread::id> tearing_down_on{};  // the thread in teardown(), if any
  std::atomic<std::uint64_t> next_number{1};       // numbers the requests (event trace)
  // The process that made the queue. A child made by fork() has a copy of
  // the queue without its progress thread (and maybe with `mu` locked by
  // it): there the queue refuses releases, and teardown touches nothing.
  const pid_t owner_pid = ::getpid();

  bool forked() const { return ::getpid() != owner_pid; }
  absl::Status refuse_in_child(const char* call) const {
    return absl::FailedPreconditionError(absl::StrFormat(
        "%s: this process is a fork() child of process %d, which made the release queue; its "
        "progress thread does not exist here, so nothing would ever run the release (release "
        "before fork, or exec a new program)",
        call, static_cast<int>(owner_pid)));
  }

  std::mutex& mu() const { return wakeup->mu; }

  absl::StatusOr<EventHandle> take_event(int device) {
    {
      std::lock_guard lock(mu());
      auto& spare = spare_events[device];
      if (!spare.empty()) {
        const EventHandle event = spare.back();
        spare.pop_back();
        return event;
      }
    }
    return runtime->create_event(device);
  }
  void give_back_event(int device, EventHandle event) {
    if (event == 0) return;
    {
      std::lock_guard lock(mu());
      if (!drained) {
        spare_events[device].push_back(event);
        return;
      }
    }
    runtime->destroy_event(event).IgnoreError();  // teardown has destroyed the spares
  }

  bool held_by_graph(const Entry& e) const {
    if (e.capture_graph_gone != nullptr && !e.capture_graph_gone->load()) return true;
    if (tracker == nullptr) return false;
    return std::any_of(e.memory.begin(), e.memory.end(),
                       [&](const MemorySpan& span) { return tracker->graph_uses(e.device, span); });
  }

  // Once a capture's graph is gone, marks the stream's work from then on.
  // False while the stream is capturing again (retried on a later pass).
  // A stream destroyed meanwhile has no work left (destroy_stream waits for
  // it), so the entry is ready without an event.
  bool mark_after_graph(Entry& e) {
    auto before = runtime->capture_info(e.stream);
    if (!before.ok()) return true;  // the stream is gone, and its work with it
    if (before->status != CaptureStatus::kNone) return false;
    auto event = take_event(e.device);
    if (!event.ok()) return false;
    if (!runtime->record_event(*event, e.stream).ok()) {
      give_back_event(e.device, *event);
      return !runtime->capture_info(e.stream).ok();
    }
    // A capture begun on the stream between the two questions would have
    // made the record a point of its graph, which must not be queried.
    auto after = runtime->capture_info(e.stream);
    if (after.ok() && after->status != CaptureStatus::kNone) {
      give_back_event(e.device, *event);
      return false;
    }
    e.event = *event;
    return true;
  }

  // Whether the work the entry waits for has completed (its graph, if any,
  // is gone: held_by_graph said no). Calls the runtime; `mu` is not held.
  bool work_done(Entry& e) {
    if (e.event == 0) {
      if (!mark_after_graph(e)) return false;
      if (e.event == 0) return true;
    }
    auto done = runtime->query_event(e.event);
    return done.ok() && *done;
  }

  // The event trace of the tracker's allocator (docs/trace.md: `release`
  // and `release_done`, by the first memory span's address; none without a
  // tracker, or when no trace runs).
  void trace_requested(Entry& e) {
    e.number = next_number.fetch_add(1, std::memory_order_relaxed);
    if (tracker == nullptr) return;
    detail::trace_release(tracker->allocator(), e.number, 0,
                          e.memory.empty() ? nullptr : e.memory[0].ptr, e.stream);
  }
  void trace_done(const Entry& e) const {
    if (tracker == nullptr) return;
    detail::trace_release_done(tracker->allocator(), e.number, 0,
                               e.memory.empty() ? nullptr : e.memory[0].ptr);
  }

  void run_callback(Entry& e, bool at_teardown) {
    Callback callback = std::move(e.callback);
    try {
      std::move(callback)();
    } catch (const std::exception& ex) {
      detail::log().error("release queue: a release callback threw ({}); it was dropped",
                          ex.what());
    } catch (...) {
      detail::log().error("release queue: a release callback threw; it was dropped");
    }
    // Destroyed here, before the count says it ran: whatever the callback
    // held is gone once `completed` counts it (seed 000: no release keeps
    // the caller's objects past its run).
    { Callback gone = std::move(callback); }
    trace_done(e);
    give_back_event(e.device, e.event);
    std::lock_guard lock(mu());
    ++counts.completed;
    --counts.pending;
    if (at_teardown) ++counts.run_at_teardown;
  }

  void progress_loop() {
    std::unique_lock lock(mu());
    auto poll = kMinPoll;
    while (!stopping) {
      if (pending.empty()) {
        const std::uint64_t seen = wakeup->generation;
        wakeup->cv.wait(lock, [&] { return stopping || wakeup->generation != seen; });
        poll = kMinPoll;
        continue;
      }
      std::list<Entry> work;
      work.splice(work.end(), pending);
      const std::uint64_t seen = wakeup->generation;
      lock.unlock();

      // Events on one stream complete in order: once one is not done, the
      // later requests on that stream (recorded after it) are not either.
      // A request held by a graph does not hold back the ones after it.
      absl::flat_hash_set<StreamHandle> blocked;
      std::list<Entry> done;
      std::uint64_t held = 0;
      for (auto it = work.begin(); it != work.end();) {
        const bool in_stream_order = it->capture_graph_gone == nullptr;
        if (in_stream_order && blocked.contains(it->stream)) {
          ++it;
          continue;
        }
        if (held_by_graph(*it)) {
          ++held;
          ++it;
          continue;
        }
        if (work_done(*it)) {
          auto next = std::next(it);
          done.splice(done.end(), work, it);
          it = next;
          continue;
        }
        if (in_stream_order) blocked.insert(it->stream);
        ++it;
      }
      {
        std::lock_guard count_lock(mu());
        counts.held_by_graphs = held;
      }
      for (Entry& e : done) run_callback(e, /*at_teardown=*/false);

      lock.lock();
      pending.splice(pending.begin(), work);
      if (!done.empty()) {
        poll = kMinPoll;
        continue;
      }
      wakeup->cv.wait_for(lock, poll, [&] { return stopping || wakeup->generation != seen; });
      poll = std::min(poll * 2, kMaxPoll);
    }
  }

  // Stops the thread, then runs what is pending on the calling thread.
  void teardown() {
    if (forked()) {
      // The pending releases are the parent's (running them here would run
      // each twice), the thread is not here to join, and `mu` may be locked
      // forever: leave everything, and let the std::thread go without a
      // join (its destructor would terminate the child).
      static_cast<void>(new std::thread(std::move(thread)));
      return;
    }
    {
      // What the hooks release goes to the queue before it stops (or, after
      // an earlier teardown, runs at once once its stream's work is done,
      // on this thread: a deleter calling drain() from there is refused).
      std::lock_guard hooks_lock(hooks_mu);
      const std::thread::id before = tearing_down_on.exchange(std::this_thread::get_id());
      for (auto& [id, hook] : teardown_hooks) hook();
      tearing_down_on = before;
    }
    // One teardown at a time: a second caller (drain() racing the
    // destructor or another drain()) waits for the first, then finds it done.
    std::lock_guard once(teardown_mu);
    {
      std::lock_guard lock(mu());
      if (drained) return;
      stopping = true;
      ++wakeup->generation;
    }
    tearing_down_on = std::this_thread::get_id();
    wakeup->cv.notify_all();
    if (thread.joinable()) thread.join();
    std::list<Entry> rest;
    {
      std::lock_guard lock(mu());
      rest.splice(rest.end(), pending);
      drained = true;
    }
    std::uint64_t forced = 0;
    for (Entry& e : rest) {
      if (held_by_graph(e)) ++forced;
      if (e.event == 0 && e.capture_graph_gone != nullptr) mark_after_graph(e);
      if (e.event != 0) {
        if (auto waited = runtime->synchronize_event(e.event); !waited.ok()) {
          detail::log().error(
              "release queue teardown: waiting for stream 0x{:x} failed ({}); its "
              "release runs anyway",
              e.stream, waited.ToString());
        }
      }
      run_callback(e, /*at_teardown=*/true);
    }
    if (forced > 0) {
      detail::log().warn(
          "release queue teardown: {} release(s) still held by a live graph or capture "
          "ran anyway",
          forced);
    }
    std::vector<std::pair<int, EventHandle>> events;
    {
      std::lock_guard lock(mu());
      counts.forced_at_teardown += forced;
      counts.held_by_graphs = 0;
      for (auto& [device, spare] : spare_events) {
        for (EventHandle ev : spare) events.emplace_back(device, ev);
        spare.clear();
      }
    }
    for (const auto& [device, ev] : events) runtime->destroy_event(ev).IgnoreError();
    tearing_down_on = std::thread::id();
  }

  // Asks the runtime to say when the graph the capture on `stream` builds
  // is gone. The notice only sets the flag and wakes the thread, and may
  // come after the queue is gone.
  absl::StatusOr<std::shared_ptr<std::atomic<bool>>> watch_graph(StreamHandle stream) {
    auto gone = std::make_shared<std::atomic<bool>>(false);
    std::weak_ptr<Wakeup> weak = wakeup;
    absl::Status watched = runtime->watch_capture_graph(stream, [gone, weak] {
      gone->store(true);
      if (auto w = weak.lock()) {
        {
          std::lock_guard lock(w->mu);
          ++w->generation;
        }
        w->cv.notify_all();
      }
    });
    if (!watched.ok()) {
      return absl::Status(watched.code(),
                          absl::StrFormat("release on capturing stream 0x%x: %s; release after "
                                          "the capture has ended and its graph is destroyed",
                                          stream, watched.message()));
    }
    return gone;
  }

  // After teardown: waits for the stream's work here, then runs.
  absl::Status release_now(Entry e) {
    auto info = runtime->capture_info(e.stream);
    if (!info.ok()) return info.status();
    if (info->status != CaptureStatus::kNone) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "release on stream 0x%x: the release queue was drained (teardown) and the stream is "
          "capturing; nothing would hold the release until the graph is gone",
          e.stream));
    }
    auto event = runtime->create_event(e.device);
    if (!event.ok()) return event.status();
    absl::Status waited = runtime->record_event(*event, e.stream);
    if (waited.ok()) waited = runtime->synchronize_event(*event);
    runtime->destroy_event(*event).IgnoreError();
    if (!waited.ok()) return waited;
    {
      std::lock_guard lock(mu());
      ++counts.requested;
      ++counts.pending;
    }
    run_callback(e, /*at_teardown=*/true);
    return absl::OkStatus();
  }
};

ReleaseQueue::ReleaseQueue(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

absl::StatusOr<std::unique_ptr<ReleaseQueue>> ReleaseQueue::create(MemoryRuntime& runtime) {
  return detail::guarded("release queue", [&]() -> absl::StatusOr<std::unique_ptr<ReleaseQueue>> {
    auto impl = std::make_unique<Impl>();
    impl->runtime = &runtime;
    Impl* raw = impl.get();
    std::unique_ptr<ReleaseQueue> queue(new ReleaseQueue(std::move(impl)));
    raw->thread = std::thread([raw] { raw->progress_loop(); });
    raw->thread_id = raw->thread.get_id();
    return queue;
  });
}

absl::StatusOr<std::unique_ptr<ReleaseQueue>> ReleaseQueue::create(const CaptureTracker& tracker) {
  auto queue = create(tracker.allocator().runtime());
  if (queue.ok()) (*queue)->impl_->tracker = &tracker;
  return queue;
}

ReleaseQueue::~ReleaseQueue() { impl_->teardown(); }

absl::Status ReleaseQueue::drain() {
  if (impl_->forked()) {
    impl_->teardown();  // leaves the parent's releases alone
    return impl_->refuse_in_child("ReleaseQueue::drain");
  }
  if (std::this_thread::get_id() == impl_->thread_id) {
    return absl::FailedPreconditionError(
        "ReleaseQueue::drain: called from a release callback (the progress thread would wait "
        "for itself)");
  }
  if (std::this_thread::get_id() == impl_->tearing_down_on.load()) {
    return absl::FailedPreconditionError(
        "ReleaseQueue::drain: called from a release callback run by teardown (drain(), the "
        "destructor or the exit handler is already draining on this thread)");
  }
  impl_->teardown();
  return absl::OkStatus();
}

std::uint64_t ReleaseQueue::add_teardown_hook(absl::AnyInvocable<void()> hook) {
  std::lock_guard lock(impl_->hooks_mu);
  const std::uint64_t id = impl_->next_hook++;
  impl_->teardown_hooks.emplace(id, std::move(hook));
  return id;
}

void ReleaseQueue::remove_teardown_hook(std::uint64_t id) {
  std::lock_guard lock(impl_->hooks_mu);
  impl_->teardown_hooks.erase(id);
}

absl::Status ReleaseQueue::check_process(const char* call) const {
  return impl_->forked() ? impl_->refuse_in_child(call) : absl::OkStatus();
}

ReleaseQueueStats ReleaseQueue::stats() const {
  std::lock_guard lock(impl_->mu());
  return impl_->counts;
}

MemoryRuntime& ReleaseQueue::runtime() const { return *impl_->runtime; }

namespace {

absl::Status check_request(MemoryRuntime& runtime, int device, const ReleaseQueue::Callback& callback,
                           const std::vector<MemorySpan>& memory) {
  if (!callback) return absl::InvalidArgumentError("release: the callback is empty");
  if (device < 0 || device >= runtime.device_count()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "release: device %d does not exist (the runtime has %d)", device, runtime.device_count()));
  }
  for (const MemorySpan& span : memory) {
    if (span.ptr == nullptr || span.bytes == 0) {
      return absl::InvalidArgumentError(
          "release: a memory span is empty (null pointer or zero bytes); name the memory the "
          "callback gives back, or none");
    }
    if (span.bytes > std::numeric_limits<std::uintptr_t>::max() - span.begin()) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "release: the memory span at %p of %u bytes runs past the end of the address space",
          span.ptr, span.bytes));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ReleaseQueue::release_after_stream_destroyed(int device, StreamHandle stream,
                                                          Callback callback,
                                                          std::vector<MemorySpan> memory) {
  return detail::guarded("release queue", [&]() -> absl::Status {
    if (impl_->forked()) return impl_->refuse_in_child("release");
    CAPALLOC_RETURN_IF_ERROR(check_request(*impl_->runtime, device, callback, memory));
    // No event and no capture flag: work_done() finds the stream gone and
    // the entry ready (or, should a new stream have the handle by then,
    // waits for that stream's work: later than needed, never earlier).
    Entry e{.device = device,
            .stream = stream,
            .memory = std::move(memory),
            .callback = std::move(callback)};
    impl_->trace_requested(e);
    {
      std::unique_lock lock(impl_->mu());
      ++impl_->counts.requested;
      ++impl_->counts.pending;
      if (!impl_->drained) {
        impl_->pending.push_back(std::move(e));
        ++impl_->wakeup->generation;
        lock.unlock();
        impl_->wakeup->cv.notify_all();
        return absl::OkStatus();
      }
    }
    impl_->run_callback(e, /*at_teardown=*/true);
    return absl::OkStatus();
  });
}

absl::Status ReleaseQueue::release(int device, StreamHandle stream, Callback callback,
                                   std::vector<MemorySpan> memory) {
  return detail::guarded("release queue", [&]() -> absl::Status {
    if (impl_->forked()) return impl_->refuse_in_child("release");
    CAPALLOC_RETURN_IF_ERROR(check_request(*impl_->runtime, device, callback, memory));
    Entry e{.device = device,
            .stream = stream,
            .memory = std::move(memory),
            .callback = std::move(callback)};
    impl_->trace_requested(e);
    bool drained;
    {
      std::lock_guard lock(impl_->mu());
      drained = impl_->drained;
    }
    if (drained) return impl_->release_now(std::move(e));

    auto info = impl_->runtime->capture_info(stream);
    if (!info.ok()) return info.status();
    if (info->status == CaptureStatus::kInvalidated) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "release on stream 0x%x: the stream's capture %d was invalidated; end it first (its "
          "graph will never exist), then release",
          stream, info->id));
    }
    if (info->status == CaptureStatus::kNone) {
      CAPALLOC_ASSIGN_OR_RETURN(e.event, impl_->take_event(device));
      absl::Status recorded = impl_->runtime->record_event(e.event, stream);
      if (!recorded.ok()) {
        impl_->give_back_event(device, e.event);
        return recorded;
      }
      // A capture begun on the stream meanwhile (from another thread) made
      // the record a point of its graph: such an event must not be queried,
      // so the release waits for that graph instead.
      auto after = impl_->runtime->capture_info(stream);
      if (after.ok() && after->status == CaptureStatus::kActive) {
        impl_->give_back_event(device, e.event);
        e.event = 0;
        info = after;
      }
    }
    if (info->status == CaptureStatus::kActive) {
      CAPALLOC_ASSIGN_OR_RETURN(e.capture_graph_gone, impl_->watch_graph(stream));
    }
    {
      std::unique_lock lock(impl_->mu());
      if (!impl_->drained) {
        impl_->pending.push_back(std::move(e));
        ++impl_->counts.requested;
        ++impl_->counts.pending;
        ++impl_->wakeup->generation;
        lock.unlock();
        impl_->wakeup->cv.notify_all();
        return absl::OkStatus();
      }
      // drain() ran while this call was on its way: it will not see the
      // entry, so it runs here, as after teardown.
      ++impl_->counts.requested;
      ++impl_->counts.pending;
    }
    if (e.event != 0) impl_->runtime->synchronize_event(e.event).IgnoreError();
    impl_->run_callback(e, /*at_teardown=*/true);
    return absl::OkStatus();
  });
}

}  // namespace capalloc
