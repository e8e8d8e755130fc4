// tests/release_test_support.hpp: what the release, DLPack and retention
// suites share: host kernels to put behind a Gate (test_support.hpp), and a
// probe that proves the release queue's thread has looked at every earlier
// request.
#ifndef CAPALLOC_TESTS_RELEASE_TEST_SUPPORT_HPP_
#define CAPALLOC_TESTS_RELEASE_TEST_SUPPORT_HPP_

#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <spdlog/sinks/base_sink.h>

#include "capalloc/release.hpp"
#include "capalloc/runtime.hpp"
#include "common/log.hpp"
#include "test_support.hpp"

namespace capalloc::testing {

// A host-runtime kernel that runs `body`. Launched after a Gate's kernel
// (test_support.hpp) on the same stream, it runs only once the test has
// opened the gate: the test decides when "the GPU" gets to it.
inline KernelLaunch host_kernel(std::string name, std::function<void()> body) {
  KernelLaunch k;
  k.name = std::move(name);
  k.host_body = std::move(body);
  return k;
}

// Requests a release with nothing to wait for on `idle_stream` and waits
// until it has run. The progress thread looks at every pending request in
// each pass, oldest first, so when this returns it has looked at every
// request made before the call at least once after it was made.
inline void wait_for_a_pass(ReleaseQueue& queue, StreamHandle idle_stream, int device = 0) {
  auto ran = std::make_shared<std::promise<void>>();
  auto done = ran->get_future();
  REQUIRE_OK(queue.release(device, idle_stream, [ran] { ran->set_value(); }));
  done.wait();
}

// The lines capalloc logs at warn and above while alive (these suites are
// linked with the internal library, whose logger they can reach).
class LogLines {
 public:
  LogLines() : sink_(std::make_shared<Sink>()) {
    auto& log = detail::log();
    old_level_ = log.level();
    log.sinks().push_back(sink_);
    if (old_level_ > spdlog::level::warn) log.set_level(spdlog::level::warn);
  }
  ~LogLines() {
    auto& log = detail::log();
    log.set_level(old_level_);
    log.sinks().pop_back();
  }
  LogLines(const LogLines&) = delete;
  LogLines& operator=(const LogLines&) = delete;
  std::vector<std::string> lines() const {
    std::lock_guard lock(sink_->mu);
    return sink_->lines;
  }

 private:
  struct Sink : spdlog::sinks::base_sink<std::mutex> {
    std::mutex mu;
    std::vector<std::string> lines;
    void sink_it_(const spdlog::details::log_msg& m) override {
      std::lock_guard lock(mu);
      lines.emplace_back(m.payload.data(), m.payload.size());
    }
    void flush_() override {}
  };
  std::shared_ptr<Sink> sink_;
  spdlog::level::level_enum old_level_;
};

}  // namespace capalloc::testing

#endif  // CAPALLOC_TESTS_RELEASE_TEST_SUPPORT_HPP_
