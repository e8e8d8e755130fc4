// tests/reusing_runtime.hpp: a runtime that reports a stream destroyed and
// then hands its handle to a "new" stream, as CUDA and HIP do (a stream
// handle is a pointer, reused after cudaStreamDestroy). For the tests of a
// destroyed stream's segments (docs/design.md "Stream lifetimes").
#ifndef CAPALLOC_TESTS_REUSING_RUNTIME_HPP_
#define CAPALLOC_TESTS_REUSING_RUNTIME_HPP_

#include <atomic>
#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include "forwarding_runtime.hpp"
#include "test_support.hpp"

namespace capalloc::testing {

// Forwards to a host runtime, except that retire_and_reuse(h) reports h
// destroyed without destroying it: from then on h stands for a new stream
// that got the destroyed one's handle. Counts releases.
class ReusingRuntime final : public ForwardingRuntime<MemoryRuntime> {
 public:
  using ForwardingRuntime::ForwardingRuntime;
  void retire_and_reuse(StreamHandle h) {
    REQUIRE_OK(in_->synchronize_stream(h));  // the "destroyed" stream's work is done
    for (auto& w : watchers_) w(h);
  }
  absl::StatusOr<int> stream_device(StreamHandle s) override { return in_->stream_device(s); }
  void watch_stream_destruction(std::function<bool(StreamHandle)> f) override {
    watchers_.push_back(f);
    in_->watch_stream_destruction(std::move(f));
  }
  absl::Status release(int d, void* p, std::size_t b) override {
    ++releases;
    return in_->release(d, p, b);
  }
  std::atomic<int> releases{0};

 private:
  std::vector<std::function<bool(StreamHandle)>> watchers_;
};

}  // namespace capalloc::testing

#endif  // CAPALLOC_TESTS_REUSING_RUNTIME_HPP_
