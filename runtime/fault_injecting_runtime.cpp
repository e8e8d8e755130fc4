// runtime/fault_injecting_runtime.cpp: see fault_injecting_runtime.hpp.
#include "runtime/fault_injecting_runtime.hpp"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace capalloc::detail {

std::string_view fault_category_name(FaultCategory category) {
  switch (category) {
    case FaultCategory::kReserve:
      return "reserve";
    case FaultCategory::kRelease:
      return "release";
    case FaultCategory::kEvent:
      return "event";
    case FaultCategory::kStream:
      return "stream";
    case FaultCategory::kLaunch:
      return "launch";
    case FaultCategory::kCapture:
      return "capture";
    case FaultCategory::kInstantiate:
      return "instantiate";
  }
  return "?";
}

bool Outstanding::none() const {
  return events == 0 && streams == 0 && graphs == 0 &&
         std::all_of(segments.begin(), segments.end(), [](std::size_t n) { return n == 0; }) &&
         std::all_of(bytes.begin(), bytes.end(), [](std::size_t n) { return n == 0; });
}

std::string Outstanding::describe() const {
  std::vector<std::string> devices;
  for (std::size_t d = 0; d < segments.size(); ++d) {
    devices.push_back(absl::StrFormat("device %d: %d segment(s), %d B", d, segments[d], bytes[d]));
  }
  return absl::StrFormat("%s; %d event(s), %d stream(s), %d graph(s)",
                         absl::StrJoin(devices, ", "), events, streams, graphs);
}

FaultInjectingRuntime::FaultInjectingRuntime(std::shared_ptr<DeviceRuntime> inner, FaultPlan plan)
    : in_(std::move(inner)), plans_{std::move(plan)} {}

void FaultInjectingRuntime::set_plan(FaultPlan plan) {
  std::lock_guard lock(mu_);
  plans_ = {std::move(plan)};
  calls_ = {};
  all_calls_ = 0;
}

void FaultInjectingRuntime::add_plan(FaultPlan plan) {
  std::lock_guard lock(mu_);
  plans_.push_back(std::move(plan));
}

std::array<std::uint64_t, kFaultCategories> FaultInjectingRuntime::calls() const {
  std::lock_guard lock(mu_);
  return calls_;
}

std::uint64_t FaultInjectingRuntime::calls(FaultCategory category) const {
  std::lock_guard lock(mu_);
  return calls_[static_cast<std::size_t>(category)];
}

std::vector<InjectedFault> FaultInjectingRuntime::injected() const {
  std::lock_guard lock(mu_);
  return injected_;
}

Outstanding FaultInjectingRuntime::outstanding() const {
  const auto devices = static_cast<std::size_t>(std::max(in_->device_count(), 1));
  std::lock_guard lock(mu_);
  Outstanding out;
  out.bytes.assign(devices, 0);
  out.segments.assign(devices, 0);
  for (const auto& [base, segment] : segments_) {
    const auto d = static_cast<std::size_t>(segment.first);
    if (d >= devices) continue;
    out.bytes[d] += segment.second;
    ++out.segments[d];
  }
  out.events = events_.size();
  out.streams = streams_.size();
  out.graphs = graphs_.size();
  return out;
}

std::vector<std::pair<HeldKind, std::uintptr_t>> FaultInjectingRuntime::held() const {
  std::lock_guard lock(mu_);
  std::vector<std::pair<HeldKind, std::uintptr_t>> out;
  for (const auto& [base, segment] : segments_) {
    out.emplace_back(HeldKind::kSegment, reinterpret_cast<std::uintptr_t>(base));
  }
  for (EventHandle e : events_) out.emplace_back(HeldKind::kEvent, e);
  for (StreamHandle s : streams_) out.emplace_back(HeldKind::kStream, s);
  for (GraphHandle g : graphs_) out.emplace_back(HeldKind::kGraph, g);
  return out;
}

std::string FaultInjectingRuntime::describe_outstanding() const {
  std::lock_guard lock(mu_);
  std::vector<std::string> parts;
  for (const auto& [base, segment] : segments_) {
    parts.push_back(absl::StrFormat("segment %p (device %d, %d B)", base, segment.first,
                                    segment.second));
  }
  for (EventHandle e : events_) parts.push_back(absl::StrFormat("event %#x", e));
  for (StreamHandle s : streams_) parts.push_back(absl::StrFormat("stream %#x", s));
  for (GraphHandle g : graphs_) parts.push_back(absl::StrFormat("graph %d", g));
  std::sort(parts.begin(), parts.end());
  return parts.empty() ? "nothing" : absl::StrJoin(parts, ", ");
}

void FaultInjectingRuntime::set_phase(std::string phase) {
  std::lock_guard lock(mu_);
  phase_ = std::move(phase);
}

void FaultInjectingRuntime::on_inject(std::function<void(const InjectedFault&)> callback) {
  std::lock_guard lock(mu_);
  on_inject_ = std::move(callback);
}

std::optional<absl::Status> FaultInjectingRuntime::next_call(
    FaultCategory category, std::string_view method, const std::function<std::string()>& describe,
    HeldKind held, std::uintptr_t handle) {
  InjectedFault fault;
  std::function<void(const InjectedFault&)> callback;
  {
    std::lock_guard lock(mu_);
    const std::uint64_t in_category = ++calls_[static_cast<std::size_t>(category)];
    const std::uint64_t overall = ++all_calls_;
    const FaultPlan* plan = nullptr;
    std::uint64_t number = 0;
    for (const FaultPlan& p : plans_) {
      if (p.nth == 0 || (p.category.has_value() && *p.category != category)) continue;
      const std::uint64_t n = p.category.has_value() ? in_category : overall;
      if (n >= p.nth && n - p.nth < p.count) {
        plan = &p;
        number = n;
        break;
      }
    }
    if (plan == nullptr) return std::nullopt;
    const absl::StatusCode code = plan->code.value_or(category == FaultCategory::kReserve
                                                          ? absl::StatusCode::kResourceExhausted
                                                          : absl::StatusCode::kInternal);
    fault.category = category;
    fault.number = number;
    fault.method = std::string(method);
    fault.call = describe();
    fault.phase = phase_;
    fault.held = held;
    fault.handle = handle;
    fault.status = absl::Status(
        code, absl::StrFormat("injected fault: %s call #%d%s (%s)", fault_category_name(category),
                              number, plan->category.has_value() ? "" : " of all categories",
                              fault.call));
    injected_.push_back(fault);
    callback = on_inject_;
  }
  if (callback) callback(fault);
  return fault.status;
}

// --- Segments --------------------------------------------------------------------

absl::StatusOr<void*> FaultInjectingRuntime::reserve(int device, std::size_t bytes) {
  if (auto fault = next_call(FaultCategory::kReserve, "reserve", [&] {
        return absl::StrFormat("reserve(device %d, %d B)", device, bytes);
      })) {
    return *fault;
  }
  auto result = in_->reserve(device, bytes);
  if (result.ok()) {
    std::lock_guard lock(mu_);
    segments_[*result] = {device, bytes};
  }
  return result;
}

absl::Status FaultInjectingRuntime::release(int device, void* ptr, std::size_t bytes) {
  if (auto fault = next_call(
          FaultCategory::kRelease, "release",
          [&] { return absl::StrFormat("release(device %d, %p, %d B)", device, ptr, bytes); },
          HeldKind::kSegment, reinterpret_cast<std::uintptr_t>(ptr))) {
    return *fault;
  }
  absl::Status s = in_->release(device, ptr, bytes);
  if (s.ok()) {
    std::lock_guard lock(mu_);
    segments_.erase(ptr);
  }
  return s;
}

// --- Streams -----------------------------------------------------------------------

absl::StatusOr<StreamHandle> FaultInjectingRuntime::create_stream(int device) {
  if (auto fault = next_call(FaultCategory::kStream, "create_stream",
                             [&] { return absl::StrFormat("create_stream(device %d)", device); })) {
    return *fault;
  }
  auto result = in_->create_stream(device);
  if (result.ok()) {
    std::lock_guard lock(mu_);
    streams_.insert(*result);
  }
  return result;
}

absl::Status FaultInjectingRuntime::destroy_stream(StreamHandle stream) {
  if (auto fault = next_call(
          FaultCategory::kStream, "destroy_stream",
          [&] { return absl::StrFormat("destroy_stream(%#x)", stream); }, HeldKind::kStream,
          stream)) {
    return *fault;
  }
  absl::Status s = in_->destroy_stream(stream);
  if (s.ok()) {
    std::lock_guard lock(mu_);
    streams_.erase(stream);
  }
  return s;
}

absl::Status FaultInjectingRuntime::synchronize_stream(StreamHandle stream) {
  auto fault = next_call(FaultCategory::kStream, "synchronize_stream", [&] {
    return absl::StrFormat("synchronize_stream(%#x)", stream);
  });
  absl::Status s = in_->synchronize_stream(stream);  // waits, failed or not
  return fault.has_value() ? *fault : s;
}

// --- Events ------------------------------------------------------------------------

absl::StatusOr<EventHandle> FaultInjectingRuntime::create_event(int device) {
  if (auto fault = next_call(FaultCategory::kEvent, "create_event",
                             [&] { return absl::StrFormat("create_event(device %d)", device); })) {
    return *fault;
  }
  auto result = in_->create_event(device);
  if (result.ok()) {
    std::lock_guard lock(mu_);
    events_.insert(*result);
  }
  return result;
}

absl::Status FaultInjectingRuntime::destroy_event(EventHandle event) {
  if (auto fault = next_call(
          FaultCategory::kEvent, "destroy_event",
          [&] { return absl::StrFormat("destroy_event(%#x)", event); }, HeldKind::kEvent, event)) {
    return *fault;
  }
  absl::Status s = in_->destroy_event(event);
  if (s.ok()) {
    std::lock_guard lock(mu_);
    events_.erase(event);
  }
  return s;
}

absl::Status FaultInjectingRuntime::record_event(EventHandle event, StreamHandle stream) {
  if (auto fault = next_call(FaultCategory::kEvent, "record_event", [&] {
        return absl::StrFormat("record_event(%#x, stream %#x)", event, stream);
      })) {
    return *fault;
  }
  return in_->record_event(event, stream);
}

absl::StatusOr<bool> FaultInjectingRuntime::query_event(EventHandle event) {
  if (auto fault = next_call(FaultCategory::kEvent, "query_event",
                             [&] { return absl::StrFormat("query_event(%#x)", event); })) {
    return *fault;
  }
  return in_->query_event(event);
}

absl::Status FaultInjectingRuntime::synchronize_event(EventHandle event) {
  auto fault = next_call(FaultCategory::kEvent, "synchronize_event",
                         [&] { return absl::StrFormat("synchronize_event(%#x)", event); });
  absl::Status s = in_->synchronize_event(event);  // waits, failed or not
  return fault.has_value() ? *fault : s;
}

absl::Status FaultInjectingRuntime::stream_wait_event(StreamHandle stream, EventHandle event) {
  if (auto fault = next_call(FaultCategory::kEvent, "stream_wait_event", [&] {
        return absl::StrFormat("stream_wait_event(stream %#x, %#x)", stream, event);
      })) {
    return *fault;
  }
  return in_->stream_wait_event(stream, event);
}

// --- Work ----------------------------------------------------------------------------

absl::Status FaultInjectingRuntime::launch_kernel(StreamHandle stream, KernelLaunch kernel) {
  if (auto fault = next_call(FaultCategory::kLaunch, "launch_kernel", [&] {
        return absl::StrFormat("launch_kernel(stream %#x, %s)", stream, kernel.name);
      })) {
    return *fault;
  }
  return in_->launch_kernel(stream, std::move(kernel));
}

absl::Status FaultInjectingRuntime::memset_async(void* dst, int value, std::size_t bytes,
                                                 StreamHandle stream) {
  if (auto fault = next_call(FaultCategory::kLaunch, "memset_async", [&] {
        return absl::StrFormat("memset_async(%p, %d, %d B, stream %#x)", dst, value, bytes, stream);
      })) {
    return *fault;
  }
  return in_->memset_async(dst, value, bytes, stream);
}

absl::Status FaultInjectingRuntime::memcpy_async(void* dst, const void* src, std::size_t bytes,
                                                 StreamHandle stream) {
  if (auto fault = next_call(FaultCategory::kLaunch, "memcpy_async", [&] {
        return absl::StrFormat("memcpy_async(%p, %p, %d B, stream %#x)", dst, src, bytes, stream);
      })) {
    return *fault;
  }
  return in_->memcpy_async(dst, src, bytes, stream);
}

absl::Status FaultInjectingRuntime::launch_graph(GraphHandle graph, StreamHandle stream) {
  if (auto fault = next_call(FaultCategory::kLaunch, "launch_graph", [&] {
        return absl::StrFormat("launch_graph(%d, stream %#x)", graph, stream);
      })) {
    return *fault;
  }
  return in_->launch_graph(graph, stream);
}

// --- Capture and graphs ----------------------------------------------------------------

absl::StatusOr<CaptureId> FaultInjectingRuntime::begin_capture(StreamHandle stream,
                                                               CaptureMode mode) {
  if (auto fault = next_call(FaultCategory::kCapture, "begin_capture", [&] {
        return absl::StrFormat("begin_capture(stream %#x, mode %d)", stream,
                               static_cast<int>(mode));
      })) {
    return *fault;
  }
  return in_->begin_capture(stream, mode);
}

absl::StatusOr<GraphHandle> FaultInjectingRuntime::end_capture(StreamHandle stream) {
  // Either step failing ends the capture with no graph, as an invalidated
  // capture's end does.
  if (auto fault = next_call(FaultCategory::kCapture, "end_capture", [&] {
        return absl::StrFormat("end_capture(stream %#x)", stream);
      })) {
    if (auto graph = in_->end_capture(stream); graph.ok()) in_->destroy_graph(*graph).IgnoreError();
    return *fault;
  }
  auto graph = in_->end_capture(stream);
  if (!graph.ok()) return graph;
  if (auto fault = next_call(FaultCategory::kInstantiate, "end_capture", [&] {
        return absl::StrFormat("end_capture(stream %#x): instantiating its graph", stream);
      })) {
    in_->destroy_graph(*graph).IgnoreError();
    return *fault;
  }
  std::lock_guard lock(mu_);
  graphs_.insert(*graph);
  return graph;
}

absl::Status FaultInjectingRuntime::destroy_graph(GraphHandle graph) {
  if (auto fault = next_call(
          FaultCategory::kInstantiate, "destroy_graph",
          [&] { return absl::StrFormat("destroy_graph(%d)", graph); }, HeldKind::kGraph, graph)) {
    return *fault;
  }
  absl::Status s = in_->destroy_graph(graph);
  if (s.ok()) {
    std::lock_guard lock(mu_);
    graphs_.erase(graph);
  }
  return s;
}

}  // namespace capalloc::detail
