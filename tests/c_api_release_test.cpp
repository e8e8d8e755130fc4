// The C ABI of stream-ordered release and DLPack import (capalloc.h) over
// the process-wide allocator on the host runtime: a release runs after the
// stream's work, errors change nothing, DLPack deleters run once, and
// capalloc_release_drain is teardown. (The ordering against held kernels is
// checked through the C++ API in release_test.)
#include <dlpack/dlpack.h>

#include <atomic>
#include <cstdlib>
#include <string>
#include <thread>

#include "capalloc/capalloc.h"
#include "test_support.hpp"

namespace {

void use_host_runtime() { ::setenv("CAPALLOC_RUNTIME", "host", 1); }

void count_call(void* context) { static_cast<std::atomic<int>*>(context)->fetch_add(1); }

std::uint64_t pending() {
  std::uint64_t n = 0;
  REQUIRE(capalloc_release_pending(&n) == CAPALLOC_OK);
  return n;
}

void wait_until_none_pending() {
  while (pending() != 0) std::this_thread::yield();
}

DLManagedTensor cpu_tensor(float* data, std::int64_t* shape, std::atomic<int>* deleted) {
  DLManagedTensor t{};
  t.dl_tensor.data = data;
  t.dl_tensor.device = {kDLCPU, 0};
  t.dl_tensor.ndim = 1;
  t.dl_tensor.dtype = {kDLFloat, 32, 1};
  t.dl_tensor.shape = shape;
  t.manager_ctx = deleted;
  t.deleter = [](DLManagedTensor* self) {
    static_cast<std::atomic<int>*>(self->manager_ctx)->fetch_add(1);
  };
  return t;
}

}  // namespace

TEST_CASE("C ABI: capalloc_release_on_stream runs the callback once, after the stream's work",
          "[c_api][release]") {
  use_host_runtime();
  void* stream = nullptr;
  REQUIRE(capalloc_stream_create(0, &stream) == CAPALLOC_OK);
  void* block = nullptr;
  REQUIRE(capalloc_malloc(&block, 4096, 0, stream) == CAPALLOC_OK);
  std::atomic<int> calls{0};
  REQUIRE(capalloc_release_on_stream(stream, 0, count_call, &calls, block, 4096) == CAPALLOC_OK);
  REQUIRE(capalloc_release_on_stream(stream, 0, count_call, &calls, nullptr, 0) == CAPALLOC_OK);
  wait_until_none_pending();
  CHECK(calls == 2);
  REQUIRE(capalloc_free(block) == CAPALLOC_OK);
  REQUIRE(capalloc_stream_destroy(stream) == CAPALLOC_OK);
}

TEST_CASE("C ABI: capalloc_release_on_stream refuses bad input and calls nothing",
          "[c_api][release]") {
  use_host_runtime();
  std::atomic<int> calls{0};
  int x = 0;
  CHECK(capalloc_release_on_stream(nullptr, 0, nullptr, &calls, nullptr, 0) ==
        CAPALLOC_ERROR_INVALID_ARGUMENT);
  CHECK(std::string(capalloc_last_error()).find("fn is NULL") != std::string::npos);
  CHECK(capalloc_release_on_stream(nullptr, 0, count_call, &calls, &x, 0) ==
        CAPALLOC_ERROR_INVALID_ARGUMENT);
  CHECK(std::string(capalloc_last_error()).find("both ptr and bytes") != std::string::npos);
  CHECK(capalloc_release_on_stream(nullptr, 5, count_call, &calls, nullptr, 0) ==
        CAPALLOC_ERROR_INVALID_ARGUMENT);
  CHECK(capalloc_release_on_stream(reinterpret_cast<void*>(0x7777), 0, count_call, &calls, nullptr,
                                   0) == CAPALLOC_ERROR_NOT_FOUND);
  // Break test 13, item 5: a range past the end of the address space.
  CHECK(capalloc_release_on_stream(nullptr, 0, count_call, &calls, reinterpret_cast<void*>(-1),
                                   SIZE_MAX) == CAPALLOC_ERROR_INVALID_ARGUMENT);
  CHECK(std::string(capalloc_last_error()).find("past the end of the address space") !=
        std::string::npos);
  CHECK(capalloc_release_pending(nullptr) == CAPALLOC_ERROR_INVALID_ARGUMENT);
  CHECK(pending() == 0);
  CHECK(calls == 0);
}

TEST_CASE("C ABI: DLPack import and release, and their errors", "[c_api][release][dlpack]") {
  use_host_runtime();
  void* stream = nullptr;
  REQUIRE(capalloc_stream_create(0, &stream) == CAPALLOC_OK);
  float data[16] = {};
  std::int64_t shape = 16;
  std::atomic<int> deleted{0};
  DLManagedTensor t = cpu_tensor(data, &shape, &deleted);

  CHECK(capalloc_dlpack_import(nullptr, stream, nullptr, nullptr) ==
        CAPALLOC_ERROR_INVALID_ARGUMENT);
  DLManagedTensor gpu = t;
  gpu.dl_tensor.device = {kDLROCM, 0};
  CHECK(capalloc_dlpack_import(&gpu, stream, nullptr, nullptr) == CAPALLOC_ERROR_INVALID_ARGUMENT);
  CHECK(std::string(capalloc_last_error()).find("kDLROCM") != std::string::npos);

  void* out = nullptr;
  size_t bytes = 0;
  REQUIRE(capalloc_dlpack_import(&t, stream, &out, &bytes) == CAPALLOC_OK);
  CHECK(out == data);
  CHECK(bytes == sizeof(data));
  CHECK(capalloc_dlpack_import(&t, stream, nullptr, nullptr) == CAPALLOC_ERROR_FAILED_PRECONDITION);
  CHECK(std::string(capalloc_last_error()).find("already imported") != std::string::npos);

  REQUIRE(capalloc_dlpack_release(&t) == CAPALLOC_OK);
  CHECK(capalloc_dlpack_release(&t) == CAPALLOC_ERROR_NOT_FOUND);
  CHECK(capalloc_dlpack_release(nullptr) == CAPALLOC_ERROR_INVALID_ARGUMENT);
  wait_until_none_pending();
  CHECK(deleted == 1);
  REQUIRE(capalloc_stream_destroy(stream) == CAPALLOC_OK);
}

TEST_CASE("C ABI: capalloc_release_drain runs what is pending, and later releases run at once",
          "[c_api][release]") {
  use_host_runtime();
  std::atomic<int> calls{0};
  for (int i = 0; i < 5; ++i) {
    REQUIRE(capalloc_release_on_stream(nullptr, 0, count_call, &calls, nullptr, 0) == CAPALLOC_OK);
  }
  REQUIRE(capalloc_release_drain() == CAPALLOC_OK);
  CHECK(calls == 5);
  CHECK(pending() == 0);
  REQUIRE(capalloc_release_on_stream(nullptr, 0, count_call, &calls, nullptr, 0) == CAPALLOC_OK);
  CHECK(calls == 6);
}
