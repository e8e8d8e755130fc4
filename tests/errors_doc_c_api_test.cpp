// errors_doc_test, the C ABI (white-box: the status map, the process-wide runtime).
// Rows of docs/errors.md that no other suite checks whole: for each, the
// status code, the fixed part of the message the doc quotes, and the state
// the doc promises after the error. Each TEST_CASE name is referenced from a
// row of docs/errors.md (tests/check_errors_doc.cmake keeps them together).
#include "errors_doc_support.hpp"

// --- The C ABI -----------------------------------------------------------------------------

TEST_CASE("errors: the map from absl status codes to capalloc_status", "[errors][c_api]") {
  const std::vector<std::pair<Code, capalloc_status>> map = {
      {Code::kOk, CAPALLOC_OK},
      {Code::kInvalidArgument, CAPALLOC_ERROR_INVALID_ARGUMENT},
      {Code::kOutOfRange, CAPALLOC_ERROR_INVALID_ARGUMENT},
      {Code::kResourceExhausted, CAPALLOC_ERROR_OUT_OF_MEMORY},
      {Code::kNotFound, CAPALLOC_ERROR_NOT_FOUND},
      {Code::kFailedPrecondition, CAPALLOC_ERROR_FAILED_PRECONDITION},
      {Code::kAlreadyExists, CAPALLOC_ERROR_FAILED_PRECONDITION},
      {Code::kUnavailable, CAPALLOC_ERROR_UNAVAILABLE},
      {Code::kUnimplemented, CAPALLOC_ERROR_UNAVAILABLE},
      {Code::kPermissionDenied, CAPALLOC_ERROR_INTERNAL},
      {Code::kInternal, CAPALLOC_ERROR_INTERNAL},
      {Code::kUnknown, CAPALLOC_ERROR_INTERNAL},
      {Code::kCancelled, CAPALLOC_ERROR_INTERNAL},
      {Code::kDeadlineExceeded, CAPALLOC_ERROR_INTERNAL},
      {Code::kAborted, CAPALLOC_ERROR_INTERNAL},
      {Code::kDataLoss, CAPALLOC_ERROR_INTERNAL},
      {Code::kUnauthenticated, CAPALLOC_ERROR_INTERNAL},
  };
  for (const auto& [code, c] : map) {
    INFO(absl::StatusCodeToString(code));
    const absl::Status status(code, code == Code::kOk ? "" : "the message");
    CHECK(capalloc::detail::report_c_status(status) == c);
    // The message is the last error exactly, without the code's name.
    CHECK(std::string(capalloc_last_error()) == (code == Code::kOk ? "" : "the message"));
  }
}

TEST_CASE("errors: C calls given a NULL out-pointer or string change nothing", "[errors][c_api]") {
  use_host_runtime();
  const capalloc_stats before = c_stats();
  CHECK_C_ERROR(capalloc_malloc(nullptr, 64, 0, nullptr), CAPALLOC_ERROR_INVALID_ARGUMENT,
                "capalloc_malloc: out is NULL");
  CHECK_C_ERROR(capalloc_malloc_tagged(nullptr, 64, 0, nullptr, "t", 0),
                CAPALLOC_ERROR_INVALID_ARGUMENT, "capalloc_malloc_tagged: out is NULL");
  CHECK_C_ERROR(capalloc_get_stats(0, nullptr), CAPALLOC_ERROR_INVALID_ARGUMENT,
                "capalloc_get_stats: out is NULL");
  CHECK_C_ERROR(capalloc_stream_create(0, nullptr), CAPALLOC_ERROR_INVALID_ARGUMENT,
                "capalloc_stream_create: out is NULL");
  CHECK_C_ERROR(capalloc_pool_create(0, nullptr), CAPALLOC_ERROR_INVALID_ARGUMENT,
                "capalloc_pool_create: out is NULL");
  CHECK_C_ERROR(capalloc_capture_end(nullptr, nullptr, nullptr), CAPALLOC_ERROR_INVALID_ARGUMENT,
                "capalloc_capture_end: graph is NULL");
  CHECK_C_ERROR(capalloc_check(nullptr), CAPALLOC_ERROR_INVALID_ARGUMENT,
                "capalloc_check: findings_json is NULL");
  CHECK_C_ERROR(capalloc_snapshot(nullptr), CAPALLOC_ERROR_INVALID_ARGUMENT,
                "capalloc_snapshot: json is NULL");
  CHECK_C_ERROR(capalloc_waive(1, nullptr, "t", nullptr), CAPALLOC_ERROR_INVALID_ARGUMENT,
                "capalloc_waive: reason is NULL");
  CHECK_C_ERROR(capalloc_preallocate(0, nullptr, 64, nullptr), CAPALLOC_ERROR_INVALID_ARGUMENT,
                "capalloc_preallocate: key is NULL");
  void* out = nullptr;
  CHECK_C_ERROR(capalloc_get(0, nullptr, &out), CAPALLOC_ERROR_INVALID_ARGUMENT,
                "capalloc_get: key is NULL");
  CHECK_C_ERROR(capalloc_get(0, "k", nullptr), CAPALLOC_ERROR_INVALID_ARGUMENT,
                "capalloc_get: out is NULL");
  CHECK_C_ERROR(capalloc_release_persistent(0, nullptr), CAPALLOC_ERROR_INVALID_ARGUMENT,
                "capalloc_release_persistent: key is NULL");
  std::uint64_t pool = 0;
  CHECK_C_ERROR(capalloc_torch_pool(0, 1, 0, nullptr, nullptr), CAPALLOC_ERROR_INVALID_ARGUMENT,
                "capalloc_torch_pool: pool is NULL");
  CHECK_C_ERROR(capalloc_get_strict(nullptr), CAPALLOC_ERROR_INVALID_ARGUMENT,
                "capalloc_get_strict: out is NULL");
  CHECK_C_ERROR(capalloc_free(nullptr), CAPALLOC_ERROR_INVALID_ARGUMENT, "deallocate: null pointer");
  (void)pool;
  CHECK(same_c_stats(before, c_stats()));
  CHECK(capalloc_check_invariants() == CAPALLOC_OK);
}

TEST_CASE("errors: C stream calls on unknown, default or capturing streams", "[errors][c_api]") {
  use_host_runtime();
  void* stream = nullptr;
  CHECK_C_ERROR(capalloc_stream_create(5, &stream), CAPALLOC_ERROR_INVALID_ARGUMENT,
                "create_stream: device 5 does not exist (the host runtime has 1 device(s))");
  CHECK(stream == nullptr);
  void* unknown = reinterpret_cast<void*>(4242);
  CHECK_C_ERROR(capalloc_stream_destroy(unknown), CAPALLOC_ERROR_NOT_FOUND,
                "destroy_stream: stream 4242 not found (never created or already destroyed)");
  CHECK_C_ERROR(capalloc_stream_synchronize(unknown), CAPALLOC_ERROR_NOT_FOUND,
                "capture_info: stream 4242 not found");
  CHECK_C_ERROR(capalloc_stream_destroy(nullptr), CAPALLOC_ERROR_INVALID_ARGUMENT,
                "destroy_stream: the default stream cannot be destroyed");
  // A capturing stream cannot be destroyed; its capture goes on.
  REQUIRE(capalloc_stream_create(0, &stream) == CAPALLOC_OK);
  REQUIRE(capalloc_capture_begin(0, stream, 0, "kept") == CAPALLOC_OK);
  CHECK_C_ERROR(capalloc_stream_destroy(stream), CAPALLOC_ERROR_FAILED_PRECONDITION,
                "is part of capture");
  CHECK_THAT(std::string(capalloc_last_error()), Catch::Contains("end the capture on its origin"));
  std::uint64_t graph = 0;
  REQUIRE(capalloc_capture_end(stream, &graph, nullptr) == CAPALLOC_OK);
  REQUIRE(capalloc_graph_destroy(graph) == CAPALLOC_OK);
  REQUIRE(capalloc_stream_destroy(stream) == CAPALLOC_OK);
  CHECK(capalloc_check_invariants() == CAPALLOC_OK);
}

TEST_CASE("errors: capalloc_stream_synchronize of a capturing stream keeps the capture",
          "[errors][c_api][capture]") {
  use_host_runtime();
  void* stream = nullptr;
  REQUIRE(capalloc_stream_create(0, &stream) == CAPALLOC_OK);
  REQUIRE(capalloc_capture_begin(0, stream, 0, "synced") == CAPALLOC_OK);
  CHECK_C_ERROR(capalloc_stream_synchronize(stream), CAPALLOC_ERROR_FAILED_PRECONDITION,
                "the stream is capturing (capture ");
  CHECK_THAT(std::string(capalloc_last_error()),
             Catch::Contains("and synchronizing it would invalidate the capture; end the capture "
                             "first"));
  // The capture was not invalidated: it ends with a graph, which replays.
  std::uint64_t graph = 0;
  REQUIRE(capalloc_capture_end(stream, &graph, nullptr) == CAPALLOC_OK);
  REQUIRE(capalloc_graph_replay(graph, stream) == CAPALLOC_OK);
  REQUIRE(capalloc_stream_synchronize(stream) == CAPALLOC_OK);
  REQUIRE(capalloc_graph_destroy(graph) == CAPALLOC_OK);
  REQUIRE(capalloc_stream_destroy(stream) == CAPALLOC_OK);
}

TEST_CASE("errors: C graph pool, capture and strict calls with bad arguments change nothing",
          "[errors][c_api]") {
  use_host_runtime();
  const capalloc_stats before = c_stats();
  std::uint64_t pool = 0;
  CHECK_C_ERROR(capalloc_pool_create(3, &pool), CAPALLOC_ERROR_INVALID_ARGUMENT,
                "device 3 does not exist");
  CHECK_C_ERROR(capalloc_pool_release(4242), CAPALLOC_ERROR_NOT_FOUND,
                "release_graph_pool: graph pool 4242 does not exist");
  CHECK_C_ERROR(capalloc_capture_begin(0, nullptr, 0, "default"), CAPALLOC_ERROR_INVALID_ARGUMENT,
                "begin_capture: the default (legacy) stream cannot be captured");
  std::uint64_t graph = 0;
  CHECK_C_ERROR(capalloc_capture_end(nullptr, &graph, nullptr), CAPALLOC_ERROR_FAILED_PRECONDITION,
                "has no capture begun through this tracker");
  CHECK_C_ERROR(capalloc_graph_replay(4242, nullptr), CAPALLOC_ERROR_NOT_FOUND,
                "graph 4242 is unknown to this tracker");
  CHECK_C_ERROR(capalloc_graph_destroy(4242), CAPALLOC_ERROR_NOT_FOUND,
                "destroy_graph: graph 4242 is unknown to this tracker");
  CHECK_C_ERROR(capalloc_waive(4242, nullptr, "t", "why"), CAPALLOC_ERROR_NOT_FOUND,
                "waive: graph 4242 is unknown to this tracker");
  int strict = -1;
  REQUIRE(capalloc_get_strict(&strict) == CAPALLOC_OK);
  CHECK_C_ERROR(capalloc_set_strict(3), CAPALLOC_ERROR_INVALID_ARGUMENT,
                "capalloc_set_strict(3): 0 (off), 1 (refuse hazards) or 2 (refuse hazards and "
                "possible findings)");
  int after = -1;
  REQUIRE(capalloc_get_strict(&after) == CAPALLOC_OK);
  CHECK(after == strict);
  CHECK(same_c_stats(before, c_stats()));
  CHECK(capalloc_check_invariants() == CAPALLOC_OK);
}

// Run by the case below in a fresh process, with the runtime unavailable.
TEST_CASE("errors_doc: the C ABI's first calls with the cuda runtime unavailable", "[.][errors]") {
  void* p = nullptr;
  const capalloc_status first = capalloc_malloc(&p, 256, 0, nullptr);
  const std::string message = capalloc_last_error();
  const capalloc_status second = capalloc_free(p);
  const bool same = message == capalloc_last_error();
  const bool no_name = capalloc_runtime_name() == nullptr;
  report_result(absl::StrCat(static_cast<int>(first), " ", static_cast<int>(second), " ",
                             same ? "same" : "different", " ", no_name ? "null" : "named", " ",
                             message));
}

TEST_CASE("errors: the C ABI fails to start when the runtime is unavailable, and says so each call",
          "[errors][c_api][plugins]") {
  const std::string out =
      in_fresh_process("errors_doc: the C ABI's first calls with the cuda runtime unavailable",
                       {{"CAPALLOC_RUNTIME", "cuda"}, {"CAPALLOC_BACKEND_PATH", scratch_dir("empty")}});
  INFO(out);
  CHECK_THAT(out, Catch::StartsWith("5 5 same null "));  // CAPALLOC_ERROR_UNAVAILABLE
  CHECK_THAT(out, Catch::Contains("runtime 'cuda': libcapalloc_backend_cuda.so could not be loaded"));
}

TEST_CASE("errors: capalloc_torch_malloc and capalloc_torch_free report failures only in the log",
          "[errors][c_api][torch]") {
  use_host_runtime();
  void* stream = nullptr;
  REQUIRE(capalloc_stream_create(0, &stream) == CAPALLOC_OK);
  const capalloc_stats before = c_stats();
  CHECK(capalloc_torch_malloc(64, 5, stream) == nullptr);
  CHECK_THAT(std::string(capalloc_last_error()), Catch::Contains("device 5 does not exist"));
  CHECK(capalloc_torch_malloc(64, 0, reinterpret_cast<void*>(0xdead0000)) == nullptr);
  CHECK_THAT(std::string(capalloc_last_error()), Catch::Contains("is not a live stream"));
  int on_stack = 0;
  capalloc_torch_free(&on_stack, 4, 0, stream);  // no status to return: the last error says it
  CHECK_THAT(std::string(capalloc_last_error()),
             Catch::Contains("capalloc did not allocate this pointer"));
  void* p = capalloc_torch_malloc(4096, 0, stream);
  REQUIRE(p != nullptr);
  capalloc_torch_free(p, 4096, 1, stream);  // the wrong device: refused, the block stays
  CHECK_THAT(std::string(capalloc_last_error()), Catch::Contains("belongs to device 0, not device 1"));
  capalloc_stats mid = c_stats();
  CHECK(mid.allocated_blocks == before.allocated_blocks + 1);
  capalloc_torch_free(p, 4096, 0, stream);
  CHECK(c_stats().allocated_blocks == before.allocated_blocks);
  CHECK(capalloc_check_invariants() == CAPALLOC_OK);
  REQUIRE(capalloc_stream_destroy(stream) == CAPALLOC_OK);
}

TEST_CASE("errors: PyTorch pool hooks: a bad device, and a release while a capture is underway",
          "[errors][c_api][torch]") {
  use_host_runtime();
  const capalloc_stats before = c_stats();
  CHECK_C_ERROR(capalloc_torch_begin_allocate_to_pool(9, 1, 0, nullptr, nullptr),
                CAPALLOC_ERROR_INVALID_ARGUMENT, "device 9 does not exist");
  std::uint64_t pool = 0;
  int uses = -1;
  CHECK_C_ERROR(capalloc_torch_pool(9, 1, 0, &pool, &uses), CAPALLOC_ERROR_NOT_FOUND,
                "capalloc_torch_pool: PyTorch pool (1, 0) on device 9 is not known: never begun, "
                "or released");
  CHECK_C_ERROR(capalloc_torch_release_pool(0, 0, 0), CAPALLOC_ERROR_INVALID_ARGUMENT,
                "capalloc_torch_release_pool: pool (0, 0) names no pool");
  REQUIRE(capalloc_torch_begin_allocate_to_pool(0, 5, 5, nullptr, nullptr) == CAPALLOC_OK);
  CHECK_C_ERROR(capalloc_torch_release_pool(0, 5, 5), CAPALLOC_ERROR_FAILED_PRECONDITION,
                "capalloc_torch_release_pool: PyTorch pool (5, 5) on device 0 has a capture "
                "underway; end it (capalloc_torch_end_allocate_to_pool) first");
  REQUIRE(capalloc_torch_pool(0, 5, 5, &pool, &uses) == CAPALLOC_OK);
  CHECK(uses == 1);
  REQUIRE(capalloc_torch_end_allocate_to_pool(0, 5, 5, nullptr) == CAPALLOC_OK);
  REQUIRE(capalloc_torch_release_pool(0, 5, 5) == CAPALLOC_OK);
  CHECK(capalloc_pool_release(pool) == CAPALLOC_ERROR_NOT_FOUND);  // capalloc's pool went too
  CHECK(same_c_stats(before, c_stats()));
  CHECK(capalloc_check_invariants() == CAPALLOC_OK);
}

TEST_CASE("errors: PyTorch's end hook during the capture keeps the begin underway",
          "[errors][c_api][torch]") {
  use_host_runtime();
  void* side = nullptr;
  REQUIRE(capalloc_stream_create(0, &side) == CAPALLOC_OK);
  auto global = capalloc::detail::global_capalloc();
  REQUIRE_OK(global);
  DeviceRuntime& rt = *global->allocator->device_runtime();
  const auto stream = reinterpret_cast<StreamHandle>(side);
  REQUIRE(capalloc_torch_begin_allocate_to_pool(0, 0, 31, nullptr, nullptr) == CAPALLOC_OK);
  REQUIRE_OK(rt.begin_capture(stream, CaptureMode::kGlobal));
  void* p = capalloc_torch_malloc(4096, 0, side);  // routes the capture to the pool
  REQUIRE(p != nullptr);
  const char* json = "untouched";
  CHECK_C_ERROR(capalloc_torch_end_allocate_to_pool(0, 0, 31, &json),
                CAPALLOC_ERROR_FAILED_PRECONDITION, "is still active on stream");
  CHECK(std::string(json) == "untouched");
  CHECK(rt.capture_info(stream)->status == CaptureStatus::kActive);
  std::uint64_t pool = 0;
  int uses = 0;
  REQUIRE(capalloc_torch_pool(0, 0, 31, &pool, &uses) == CAPALLOC_OK);
  CHECK(global->allocator->block_info(p)->pool == pool);
  // Still routed: the next allocation of the capture goes to the pool too.
  void* q = capalloc_torch_malloc(4096, 0, side);
  REQUIRE(q != nullptr);
  CHECK(global->allocator->block_info(q)->pool == pool);
  auto g = rt.end_capture(stream);
  REQUIRE_OK(g);
  REQUIRE(capalloc_torch_end_allocate_to_pool(0, 0, 31, &json) == CAPALLOC_OK);
  REQUIRE_OK(rt.destroy_graph(*g));
  capalloc_torch_free(p, 4096, 0, side);
  capalloc_torch_free(q, 4096, 0, side);
  REQUIRE(capalloc_torch_release_pool(0, 0, 31) == CAPALLOC_OK);
  const char* after = nullptr;
  REQUIRE(capalloc_check(&after) == CAPALLOC_OK);
  CHECK(capalloc_check_invariants() == CAPALLOC_OK);
  REQUIRE(capalloc_stream_destroy(side) == CAPALLOC_OK);
}

