// The C ABI over the process-wide allocator (host runtime): status codes,
// the thread-local last error, and the PyTorch entry points called the way
// CUDAPluggableAllocator calls them.
#include <cstdlib>
#include <string>
#include <thread>

#include "capalloc/capalloc.h"
#include "c_api/global.hpp"
#include "test_support.hpp"
#include "tools/scenarios/kernels.hpp"

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

TEST_CASE("C ABI: capture, findings as JSON, strict replay and persistent buffers (seed 003 arm A)",
          "[c_api][capture][seed003]") {
  use_host_runtime();
  void* side = nullptr;
  REQUIRE(capalloc_stream_create(0, &side) == CAPALLOC_OK);
  auto global = capalloc::detail::global_capalloc();
  REQUIRE_OK(global);
  capalloc::DeviceRuntime& rt = *global->allocator->device_runtime();

  constexpr std::size_t n = 1 << 18;
  void* src = nullptr;
  REQUIRE(capalloc_malloc_tagged(&src, n * sizeof(float), 0, nullptr, "src", 0) == CAPALLOC_OK);
  REQUIRE_OK(rt.launch_kernel(capalloc::kDefaultStream,
                              capalloc::scenarios::fill_kernel(static_cast<float*>(src), n, 3.0f)));
  void* warm = nullptr;
  REQUIRE(capalloc_preallocate(0, "c_api.ws", n * sizeof(float), &warm) == CAPALLOC_OK);

  uint64_t pool = 0;
  REQUIRE(capalloc_pool_create(0, &pool) == CAPALLOC_OK);
  REQUIRE(capalloc_capture_begin(0, side, pool, "c_api.g") == CAPALLOC_OK);
  void* t = nullptr;
  REQUIRE(capalloc_malloc_tagged(&t, n * sizeof(float), 0, side, "T", 0) == CAPALLOC_OK);
  REQUIRE_OK(rt.launch_kernel(reinterpret_cast<capalloc::StreamHandle>(side),
                              capalloc::scenarios::scale_kernel(static_cast<float*>(t),
                                                                static_cast<float*>(src), n, 2.0f)));
  REQUIRE(capalloc_free(t) == CAPALLOC_OK);
  void* ws = nullptr;
  REQUIRE(capalloc_malloc_tagged(&ws, n * sizeof(float), 0, side, "WS", 0) == CAPALLOC_OK);
  // Persistent requests inside the capture are refused; get() of a warm key works.
  void* refused = nullptr;
  CHECK(capalloc_malloc_tagged(&refused, 64, 0, side, "late.ws", 1) ==
        CAPALLOC_ERROR_FAILED_PRECONDITION);
  CHECK(std::string(capalloc_last_error()).find("preallocate") != std::string::npos);
  CHECK(capalloc_preallocate(0, "late.ws", 64, nullptr) == CAPALLOC_ERROR_FAILED_PRECONDITION);
  void* got = nullptr;
  REQUIRE(capalloc_get(0, "c_api.ws", &got) == CAPALLOC_OK);
  CHECK(got == warm);
  CHECK(capalloc_get(0, "cold.key", &got) == CAPALLOC_ERROR_NOT_FOUND);

  uint64_t graph = 0;
  const char* json = nullptr;
  REQUIRE(capalloc_capture_end(side, &graph, &json) == CAPALLOC_OK);
  REQUIRE(json != nullptr);
  const std::string at_end = json;
  CHECK(t == ws);
  CHECK(at_end.find("\"severity\":\"hazard\"") != std::string::npos);
  CHECK(at_end.find("\"tag\":\"WS\"") != std::string::npos);
  REQUIRE(capalloc_check(&json) == CAPALLOC_OK);
  CHECK(std::string(json).find("\"tag\":\"WS\"") != std::string::npos);

  CHECK(capalloc_set_strict(3) == CAPALLOC_ERROR_INVALID_ARGUMENT);
  REQUIRE(capalloc_set_strict(1) == CAPALLOC_OK);
  CHECK(capalloc_graph_replay(graph, nullptr) == CAPALLOC_ERROR_FAILED_PRECONDITION);
  CHECK(std::string(capalloc_last_error()).find("refused") != std::string::npos);
  // A waiver: bad ones are errors; a good one lets strict mode replay.
  CHECK(capalloc_waive(graph, ws, nullptr, nullptr) == CAPALLOC_ERROR_INVALID_ARGUMENT);
  CHECK(capalloc_waive(graph, nullptr, nullptr, "why") == CAPALLOC_ERROR_INVALID_ARGUMENT);
  CHECK(capalloc_waive(graph + 12345, ws, nullptr, "why") == CAPALLOC_ERROR_NOT_FOUND);
  REQUIRE(capalloc_waive(graph, nullptr, "WS", "WS is rewritten before use") == CAPALLOC_OK);
  REQUIRE(capalloc_check(&json) == CAPALLOC_OK);
  CHECK(std::string(json).find("\"waived\":{\"reason\":\"WS is rewritten before use\"}") !=
        std::string::npos);
  REQUIRE(capalloc_graph_replay(graph, nullptr) == CAPALLOC_OK);
  REQUIRE(capalloc_stream_synchronize(nullptr) == CAPALLOC_OK);
  REQUIRE(capalloc_set_strict(0) == CAPALLOC_OK);
  REQUIRE(capalloc_graph_replay(graph, nullptr) == CAPALLOC_OK);
  REQUIRE(capalloc_stream_synchronize(nullptr) == CAPALLOC_OK);
  CHECK(static_cast<float*>(ws)[0] == 6.0f);  // the replay wrote T's value into WS

  REQUIRE(capalloc_graph_destroy(graph) == CAPALLOC_OK);
  CHECK(capalloc_graph_destroy(graph) == CAPALLOC_ERROR_NOT_FOUND);
  REQUIRE(capalloc_free(ws) == CAPALLOC_OK);
  REQUIRE(capalloc_free(src) == CAPALLOC_OK);
  REQUIRE(capalloc_pool_release(pool) == CAPALLOC_OK);
  CHECK(capalloc_check_invariants() == CAPALLOC_OK);
  REQUIRE(capalloc_stream_destroy(side) == CAPALLOC_OK);
}
