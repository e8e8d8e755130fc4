// errors_doc_test, the host runtime, runtime loading and the CLI.
// Rows of docs/errors.md that no other suite checks whole: for each, the
// status code, the fixed part of the message the doc quotes, and the state
// the doc promises after the error. Each TEST_CASE name is referenced from a
// row of docs/errors.md (tests/check_errors_doc.cmake keeps them together).
#include "errors_doc_support.hpp"
#include "run_program.hpp"

// --- The host runtime ----------------------------------------------------------------------

TEST_CASE("errors: make_host_runtime refuses invalid options", "[errors][runtime]") {
  CHECK_ERROR(make_host_runtime({.device_count = 0}), Code::kInvalidArgument,
              "host runtime: device_count must be at least 1, got 0");
  CHECK_ERROR(make_host_runtime({.memory_limit_per_device = 0}), Code::kInvalidArgument,
              "host runtime: memory_limit_per_device must be positive, got 0");
}

TEST_CASE("errors: host runtime calls on unknown devices, streams, events and graphs",
          "[errors][runtime]") {
  auto rt = host_runtime(std::size_t{1} << 30, 2);
  const StreamHandle s = *rt->create_stream(0);
  const StreamHandle s1 = *rt->create_stream(1);
  CHECK_ERROR(rt->create_stream(2), Code::kInvalidArgument,
              "create_stream: device 2 does not exist (the host runtime has 2 device(s))");
  CHECK_ERROR(rt->memory_info(-1), Code::kInvalidArgument, "memory_info: device -1 does not exist");
  CHECK_ERROR(rt->reserve(0, 0), Code::kInvalidArgument, "reserve: 0 bytes requested on device 0");
  CHECK_ERROR(rt->synchronize_stream(4242), Code::kNotFound,
              "synchronize_stream: stream 4242 not found (never created or already destroyed)");
  CHECK_ERROR(rt->capture_info(4242), Code::kNotFound, "capture_info: stream 4242 not found");
  CHECK_ERROR(rt->query_event(4242), Code::kNotFound,
              "event 4242 not found (never created or already destroyed)");
  CHECK_ERROR(rt->destroy_event(4242), Code::kNotFound,
              "destroy_event: event 4242 not found (never created or already destroyed)");
  CHECK_ERROR(rt->launch_graph(4242, s), Code::kNotFound,
              "launch_graph: graph 4242 not found (never created or already destroyed)");
  CHECK_ERROR(rt->destroy_graph(4242), Code::kNotFound,
              "destroy_graph: graph 4242 not found (never created or already destroyed)");
  CHECK_ERROR(rt->graph_writes(4242), Code::kNotFound, "graph_writes: graph 4242 not found");
  CHECK_ERROR(rt->graph_dependencies(4242), Code::kNotFound,
              "graph_dependencies: graph 4242 not found");
  CHECK_ERROR(rt->captured_graph_writes(4242), Code::kNotFound, "no capture graph 4242");
  auto e = rt->create_event(0);
  REQUIRE_OK(e);
  CHECK_ERROR(rt->record_event(*e, s1), Code::kInvalidArgument,
              absl::StrFormat("record_event: event %d is on device 0 but stream %d is on device 1",
                              *e, s1));
  // Nothing was left half done: the event is unrecorded (complete), the
  // streams idle.
  CHECK(*rt->query_event(*e));
  REQUIRE_OK(rt->synchronize_stream(s));
  REQUIRE_OK(rt->destroy_event(*e));
  REQUIRE_OK(rt->destroy_stream(s));
  REQUIRE_OK(rt->destroy_stream(s1));
}

TEST_CASE("errors: host runtime memset, memcpy and release with bad arguments run nothing",
          "[errors][runtime]") {
  auto rt = host_runtime(std::size_t{1} << 20);
  auto seg = rt->reserve(0, 4096);
  REQUIRE_OK(seg);
  std::memset(*seg, 7, 4096);
  CHECK_ERROR(rt->memset_async(nullptr, 0, 64, kDefaultStream), Code::kInvalidArgument,
              "memset_async: null destination for 64 bytes");
  CHECK_ERROR(rt->memcpy_async(*seg, nullptr, 64, kDefaultStream), Code::kInvalidArgument,
              "memcpy_async: null source for 64 bytes");
  CHECK_ERROR(rt->memcpy_async(nullptr, *seg, 64, kDefaultStream), Code::kInvalidArgument,
              "memcpy_async: null destination for 64 bytes");
  CHECK_ERROR(rt->release(0, *seg, 999), Code::kInvalidArgument,
              "was reserved with 4096 bytes, not 999");
  CHECK_ERROR(rt->release(0, static_cast<char*>(*seg) + 4096, 4096), Code::kNotFound,
              "is not the base of a segment reserved on device 0");
  REQUIRE_OK(rt->synchronize_stream(kDefaultStream));
  CHECK(static_cast<unsigned char*>(*seg)[0] == 7);
  CHECK(rt->memory_info(0)->free_bytes < rt->memory_info(0)->total_bytes);  // still reserved
  REQUIRE_OK(rt->release(0, *seg, 4096));
}

TEST_CASE("errors: host runtime reserve beyond the device's limit reserves nothing",
          "[errors][runtime]") {
  auto rt = host_runtime(std::size_t{1} << 20);
  auto seg = rt->reserve(0, 4096);
  REQUIRE_OK(seg);
  const std::size_t free_before = rt->memory_info(0)->free_bytes;
  CHECK_ERROR(rt->reserve(0, std::size_t{1} << 20), Code::kResourceExhausted,
              "reserve: device 0 cannot supply 1048576 bytes: 4096 bytes already reserved of its "
              "1048576-byte limit");
  CHECK(rt->memory_info(0)->free_bytes == free_before);
  REQUIRE_OK(rt->release(0, *seg, 4096));
}

TEST_CASE("errors: host runtime end_capture on a stream that is not capturing or did not begin",
          "[errors][runtime][capture]") {
  auto rt = host_runtime();
  const StreamHandle origin = *rt->create_stream(0);
  const StreamHandle side = *rt->create_stream(0);
  CHECK_ERROR(rt->end_capture(origin), Code::kFailedPrecondition,
              absl::StrFormat("end_capture: stream %d is not capturing", origin));
  auto id = rt->begin_capture(origin, CaptureMode::kGlobal);
  REQUIRE_OK(id);
  auto fork = rt->create_event(0);
  auto join = rt->create_event(0);
  REQUIRE_OK(fork);
  REQUIRE_OK(join);
  REQUIRE_OK(rt->record_event(*fork, origin));
  REQUIRE_OK(rt->stream_wait_event(side, *fork));
  CHECK_ERROR(rt->end_capture(side), Code::kFailedPrecondition,
              absl::StrFormat("end_capture: stream %d joined capture %d but did not begin it; end "
                              "it on its origin stream %d",
                              side, *id, origin));
  // Nothing ended: both streams are still in the capture, which ends whole.
  CHECK(rt->capture_info(side)->status == CaptureStatus::kActive);
  CHECK(rt->capture_info(origin)->status == CaptureStatus::kActive);
  REQUIRE_OK(rt->record_event(*join, side));
  REQUIRE_OK(rt->stream_wait_event(origin, *join));
  auto g = rt->end_capture(origin);
  REQUIRE_OK(g);
  REQUIRE_OK(rt->destroy_graph(*g));
  REQUIRE_OK(rt->destroy_event(*fork));
  REQUIRE_OK(rt->destroy_event(*join));
  REQUIRE_OK(rt->destroy_stream(side));
  REQUIRE_OK(rt->destroy_stream(origin));
}

TEST_CASE("errors: host runtime watch_capture_graph needs a function and an active capture",
          "[errors][runtime]") {
  auto rt = host_runtime();
  const StreamHandle s = *rt->create_stream(0);
  CHECK_ERROR(rt->watch_capture_graph(s, [] {}), Code::kFailedPrecondition,
              absl::StrFormat("watch_capture_graph: stream %d is not in an active capture", s));
  CHECK_ERROR(rt->watch_capture_graph(s, nullptr), Code::kInvalidArgument,
              "watch_capture_graph: no function given");
  REQUIRE_OK(rt->destroy_stream(s));
}

TEST_CASE("errors: a host runtime replay order that breaks the graph's edges launches nothing",
          "[errors][runtime]") {
  HostRuntimeOptions options;
  options.replay_order = [](const capalloc::GraphDependencies& deps) {
    std::vector<std::size_t> order(deps.size());
    for (std::size_t i = 0; i < order.size(); ++i) order[i] = order.size() - 1 - i;  // reversed
    return order;
  };
  auto rt = make_host_runtime(options);
  REQUIRE_OK(rt);
  const StreamHandle s = *(*rt)->create_stream(0);
  std::atomic<int> runs{0};
  KernelLaunch k;
  k.name = "count";
  k.host_body = [&runs] { ++runs; };
  REQUIRE_OK((*rt)->begin_capture(s, CaptureMode::kGlobal));
  REQUIRE_OK((*rt)->launch_kernel(s, k));
  REQUIRE_OK((*rt)->launch_kernel(s, k));
  auto g = (*rt)->end_capture(s);
  REQUIRE_OK(g);
  CHECK_ERROR((*rt)->launch_graph(*g, s), Code::kInvalidArgument,
              "is not a permutation of the graph's 2 nodes respecting its edges; nothing was "
              "launched");
  REQUIRE_OK((*rt)->synchronize_stream(s));
  CHECK(runs == 0);
  REQUIRE_OK((*rt)->destroy_graph(*g));
  REQUIRE_OK((*rt)->destroy_stream(s));
}

// --- Runtime loading ----------------------------------------------------------------------

TEST_CASE("errors: make_runtime with an unknown name", "[errors][plugins]") {
  CHECK_ERROR(make_runtime("gpu"), Code::kInvalidArgument,
              "unknown runtime 'gpu'; valid names are auto, host, cuda and hip");
}

TEST_CASE("errors: CAPALLOC_BACKEND_PATH naming no directory leaves nowhere to search",
          "[errors][plugins]") {
  ::setenv("CAPALLOC_BACKEND_PATH", ":", 1);
  CHECK_ERROR(make_runtime("hip"), Code::kUnavailable,
              "runtime 'hip': libcapalloc_backend_hip.so not found: no directory to search "
              "(CAPALLOC_BACKEND_PATH is empty)");
  auto fallback = make_runtime("auto");  // auto still works, on the host runtime
  REQUIRE_OK(fallback);
  CHECK((*fallback)->kind() == RuntimeKind::kHost);
  ::unsetenv("CAPALLOC_BACKEND_PATH");
}

#ifdef CAPALLOC_ERRORS_DOC_FAKE_BACKENDS
TEST_CASE("errors: a backend without the entry point, or built for another libcapalloc",
          "[errors][plugins]") {
  // The build made two fake backends there: libcapalloc_backend_hip.so
  // exports nothing, libcapalloc_backend_cuda.so reports backend ABI 99.
  ::setenv("CAPALLOC_BACKEND_PATH", CAPALLOC_ERRORS_DOC_FAKE_BACKENDS, 1);
  CHECK_ERROR(make_runtime("hip"), Code::kUnavailable,
              "runtime 'hip': libcapalloc_backend_hip.so has no symbol capalloc_backend_entry_v1");
  auto cuda = make_runtime("cuda");
  CHECK_ERROR(cuda, Code::kUnavailable,
              "runtime 'cuda': libcapalloc_backend_cuda.so does not match this libcapalloc");
  CHECK_THAT(message_of(cuda), Catch::Contains("it reports 0.0-errors-doc, ABI 99"));
  auto fallback = make_runtime("auto");
  REQUIRE_OK(fallback);
  CHECK((*fallback)->kind() == RuntimeKind::kHost);
  ::unsetenv("CAPALLOC_BACKEND_PATH");
}
#endif

// --- The CLI ------------------------------------------------------------------------------

#ifdef CAPALLOC_CLI_PATH
namespace {

// The CLI with `args`, in this environment minus CAPALLOC_* plus `env`.
capalloc::testing::ProgramRun run_cli(const std::vector<std::string>& args,
                                      const std::vector<std::pair<std::string, std::string>>& env) {
  return capalloc::testing::run_program(CAPALLOC_CLI_PATH, args, env);
}

}  // namespace

TEST_CASE("errors: the CLI exits 1 when the runtime it is told to use is unavailable",
          "[errors][cli]") {
  const auto r = run_cli({"describe", "--runtime", "cuda"},
                           {{"CAPALLOC_BACKEND_PATH", scratch_dir("empty")}});
  INFO(r.err);
  CHECK(r.exit_code == 1);
  CHECK_THAT(r.err, Catch::StartsWith("capalloc: UNAVAILABLE: runtime 'cuda': "));
}
#endif

