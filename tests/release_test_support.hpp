// tests/release_test_support.hpp: what the release, DLPack and retention
// suites share: host kernels to put behind a Gate (test_support.hpp), and a
// probe that proves the release queue's thread has looked at every earlier
// request.
#ifndef CAPALLOC_TESTS_RELEASE_TEST_SUPPORT_HPP_
#define CAPALLOC_TESTS_RELEASE_TEST_SUPPORT_HPP_

#include <functional>
#include <future>
#include <memory>
#include <string>

#include "capalloc/release.hpp"
#include "capalloc/runtime.hpp"
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

}  // namespace capalloc::testing

#endif  // CAPALLOC_TESTS_RELEASE_TEST_SUPPORT_HPP_
