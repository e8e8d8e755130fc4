// host_events.cpp: events of the host runtime.
//
// Events follow a generation model: a record on a running stream bumps
// `recorded` and enqueues a marker that raises `completed` when the worker
// reaches it, so an event reflects its latest record only, as a CUDA event
// does, and a wait made now waits for the generation recorded now, not for
// later records. A record on a capturing stream instead remembers a point of
// the capture (the recording stream's frontier): a stream that waits on it
// forks into the capture, and the origin stream waiting on it joins the
// recording stream's work back. Querying or synchronizing such an event while
// its capture is in progress is illegal and invalidates the capture.
#include <algorithm>
#include <string>
#include <utility>

#include "absl/strings/str_format.h"
#include "runtime/host_runtime.hpp"

namespace capalloc::detail {

absl::StatusOr<std::shared_ptr<EventState>> HostRuntime::find_event(
    EventHandle event, std::string_view call) const {
  const auto it = events_.find(event);
  if (it != events_.end()) return it->second;
  return absl::NotFoundError(absl::StrFormat(
      "%s: event %d not found (never created or already destroyed)", call, event));
}

std::shared_ptr<CaptureState> HostRuntime::live_capture_of(const EventState& event) const {
  if (event.capture_id == 0) return nullptr;
  const auto it = captures_.find(event.capture_id);
  return it == captures_.end() ? nullptr : it->second;
}

absl::StatusOr<EventHandle> HostRuntime::create_event(int device) {
  return guarded("host runtime: create_event", [&]() -> absl::StatusOr<EventHandle> {
    if (auto status = check_device(device, "create_event"); !status.ok()) return status;
    std::lock_guard lock(mu_);
    const EventHandle handle = next_event_;
    events_.emplace(handle, std::make_shared<EventState>(device));
    ++next_event_;
    return handle;
  });
}

absl::Status HostRuntime::destroy_event(EventHandle event) {
  std::lock_guard lock(mu_);
  // Markers and waits already enqueued hold the state; they finish normally.
  if (events_.erase(event) == 1) return absl::OkStatus();
  return absl::NotFoundError(absl::StrFormat(
      "destroy_event: event %d not found (never created or already destroyed)", event));
}

absl::Status HostRuntime::record_event(EventHandle event, StreamHandle stream) {
  return guarded("host runtime: record_event", [&]() -> absl::Status {
    std::lock_guard lock(mu_);
    auto ev = find_event(event, "record_event");
    if (!ev.ok()) return ev.status();
    auto st = find_stream(stream, "record_event");
    if (!st.ok()) return st.status();
    EventState& state = **ev;
    if (stream != kDefaultStream && (*st)->device != state.device) {
      return absl::InvalidArgumentError(
          absl::StrFormat("record_event: event %d is on device %d but stream %d is on device %d",
                          event, state.device, stream, (*st)->device));
    }

    if (CaptureState* capture = (*st)->capture.get(); capture != nullptr) {
      if (capture->status != CaptureStatus::kActive) return invalidated_error(*capture, stream);
      const CaptureMember& member = capture->members[stream];
      CaptureFrontier point = member.depends_on;
      point[stream] = member.own_nodes;
      state.capture_point = std::move(point);
      state.capture_dependencies = member.dependencies;
      state.capture_id = capture->id;
      return absl::OkStatus();
    }

    state.capture_id = 0;
    state.capture_point.clear();
    state.capture_dependencies.clear();
    std::uint64_t generation;
    {
      std::lock_guard event_lock(state.mu);
      generation = state.recorded + 1;
    }
    // Enqueue before publishing the generation: if enqueue throws, nobody
    // waits for a marker that will never run.
    (*st)->worker.enqueue(StreamWorker::Operation{
        .label = absl::StrFormat("record of event %d", event),
        .run = [ev = *ev, generation] {
          {
            std::lock_guard event_lock(ev->mu);
            ev->completed = std::max(ev->completed, generation);
          }
          ev->completed_cv.notify_all();
        }});
    std::lock_guard event_lock(state.mu);
    state.recorded = generation;
    return absl::OkStatus();
  });
}

absl::StatusOr<bool> HostRuntime::query_event(EventHandle event) {
  return guarded("host runtime: query_event", [&]() -> absl::StatusOr<bool> {
    std::lock_guard lock(mu_);
    auto ev = find_event(event, "query_event");
    if (!ev.ok()) return ev.status();
    if (auto capture = live_capture_of(**ev); capture != nullptr) {
      return invalidate(*capture, absl::StrFormat("query_event(event %d)", event),
                        "the event marks a point of the graph under construction, not of "
                        "any stream's execution");
    }
    std::lock_guard event_lock((*ev)->mu);
    return (*ev)->completed >= (*ev)->recorded;
  });
}

absl::Status HostRuntime::synchronize_event(EventHandle event) {
  return guarded("host runtime: synchronize_event", [&]() -> absl::Status {
    std::shared_ptr<EventState> state;
    {
      std::lock_guard lock(mu_);
      auto ev = find_event(event, "synchronize_event");
      if (!ev.ok()) return ev.status();
      if (auto capture = live_capture_of(**ev); capture != nullptr) {
        return invalidate(*capture, absl::StrFormat("synchronize_event(event %d)", event),
                          "the event marks a point of the graph under construction, not of "
                          "any stream's execution");
      }
      state = *std::move(ev);
    }
    std::unique_lock event_lock(state->mu);
    const std::uint64_t target = state->recorded;
    state->completed_cv.wait(event_lock, [&] { return state->completed >= target; });
    return absl::OkStatus();
  });
}

absl::Status HostRuntime::stream_wait_event(StreamHandle stream, EventHandle event) {
  return guarded("host runtime: stream_wait_event", [&]() -> absl::Status {
    std::lock_guard lock(mu_);
    auto ev = find_event(event, "stream_wait_event");
    if (!ev.ok()) return ev.status();
    auto st = find_stream(stream, "stream_wait_event");
    if (!st.ok()) return st.status();
    const std::shared_ptr<CaptureState> event_capture = live_capture_of(**ev);
    const std::string call =
        absl::StrFormat("stream_wait_event(stream %d, event %d)", stream, event);

    if (CaptureState* capture = (*st)->capture.get(); capture != nullptr) {
      if (capture->status != CaptureStatus::kActive) return invalidated_error(*capture, stream);
      if (event_capture == nullptr) {
        return invalidate(*capture, call,
                          "a capturing stream can only wait on an event recorded in the same "
                          "capture (CUDA needs cudaEventWaitExternal for any other)");
      }
      if (event_capture.get() != capture) {
        invalidate(*event_capture, call, "waiting from another capture would merge two graphs")
            .IgnoreError();  // both captures are invalid; the caller's error names its own
        return invalidate(*capture, call, "waiting on an event of another capture would merge "
                                          "two graphs");
      }
      CaptureMember& member = capture->members[stream];
      for (const auto& [other, nodes] : (*ev)->capture_point) {
        member.depends_on[other] = std::max(member.depends_on[other], nodes);
      }
      for (std::size_t node : (*ev)->capture_dependencies) {
        if (std::find(member.dependencies.begin(), member.dependencies.end(), node) ==
            member.dependencies.end()) {
          member.dependencies.push_back(node);
        }
      }
      return absl::OkStatus();
    }

    if (event_capture != nullptr) {  // the stream forks from the capture: it joins
      if (event_capture->status != CaptureStatus::kActive) {
        return invalidated_error(*event_capture, stream);
      }
      if (stream == kDefaultStream) {
        return invalidate(*event_capture, call,
                          "the default (legacy) stream cannot take part in a capture");
      }
      event_capture->members[stream] = CaptureMember{
          .depends_on = (*ev)->capture_point, .dependencies = (*ev)->capture_dependencies};
      (*st)->capture = event_capture;
      publish(*event_capture);
      count_capture_device(*event_capture, (*st)->device);
      return absl::OkStatus();
    }

    std::uint64_t target;
    {
      std::lock_guard event_lock((*ev)->mu);
      if ((*ev)->completed >= (*ev)->recorded) return absl::OkStatus();  // nothing to wait for
      target = (*ev)->recorded;
    }
    (*st)->worker.enqueue(StreamWorker::Operation{
        .label = absl::StrFormat("wait on event %d", event),
        .run = [ev = *ev, target] {
          std::unique_lock event_lock(ev->mu);
          ev->completed_cv.wait(event_lock, [&] { return ev->completed >= target; });
        }});
    return absl::OkStatus();
  });
}

}  // namespace capalloc::detail
