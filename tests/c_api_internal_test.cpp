// The C ABI over the process-wide allocator (host runtime), white-box: a
// capture through the C ABI whose kernels are launched on the process-wide
// runtime (reached through c_api/global.hpp), checked and replayed strictly.
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


}  // namespace
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
