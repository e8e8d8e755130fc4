// runtime/fault_injecting_runtime.hpp: a DeviceRuntime decorator that makes
// chosen runtime calls fail, and counts what the layers above it hold
// (issue 11, reliability; docs/fault-injection.md). Internal: built for the
// tests (tests/fault_injection_test.cpp), not part of libcapalloc.
//
// It forwards every call to the runtime it wraps and numbers the calls of
// seven categories, from 1, in the order they reach it:
//
//   reserve      reserve
//   release      release
//   event        create_event, destroy_event, record_event, query_event,
//                synchronize_event, stream_wait_event
//   stream       create_stream, destroy_stream, synchronize_stream
//   launch       launch_kernel, memset_async, memcpy_async, launch_graph
//   capture      begin_capture, end_capture (the end of the capture)
//   instantiate  end_capture (making the executable graph, once the capture
//                ended), destroy_graph
//
// (The interface has no separate instantiate call: end_capture ends the
// capture and returns an executable graph, as cudaStreamEndCapture followed
// by cudaGraphInstantiate does. A fault of its capture step fails the end;
// one of its instantiate step fails after a successful end.) Queries that
// cannot fail on a real device in any way a caller could act on
// (device_count, memory_info, capture_info, any_capture_active,
// stream_device, graph_writes, graph_dependencies, captured_graph_*,
// exchange_thread_capture_mode, watch_*) are forwarded, not counted, never
// failed.
//
// A FaultPlan fails the Nth call of one category (or the Nth call of all
// seven together), and optionally the calls after it; several plans may be
// active at once. What a failed call
// does, chosen to match CUDA's semantics:
//   - most calls do nothing and return the error: no memory reserved or
//     released, no event or stream created or destroyed, nothing enqueued,
//     no capture begun. In particular a failed release/destroy leaves the
//     resource held (a failed cudaFree does not free): the counts below keep
//     it outstanding, and it is the caller's to release again;
//   - end_capture (either step) ends the capture and makes no graph, as an
//     invalidated capture's cudaStreamEndCapture does (the stream leaves
//     capture mode; a graph the inner runtime made is destroyed at once);
//   - synchronize_stream and synchronize_event wait, then return the error:
//     the way a real synchronization fails is by reporting an error of the
//     work it waited for.
// The error is kResourceExhausted for reserve (what an out-of-memory device
// returns) and kInternal otherwise, unless the plan names a code; the
// message is "injected fault: <category> call #<N> (<the call>)".
//
// Thread-safe: calls may come from any thread; counters and the resource
// tables are guarded by one mutex, never held across a forwarded call.
#ifndef CAPALLOC_RUNTIME_FAULT_INJECTING_RUNTIME_HPP_
#define CAPALLOC_RUNTIME_FAULT_INJECTING_RUNTIME_HPP_

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "capalloc/runtime.hpp"

namespace capalloc::detail {

enum class FaultCategory : std::uint8_t {
  kReserve,
  kRelease,
  kEvent,
  kStream,
  kLaunch,
  kCapture,
  kInstantiate,
};
inline constexpr std::size_t kFaultCategories = 7;
inline constexpr std::array<FaultCategory, kFaultCategories> kAllFaultCategories = {
    FaultCategory::kReserve, FaultCategory::kRelease, FaultCategory::kEvent,
    FaultCategory::kStream,  FaultCategory::kLaunch,  FaultCategory::kCapture,
    FaultCategory::kInstantiate};
// "reserve", "release", "event", "stream", "launch", "capture", "instantiate".
std::string_view fault_category_name(FaultCategory category);

struct FaultPlan {
  // The category whose calls are numbered; unset: all categories together.
  std::optional<FaultCategory> category;
  // The first call to fail, 1-based; 0 fails nothing (a counting run).
  std::uint64_t nth = 0;
  // How many calls fail from the nth on (1: only the nth).
  std::uint64_t count = 1;
  // The error code; unset: kResourceExhausted for reserve, else kInternal.
  std::optional<absl::StatusCode> code;
};

// What a failed release or destroy left held.
enum class HeldKind : std::uint8_t { kNone, kSegment, kEvent, kStream, kGraph };

struct InjectedFault {
  FaultCategory category = FaultCategory::kReserve;
  std::uint64_t number = 0;  // the call's number in the plan's numbering
  std::string call;          // e.g. "release(device 0, 0x7f.., 2097152 B)"
  std::string method;        // e.g. "release"
  std::string phase;         // the phase set when it fired (set_phase)
  absl::Status status;       // what the caller got
  HeldKind held = HeldKind::kNone;
  std::uintptr_t handle = 0;  // the segment's base, the event, stream or graph
};

// What callers of the wrapped runtime hold, from their successful calls.
struct Outstanding {
  std::vector<std::size_t> bytes;     // per device: reserved minus released
  std::vector<std::size_t> segments;  // per device
  std::size_t events = 0;             // created minus destroyed
  std::size_t streams = 0;            // created minus destroyed (the default stream is not counted)
  std::size_t graphs = 0;             // made by end_capture minus destroyed
  bool none() const;
  std::string describe() const;
};

class FaultInjectingRuntime final : public DeviceRuntime {
 public:
  explicit FaultInjectingRuntime(std::shared_ptr<DeviceRuntime> inner, FaultPlan plan = {});

  // Replaces the plans with one; numbering starts again from 1 for every
  // category.
  void set_plan(FaultPlan plan);
  // Adds a plan (numbering goes on): a call fails if any plan says so.
  void add_plan(FaultPlan plan);
  // Calls of each category since the last set_plan (or construction),
  // failed ones included, indexed by FaultCategory.
  std::array<std::uint64_t, kFaultCategories> calls() const;
  std::uint64_t calls(FaultCategory category) const;
  // The calls failed so far.
  std::vector<InjectedFault> injected() const;
  Outstanding outstanding() const;
  // The segments (by base), events, streams and graphs held now.
  std::vector<std::pair<HeldKind, std::uintptr_t>> held() const;
  // The same, in words (for messages).
  std::string describe_outstanding() const;
  // A label recorded with each injected fault (the test's "run",
  // "teardown", ...).
  void set_phase(std::string phase);
  // Called (outside the wrapper's lock) right after a fault is injected.
  void on_inject(std::function<void(const InjectedFault&)> callback);

  DeviceRuntime& inner() const { return *in_; }

  // --- MemoryRuntime ---------------------------------------------------------------
  RuntimeKind kind() const override { return in_->kind(); }
  int device_count() const override { return in_->device_count(); }
  absl::StatusOr<DeviceMemoryInfo> memory_info(int device) const override {
    return in_->memory_info(device);
  }
  absl::StatusOr<void*> reserve(int device, std::size_t bytes) override;
  absl::Status release(int device, void* ptr, std::size_t bytes) override;
  CaptureMode exchange_thread_capture_mode(CaptureMode mode) override {
    return in_->exchange_thread_capture_mode(mode);
  }
  absl::StatusOr<StreamHandle> create_stream(int device) override;
  absl::Status destroy_stream(StreamHandle stream) override;
  void watch_stream_destruction(std::function<bool(StreamHandle)> on_destroyed) override {
    in_->watch_stream_destruction(std::move(on_destroyed));
  }
  absl::Status synchronize_stream(StreamHandle stream) override;
  absl::StatusOr<EventHandle> create_event(int device) override;
  absl::Status destroy_event(EventHandle event) override;
  absl::Status record_event(EventHandle event, StreamHandle stream) override;
  absl::StatusOr<bool> query_event(EventHandle event) override;
  absl::Status synchronize_event(EventHandle event) override;
  absl::Status stream_wait_event(StreamHandle stream, EventHandle event) override;
  absl::StatusOr<CaptureInfo> capture_info(StreamHandle stream) override {
    return in_->capture_info(stream);
  }
  bool any_capture_active(int device) const override { return in_->any_capture_active(device); }
  absl::StatusOr<int> stream_device(StreamHandle stream) override {
    return in_->stream_device(stream);
  }
  absl::Status watch_capture_graph(StreamHandle stream, std::function<void()> on_gone) override {
    return in_->watch_capture_graph(stream, std::move(on_gone));
  }

  // --- DeviceRuntime -----------------------------------------------------------------
  absl::Status launch_kernel(StreamHandle stream, KernelLaunch kernel) override;
  absl::Status memset_async(void* dst, int value, std::size_t bytes, StreamHandle stream) override;
  absl::Status memcpy_async(void* dst, const void* src, std::size_t bytes,
                            StreamHandle stream) override;
  absl::StatusOr<CaptureId> begin_capture(StreamHandle stream, CaptureMode mode) override;
  absl::StatusOr<GraphHandle> end_capture(StreamHandle stream) override;
  absl::Status launch_graph(GraphHandle graph, StreamHandle stream) override;
  absl::Status destroy_graph(GraphHandle graph) override;
  absl::StatusOr<std::vector<GraphWrite>> graph_writes(GraphHandle graph) override {
    return in_->graph_writes(graph);
  }
  absl::StatusOr<std::vector<GraphWrite>> captured_graph_writes(std::uintptr_t graph) override {
    return in_->captured_graph_writes(graph);
  }
  absl::StatusOr<GraphDependencies> captured_graph_dependencies(std::uintptr_t graph) override {
    return in_->captured_graph_dependencies(graph);
  }
  absl::StatusOr<GraphDependencies> graph_dependencies(GraphHandle graph) override {
    return in_->graph_dependencies(graph);
  }

 private:
  // Numbers one call of `category`; the error to return if it is to fail.
  // `describe` is called only then.
  std::optional<absl::Status> next_call(FaultCategory category, std::string_view method,
                                        const std::function<std::string()>& describe,
                                        HeldKind held = HeldKind::kNone,
                                        std::uintptr_t handle = 0);

  const std::shared_ptr<DeviceRuntime> in_;
  mutable std::mutex mu_;
  std::vector<FaultPlan> plans_;
  std::array<std::uint64_t, kFaultCategories> calls_{};
  std::uint64_t all_calls_ = 0;
  std::vector<InjectedFault> injected_;
  std::string phase_;
  std::function<void(const InjectedFault&)> on_inject_;
  // Resources held by the callers.
  absl::flat_hash_map<void*, std::pair<int, std::size_t>> segments_;  // base -> (device, bytes)
  absl::flat_hash_set<EventHandle> events_;
  absl::flat_hash_set<StreamHandle> streams_;
  absl::flat_hash_set<GraphHandle> graphs_;
};

}  // namespace capalloc::detail

#endif  // CAPALLOC_RUNTIME_FAULT_INJECTING_RUNTIME_HPP_
