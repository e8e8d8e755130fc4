// tests/forwarding_runtime.hpp: a runtime that passes every call to another
// one, for tests that change one or two of its answers (inject a fault,
// report a stream destroyed, hide a graph's writes) and keep the rest real.
#ifndef CAPALLOC_TESTS_FORWARDING_RUNTIME_HPP_
#define CAPALLOC_TESTS_FORWARDING_RUNTIME_HPP_

#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include "capalloc/runtime.hpp"

namespace capalloc::testing {

// Forwards MemoryRuntime's required calls to `inner`. The optional ones
// (stream_device, watch_capture_graph, and DeviceRuntime's graph
// inspection) keep the base class's "cannot tell" answer unless a subclass
// forwards them: each test runtime says what it can do.
template <typename Base>
class ForwardingMemory : public Base {
 public:
  explicit ForwardingMemory(std::shared_ptr<DeviceRuntime> inner) : in_(std::move(inner)) {}

  RuntimeKind kind() const override { return in_->kind(); }
  int device_count() const override { return in_->device_count(); }
  absl::StatusOr<DeviceMemoryInfo> memory_info(int d) const override { return in_->memory_info(d); }
  absl::StatusOr<void*> reserve(int d, std::size_t b) override { return in_->reserve(d, b); }
  absl::Status release(int d, void* p, std::size_t b) override { return in_->release(d, p, b); }
  CaptureMode exchange_thread_capture_mode(CaptureMode m) override {
    return in_->exchange_thread_capture_mode(m);
  }
  absl::StatusOr<StreamHandle> create_stream(int d) override { return in_->create_stream(d); }
  absl::Status destroy_stream(StreamHandle s) override { return in_->destroy_stream(s); }
  void watch_stream_destruction(std::function<bool(StreamHandle)> f) override {
    in_->watch_stream_destruction(std::move(f));
  }
  absl::Status synchronize_stream(StreamHandle s) override { return in_->synchronize_stream(s); }
  absl::StatusOr<EventHandle> create_event(int d) override { return in_->create_event(d); }
  absl::Status destroy_event(EventHandle e) override { return in_->destroy_event(e); }
  absl::Status record_event(EventHandle e, StreamHandle s) override { return in_->record_event(e, s); }
  absl::StatusOr<bool> query_event(EventHandle e) override { return in_->query_event(e); }
  absl::Status synchronize_event(EventHandle e) override { return in_->synchronize_event(e); }
  absl::Status stream_wait_event(StreamHandle s, EventHandle e) override {
    return in_->stream_wait_event(s, e);
  }
  absl::StatusOr<CaptureInfo> capture_info(StreamHandle s) override { return in_->capture_info(s); }
  bool any_capture_active(int d) const override { return in_->any_capture_active(d); }

 protected:
  std::shared_ptr<DeviceRuntime> in_;
};

// `Base` is MemoryRuntime (the memory seam only) or DeviceRuntime.
template <typename Base>
class ForwardingRuntime : public ForwardingMemory<Base> {
 public:
  using ForwardingMemory<Base>::ForwardingMemory;
};

// DeviceRuntime's required calls as well: work, captures and graphs.
template <>
class ForwardingRuntime<DeviceRuntime> : public ForwardingMemory<DeviceRuntime> {
 public:
  using ForwardingMemory::ForwardingMemory;

  absl::Status launch_kernel(StreamHandle s, KernelLaunch k) override {
    return in_->launch_kernel(s, std::move(k));
  }
  absl::Status memset_async(void* d, int v, std::size_t b, StreamHandle s) override {
    return in_->memset_async(d, v, b, s);
  }
  absl::Status memcpy_async(void* d, const void* src, std::size_t b, StreamHandle s) override {
    return in_->memcpy_async(d, src, b, s);
  }
  absl::StatusOr<CaptureId> begin_capture(StreamHandle s, CaptureMode m) override {
    return in_->begin_capture(s, m);
  }
  absl::StatusOr<GraphHandle> end_capture(StreamHandle s) override { return in_->end_capture(s); }
  absl::Status launch_graph(GraphHandle g, StreamHandle s) override {
    return in_->launch_graph(g, s);
  }
  absl::Status destroy_graph(GraphHandle g) override { return in_->destroy_graph(g); }
  absl::StatusOr<std::vector<GraphWrite>> graph_writes(GraphHandle g) override {
    return in_->graph_writes(g);
  }
};

}  // namespace capalloc::testing

#endif  // CAPALLOC_TESTS_FORWARDING_RUNTIME_HPP_
