// Issue 11's defects as a C caller meets them: the process-wide allocator
// (host runtime) behind the C ABI, linked from the shared libcapalloc.so.
// Each case failed on the main of b7604db.
#include <cstdlib>
#include <string>

#include "capalloc/capalloc.h"
#include "test_support.hpp"

namespace {

void use_host_runtime() { ::setenv("CAPALLOC_RUNTIME", "host", 1); }

std::string last_error() { return capalloc_last_error(); }

void* new_stream() {
  void* stream = nullptr;
  REQUIRE(capalloc_stream_create(0, &stream) == CAPALLOC_OK);
  return stream;
}

capalloc_stats stats_now() {
  capalloc_stats s{};
  REQUIRE(capalloc_get_stats(0, &s) == CAPALLOC_OK);
  return s;
}

}  // namespace

TEST_CASE("issue 11 (C): three pool releases during a capture free nothing it routes to",
          "[reliability][c_api]") {
  use_host_runtime();
  void* stream = new_stream();
  std::uint64_t pool = 0;
  REQUIRE(capalloc_pool_create(0, &pool) == CAPALLOC_OK);
  REQUIRE(capalloc_capture_begin(0, stream, pool, "routed") == CAPALLOC_OK);
  REQUIRE(capalloc_pool_release(pool) == CAPALLOC_OK);
  CHECK(capalloc_pool_release(pool) == CAPALLOC_ERROR_FAILED_PRECONDITION);
  CHECK(capalloc_pool_release(pool) == CAPALLOC_ERROR_FAILED_PRECONDITION);
  CHECK(capalloc_check_invariants() == CAPALLOC_OK);
  void* p = nullptr;
  REQUIRE(capalloc_malloc(&p, 1 << 16, 0, stream) == CAPALLOC_OK);  // Pool::take on the pool
  REQUIRE(capalloc_free(p) == CAPALLOC_OK);
  std::uint64_t graph = 0;
  REQUIRE(capalloc_capture_end(stream, &graph, nullptr) == CAPALLOC_OK);
  REQUIRE(capalloc_graph_replay(graph, stream) == CAPALLOC_OK);
  REQUIRE(capalloc_stream_synchronize(stream) == CAPALLOC_OK);
  CHECK(capalloc_check_invariants() == CAPALLOC_OK);
  // The graph was the pool's last holder: its destroy succeeds, and a
  // second one is NOT_FOUND without changing anything.
  CHECK(capalloc_graph_destroy(graph) == CAPALLOC_OK);
  CHECK(capalloc_graph_destroy(graph) == CAPALLOC_ERROR_NOT_FOUND);
  CHECK(capalloc_pool_release(pool) == CAPALLOC_ERROR_NOT_FOUND);
  CHECK(capalloc_check_invariants() == CAPALLOC_OK);
  REQUIRE(capalloc_stream_destroy(stream) == CAPALLOC_OK);
}

TEST_CASE("issue 11 (C): a released pool takes no capture", "[reliability][c_api]") {
  use_host_runtime();
  void* stream = new_stream();
  std::uint64_t pool = 0;
  REQUIRE(capalloc_pool_create(0, &pool) == CAPALLOC_OK);
  REQUIRE(capalloc_pool_release(pool) == CAPALLOC_OK);
  CHECK(capalloc_capture_begin(0, stream, pool, "late") != CAPALLOC_OK);
  // The stream is not left capturing: a plain synchronize works.
  CHECK(capalloc_stream_synchronize(stream) == CAPALLOC_OK);
  CHECK(capalloc_check_invariants() == CAPALLOC_OK);
  REQUIRE(capalloc_stream_destroy(stream) == CAPALLOC_OK);
}

TEST_CASE("issue 11 (C): capalloc_free of a persistent buffer is refused",
          "[reliability][c_api][persistent]") {
  use_host_runtime();
  void* p = nullptr;
  REQUIRE(capalloc_preallocate(0, "issue11.kv", 1 << 20, &p) == CAPALLOC_OK);
  CHECK(capalloc_free(p) == CAPALLOC_ERROR_FAILED_PRECONDITION);
  CHECK_THAT(last_error(), Catch::Contains("capalloc_release_persistent(0, \"issue11.kv\")"));
  void* again = nullptr;
  REQUIRE(capalloc_get(0, "issue11.kv", &again) == CAPALLOC_OK);
  CHECK(again == p);
  void* q = nullptr;
  REQUIRE(capalloc_malloc(&q, 1 << 20, 0, nullptr) == CAPALLOC_OK);
  CHECK(q != p);
  REQUIRE(capalloc_free(q) == CAPALLOC_OK);
  CHECK(capalloc_release_persistent(0, nullptr) == CAPALLOC_ERROR_INVALID_ARGUMENT);
  CHECK(capalloc_release_persistent(0, "issue11.none") == CAPALLOC_ERROR_NOT_FOUND);
  REQUIRE(capalloc_release_persistent(0, "issue11.kv") == CAPALLOC_OK);
  CHECK(capalloc_get(0, "issue11.kv", &again) == CAPALLOC_ERROR_NOT_FOUND);
  CHECK(capalloc_release_persistent(0, "issue11.kv") == CAPALLOC_ERROR_NOT_FOUND);
  CHECK(capalloc_check_invariants() == CAPALLOC_OK);
}

TEST_CASE("issue 11 (C): synchronizing a capturing stream is refused and the capture survives",
          "[reliability][c_api][capture]") {
  use_host_runtime();
  void* stream = new_stream();
  REQUIRE(capalloc_capture_begin(0, stream, 0, "sync") == CAPALLOC_OK);
  CHECK(capalloc_stream_synchronize(stream) == CAPALLOC_ERROR_FAILED_PRECONDITION);
  CHECK_THAT(last_error(), Catch::Contains("capturing"));
  std::uint64_t graph = 0;
  REQUIRE(capalloc_capture_end(stream, &graph, nullptr) == CAPALLOC_OK);
  REQUIRE(capalloc_graph_replay(graph, stream) == CAPALLOC_OK);
  REQUIRE(capalloc_stream_synchronize(stream) == CAPALLOC_OK);
  REQUIRE(capalloc_graph_destroy(graph) == CAPALLOC_OK);
  REQUIRE(capalloc_stream_destroy(stream) == CAPALLOC_OK);
}

TEST_CASE("issue 11 (C): unknown streams and never-handed-out pointers are clear errors",
          "[reliability][c_api][errors]") {
  use_host_runtime();
  const capalloc_stats before = stats_now();
  void* p = nullptr;
  CHECK(capalloc_malloc(&p, 4096, 0, reinterpret_cast<void*>(0xdead0000)) ==
        CAPALLOC_ERROR_INVALID_ARGUMENT);
  CHECK_THAT(last_error(), Catch::Contains("not a live stream"));
  void* stream = new_stream();
  REQUIRE(capalloc_malloc(&p, 4096, 0, stream) == CAPALLOC_OK);
  REQUIRE(capalloc_free(p) == CAPALLOC_OK);
  REQUIRE(capalloc_stream_destroy(stream) == CAPALLOC_OK);
  CHECK(capalloc_malloc(&p, 4096, 0, stream) == CAPALLOC_ERROR_INVALID_ARGUMENT);
  CHECK(capalloc_stream_destroy(stream) != CAPALLOC_OK);

  REQUIRE(capalloc_malloc(&p, 1024, 0, nullptr) == CAPALLOC_OK);
  CHECK(capalloc_free(static_cast<char*>(p) + 1024) == CAPALLOC_ERROR_NOT_FOUND);
  CHECK_THAT(last_error(), Catch::Contains("did not hand out"));
  CHECK(capalloc_record_stream(p, reinterpret_cast<void*>(0xdead0000)) ==
        CAPALLOC_ERROR_INVALID_ARGUMENT);
  REQUIRE(capalloc_free(p) == CAPALLOC_OK);
  CHECK(stats_now().allocated_blocks == before.allocated_blocks);
  CHECK(capalloc_check_invariants() == CAPALLOC_OK);
}
