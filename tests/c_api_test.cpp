// The C ABI over the process-wide allocator (host runtime): status codes,
// the thread-local last error, and the PyTorch entry points called the way
// CUDAPluggableAllocator calls them. Linked against the shared libcapalloc.so
// only (c_api_internal_test.cpp holds the case that launches kernels on the
// process-wide runtime, which needs the white-box library).
#include <cstdlib>
#include <string>
#include <thread>

#include "capalloc/capalloc.h"
#include "test_support.hpp"

namespace {

// The process-wide allocator reads CAPALLOC_RUNTIME once, on first use.
void use_host_runtime() { ::setenv("CAPALLOC_RUNTIME", "host", 1); }

capalloc_stats stats_now() {
  capalloc_stats s{};
  REQUIRE(capalloc_get_stats(0, &s) == CAPALLOC_OK);
  return s;
}

}  // namespace

TEST_CASE("C ABI: malloc, record_stream, free, stats and empty_cache", "[c_api]") {
  use_host_runtime();
  REQUIRE(std::string(capalloc_runtime_name()) == "host");
  void* stream = nullptr;
  REQUIRE(capalloc_stream_create(0, &stream) == CAPALLOC_OK);
  const capalloc_stats before = stats_now();

  void* p = nullptr;
  REQUIRE(capalloc_malloc(&p, 1000, 0, stream) == CAPALLOC_OK);
  REQUIRE(p != nullptr);
  CHECK(reinterpret_cast<std::uintptr_t>(p) % 256 == 0);
  CHECK(stats_now().allocated_bytes == before.allocated_bytes + 1024);
  CHECK(stats_now().requested_bytes == before.requested_bytes + 1000);
  REQUIRE(capalloc_record_stream(p, nullptr) == CAPALLOC_OK);
  REQUIRE(capalloc_free(p) == CAPALLOC_OK);
  REQUIRE(capalloc_stream_synchronize(nullptr) == CAPALLOC_OK);
  REQUIRE(capalloc_empty_cache(-1) == CAPALLOC_OK);
  CHECK(stats_now().allocated_bytes == before.allocated_bytes);
  CHECK(capalloc_check_invariants() == CAPALLOC_OK);
  REQUIRE(capalloc_stream_destroy(stream) == CAPALLOC_OK);
}

TEST_CASE("C ABI: errors come back as codes with a thread-local message", "[c_api]") {
  use_host_runtime();
  void* p = nullptr;
  CHECK(capalloc_malloc(&p, 0, 0, nullptr) == CAPALLOC_ERROR_INVALID_ARGUMENT);
  CHECK(std::string(capalloc_last_error()).find("size 0") != std::string::npos);
  CHECK(capalloc_malloc(nullptr, 64, 0, nullptr) == CAPALLOC_ERROR_INVALID_ARGUMENT);
  CHECK(capalloc_malloc(&p, 64, 3, nullptr) == CAPALLOC_ERROR_INVALID_ARGUMENT);
  CHECK(capalloc_malloc(&p, std::size_t{1} << 50, 0, nullptr) == CAPALLOC_ERROR_OUT_OF_MEMORY);
  int local = 0;
  CHECK(capalloc_free(&local) == CAPALLOC_ERROR_NOT_FOUND);
  CHECK(capalloc_free(nullptr) == CAPALLOC_ERROR_INVALID_ARGUMENT);
  CHECK(capalloc_get_stats(0, nullptr) == CAPALLOC_ERROR_INVALID_ARGUMENT);

  REQUIRE(capalloc_malloc(&p, 64, 0, nullptr) == CAPALLOC_OK);
  CHECK(std::string(capalloc_last_error()).empty());
  REQUIRE(capalloc_free(p) == CAPALLOC_OK);
  CHECK(capalloc_free(p) == CAPALLOC_ERROR_FAILED_PRECONDITION);
  const std::string here = capalloc_last_error();
  CHECK(here.find("double free") != std::string::npos);
  // Another thread's errors do not overwrite this thread's message.
  std::thread([] {
    int other = 0;
    capalloc_free(&other);
  }).join();
  CHECK(std::string(capalloc_last_error()) == here);
  CHECK(capalloc_check_invariants() == CAPALLOC_OK);
}

TEST_CASE("C ABI: the PyTorch entry points, called as CUDAPluggableAllocator calls them",
          "[c_api][torch]") {
  use_host_runtime();
  void* stream = nullptr;
  REQUIRE(capalloc_stream_create(0, &stream) == CAPALLOC_OK);
  const capalloc_stats before = stats_now();
  // PyTorch: alloc(size, device, stream) ... free(ptr, size, device, stream).
  void* a = capalloc_torch_malloc(4096, 0, stream);
  void* b = capalloc_torch_malloc(1 << 20, 0, stream);
  REQUIRE(a != nullptr);
  REQUIRE(b != nullptr);
  CHECK(capalloc_torch_malloc(0, 0, stream) == nullptr);  // empty tensors get no block
  CHECK(stats_now().allocated_blocks == before.allocated_blocks + 2);
  capalloc_torch_free(a, 4096, 0, stream);
  capalloc_torch_free(b, 1 << 20, 0, stream);
  capalloc_torch_free(nullptr, 0, 0, stream);  // ignored, as PyTorch may pass it
  CHECK(stats_now().allocated_blocks == before.allocated_blocks);
  // Failures return NULL and leave no exception or state behind.
  CHECK(capalloc_torch_malloc(std::size_t{1} << 50, 0, stream) == nullptr);
  CHECK(capalloc_torch_malloc(64, 5, stream) == nullptr);
  CHECK(capalloc_check_invariants() == CAPALLOC_OK);
  REQUIRE(capalloc_stream_destroy(stream) == CAPALLOC_OK);
}

TEST_CASE("C ABI: PyTorch's pool hooks refuse bad input and change nothing", "[c_api][torch]") {
  use_host_runtime();
  uint64_t pool = 0;
  int uses = 0;
  // Pool (0, 0) names no pool; an unknown device is refused.
  CHECK(capalloc_torch_begin_allocate_to_pool(0, 0, 0, nullptr, nullptr) ==
        CAPALLOC_ERROR_INVALID_ARGUMENT);
  CHECK(std::string(capalloc_last_error()).find("(0, 0)") != std::string::npos);
  CHECK(capalloc_torch_begin_allocate_to_pool(9, 1, 0, nullptr, nullptr) ==
        CAPALLOC_ERROR_INVALID_ARGUMENT);
  CHECK(capalloc_torch_pool(9, 1, 0, &pool, &uses) == CAPALLOC_ERROR_NOT_FOUND);
  // An unknown pool: end and release are NOT_FOUND.
  CHECK(capalloc_torch_end_allocate_to_pool(0, 4242, 0, nullptr) == CAPALLOC_ERROR_NOT_FOUND);
  CHECK(std::string(capalloc_last_error()).find("PyTorch pool (4242, 0) on device 0") !=
        std::string::npos);
  CHECK(capalloc_torch_release_pool(0, 4242, 0) == CAPALLOC_ERROR_NOT_FOUND);
  CHECK(capalloc_torch_end_allocate_to_pool(0, 0, 0, nullptr) == CAPALLOC_ERROR_INVALID_ARGUMENT);
  CHECK(capalloc_torch_pool(0, 1, 0, nullptr, &uses) == CAPALLOC_ERROR_INVALID_ARGUMENT);
  CHECK(capalloc_get_strict(nullptr) == CAPALLOC_ERROR_INVALID_ARGUMENT);

  // Begin, end, then a second end without a begin: refused, the pool stays.
  REQUIRE(capalloc_torch_begin_allocate_to_pool(0, 0, 77, nullptr, nullptr) == CAPALLOC_OK);
  REQUIRE(capalloc_torch_pool(0, 0, 77, &pool, &uses) == CAPALLOC_OK);
  CHECK(pool != 0);
  CHECK(uses == 1);
  // Releasing while a begin is underway is refused.
  CHECK(capalloc_torch_release_pool(0, 0, 77) == CAPALLOC_ERROR_FAILED_PRECONDITION);
  const char* json = nullptr;
  REQUIRE(capalloc_torch_end_allocate_to_pool(0, 0, 77, &json) == CAPALLOC_OK);
  CHECK(std::string(json) == "[]");  // nothing was captured
  CHECK(capalloc_torch_end_allocate_to_pool(0, 0, 77, nullptr) ==
        CAPALLOC_ERROR_FAILED_PRECONDITION);
  CHECK(std::string(capalloc_last_error()).find("without a begin") != std::string::npos);
  uint64_t same = 0;
  REQUIRE(capalloc_torch_pool(0, 0, 77, &same, &uses) == CAPALLOC_OK);
  CHECK(same == pool);
  CHECK(uses == 1);
  // The same id on another device is another pool.
  CHECK(capalloc_torch_end_allocate_to_pool(1, 0, 77, nullptr) == CAPALLOC_ERROR_NOT_FOUND);

  // Release, then a double release: NOT_FOUND, and the pool is gone.
  REQUIRE(capalloc_torch_release_pool(0, 0, 77) == CAPALLOC_OK);
  CHECK(capalloc_torch_release_pool(0, 0, 77) == CAPALLOC_ERROR_NOT_FOUND);
  CHECK(capalloc_torch_pool(0, 0, 77, &same, &uses) == CAPALLOC_ERROR_NOT_FOUND);
  // capalloc's graph pool went with it.
  CHECK(capalloc_pool_release(pool) == CAPALLOC_ERROR_NOT_FOUND);
  int strict = -1;
  REQUIRE(capalloc_get_strict(&strict) == CAPALLOC_OK);
  CHECK((strict >= 0 && strict <= 2));
  CHECK(capalloc_check_invariants() == CAPALLOC_OK);
}

// Found by tests/fuzz/c_api_fuzzer: record_stream accepted a destroyed stream
// when the block already named it (the stream it was allocated on, or one
// recorded before), skipping the check every stream-taking call makes.
TEST_CASE("C ABI: record_stream refuses a destroyed stream the block already names",
          "[c_api][fuzz]") {
  use_host_runtime();
  const capalloc_stats before = stats_now();
  void* own = nullptr;
  void* other = nullptr;
  REQUIRE(capalloc_stream_create(0, &own) == CAPALLOC_OK);
  REQUIRE(capalloc_stream_create(0, &other) == CAPALLOC_OK);
  void* p = nullptr;
  REQUIRE(capalloc_malloc(&p, 4096, 0, own) == CAPALLOC_OK);
  REQUIRE(capalloc_record_stream(p, other) == CAPALLOC_OK);
  REQUIRE(capalloc_record_stream(p, own) == CAPALLOC_OK);  // its own stream: a no-op

  // The stream the block was allocated on, destroyed.
  REQUIRE(capalloc_stream_destroy(own) == CAPALLOC_OK);
  CHECK(capalloc_record_stream(p, own) == CAPALLOC_ERROR_INVALID_ARGUMENT);
  CHECK(std::string(capalloc_last_error()).find("not a live stream") != std::string::npos);
  // A stream recorded before, destroyed.
  REQUIRE(capalloc_stream_destroy(other) == CAPALLOC_OK);
  CHECK(capalloc_record_stream(p, other) == CAPALLOC_ERROR_INVALID_ARGUMENT);
  // The default stream is always there; the block still frees.
  CHECK(capalloc_record_stream(p, nullptr) == CAPALLOC_OK);
  REQUIRE(capalloc_free(p) == CAPALLOC_OK);
  REQUIRE(capalloc_stream_synchronize(nullptr) == CAPALLOC_OK);
  CHECK(stats_now().allocated_blocks == before.allocated_blocks);
  CHECK(capalloc_check_invariants() == CAPALLOC_OK);
}
