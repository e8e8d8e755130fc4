// The C ABI over the process-wide allocator (host runtime), white-box: a
// capture through the C ABI whose kernels are launched on the process-wide
// runtime (reached through c_api/global.hpp), checked and replayed strictly.
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <future>
#include <string>
#include <thread>

#include "capalloc/capalloc.h"
#include "c_api/global.hpp"
#include "test_support.hpp"
#include "tools/scenarios/kernels.hpp"

namespace {

// The process-wide allocator reads CAPALLOC_RUNTIME once, on first use.
void use_host_runtime() { ::setenv("CAPALLOC_RUNTIME", "host", 1); }

// The process-wide allocator on the host runtime, its runtime reached
// directly (as PyTorch's native captures reach CUDA), and a side stream
// created through the C ABI, destroyed by the case.
struct NativeScene {
  capalloc::DeviceRuntime* rt = nullptr;
  void* side = nullptr;
  capalloc::StreamHandle stream = capalloc::kDefaultStream;

  NativeScene() {
    use_host_runtime();
    auto global = capalloc::detail::global_capalloc();
    REQUIRE_OK(global);
    rt = global->allocator->device_runtime();
    REQUIRE(capalloc_stream_create(0, &side) == CAPALLOC_OK);
    stream = reinterpret_cast<capalloc::StreamHandle>(side);
  }
};

capalloc_stats device0_stats() {
  capalloc_stats s{};
  REQUIRE(capalloc_get_stats(0, &s) == CAPALLOC_OK);
  return s;
}

// After empty_cache, device 0 holds what it held at `before`.
void check_memory_back_to(const capalloc_stats& before) {
  const capalloc_stats after = device0_stats();
  CHECK(after.reserved_bytes == before.reserved_bytes);
  CHECK(after.segments == before.segments);
}


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

namespace {

// PyTorch's allocate filter, as the shim hands it over: the stream's
// allocations belong to the capture when it is the stream captured.
struct StreamFilter {
  void* stream = nullptr;
  int asked = 0;
};

int accept_stream(void* context, void* stream) {
  auto* f = static_cast<StreamFilter*>(context);
  ++f->asked;
  return stream == f->stream ? 1 : 0;
}

// One PyTorch-style capture on `side` into PyTorch pool (a, b): begin
// (before the capture exists, as PyTorch does), the capture through the
// native runtime, T written then freed, WS allocated at T's address and left
// live, end of the capture, then endAllocateToPool. Returns the end's status.
struct TorchCapture {
  capalloc_status end = CAPALLOC_OK;
  std::string findings;
  capalloc::GraphHandle graph = 0;
  void* ws = nullptr;
  void* t = nullptr;
};

TorchCapture torch_capture(capalloc::DeviceRuntime& rt, void* side, uint64_t a, uint64_t b,
                           const float* src, std::size_t n) {
  StreamFilter filter{side};
  TorchCapture out;
  REQUIRE(capalloc_torch_begin_allocate_to_pool(0, a, b, accept_stream, &filter) == CAPALLOC_OK);
  const auto stream = reinterpret_cast<capalloc::StreamHandle>(side);
  REQUIRE_OK(rt.begin_capture(stream, capalloc::CaptureMode::kGlobal));
  out.t = capalloc_torch_malloc(n * sizeof(float), 0, side);
  REQUIRE(out.t != nullptr);
  CHECK(filter.asked == 1);
  REQUIRE_OK(rt.launch_kernel(stream, capalloc::scenarios::scale_kernel(
                                          static_cast<float*>(out.t), src, n, 2.0f)));
  capalloc_torch_free(out.t, n * sizeof(float), 0, side);
  out.ws = capalloc_torch_malloc(n * sizeof(float), 0, side);
  CHECK(filter.asked == 1);  // asked once per capture
  auto graph = rt.end_capture(stream);
  REQUIRE_OK(graph);
  out.graph = *graph;
  const char* json = nullptr;
  out.end = capalloc_torch_end_allocate_to_pool(0, a, b, &json);
  REQUIRE(json != nullptr);
  out.findings = json;
  return out;
}

}  // namespace

TEST_CASE("C ABI: PyTorch's pool hooks route captures, share pools and check at capture end",
          "[c_api][capture][torch]") {
  use_host_runtime();
  void* side = nullptr;
  REQUIRE(capalloc_stream_create(0, &side) == CAPALLOC_OK);
  auto global = capalloc::detail::global_capalloc();
  REQUIRE_OK(global);
  capalloc::DeviceRuntime& rt = *global->allocator->device_runtime();
  constexpr std::size_t n = 1 << 16;
  float* src = static_cast<float*>(capalloc_torch_malloc(n * sizeof(float), 0, nullptr));
  REQUIRE(src != nullptr);
  REQUIRE(capalloc_set_strict(0) == CAPALLOC_OK);

  // The first capture: findings at its end, before any replay, inspected.
  const TorchCapture first = torch_capture(rt, side, 7, 0, src, n);
  REQUIRE(first.end == CAPALLOC_OK);
  INFO(first.findings);
  CHECK(first.t == first.ws);
  // Read from the graph at its end (the host runtime's inspection keeps the
  // kernels' declared accesses), with the graph's edges: not a footprint.
  CHECK(first.findings.find("\"evidence\":\"footprint\"") == std::string::npos);
  CHECK(first.findings.find("\"basis\":\"edges\"") != std::string::npos);
  CHECK(first.findings.find("\"severity\":\"hazard\"") != std::string::npos);
  uint64_t pool = 0;
  int uses = 0;
  REQUIRE(capalloc_torch_pool(0, 7, 0, &pool, &uses) == CAPALLOC_OK);
  CHECK(uses == 1);
  const auto ws_info = global->allocator->block_info(first.ws);
  REQUIRE_OK(ws_info);
  CHECK(ws_info->pool == pool);

  // The second capture shares the pool (torch.cuda.graph(pool=...)); in
  // strict mode its hazard fails the end, which names the finding.
  REQUIRE(capalloc_set_strict(1) == CAPALLOC_OK);
  int strict = -1;
  REQUIRE(capalloc_get_strict(&strict) == CAPALLOC_OK);
  CHECK(strict == 1);
  const TorchCapture second = torch_capture(rt, side, 7, 0, src, n);
  CHECK(second.end == CAPALLOC_ERROR_FAILED_PRECONDITION);
  const std::string message = capalloc_last_error();
  CHECK(message.find("strict mode") != std::string::npos);
  CHECK(message.find("PyTorch pool (7, 0)") != std::string::npos);
  CHECK(second.findings.find("\"severity\":\"hazard\"") != std::string::npos);
  REQUIRE(capalloc_set_strict(0) == CAPALLOC_OK);
  REQUIRE(capalloc_torch_pool(0, 7, 0, &pool, &uses) == CAPALLOC_OK);
  CHECK(uses == 2);
  const auto ws2_info = global->allocator->block_info(second.ws);
  REQUIRE_OK(ws2_info);
  CHECK(ws2_info->pool == pool);
  // The end happened all the same: no begin is left to end.
  CHECK(capalloc_torch_end_allocate_to_pool(0, 7, 0, nullptr) ==
        CAPALLOC_ERROR_FAILED_PRECONDITION);

  // A capture that allocates nothing is not seen: no findings.
  StreamFilter idle{side};
  REQUIRE(capalloc_torch_begin_allocate_to_pool(0, 7, 0, accept_stream, &idle) == CAPALLOC_OK);
  const char* json = nullptr;
  REQUIRE(capalloc_torch_end_allocate_to_pool(0, 7, 0, &json) == CAPALLOC_OK);
  CHECK(std::string(json) == "[]");
  CHECK(idle.asked == 0);

  // An allocation on a stream no filter accepts is not routed to the pool.
  StreamFilter other{nullptr};
  REQUIRE(capalloc_torch_begin_allocate_to_pool(0, 9, 1, accept_stream, &other) == CAPALLOC_OK);
  const auto stream = reinterpret_cast<capalloc::StreamHandle>(side);
  REQUIRE_OK(rt.begin_capture(stream, capalloc::CaptureMode::kGlobal));
  void* unrouted = capalloc_torch_malloc(256, 0, side);
  REQUIRE(unrouted != nullptr);
  CHECK(other.asked == 1);
  uint64_t pool9 = 0;
  REQUIRE(capalloc_torch_pool(0, 9, 1, &pool9, nullptr) == CAPALLOC_OK);
  CHECK(global->allocator->block_info(unrouted)->pool != pool9);
  capalloc_torch_free(unrouted, 256, 0, side);
  auto unrouted_graph = rt.end_capture(stream);
  REQUIRE_OK(unrouted_graph);
  REQUIRE(capalloc_torch_end_allocate_to_pool(0, 9, 1, nullptr) == CAPALLOC_OK);
  REQUIRE(capalloc_torch_release_pool(0, 9, 1) == CAPALLOC_OK);
  REQUIRE_OK(rt.destroy_graph(*unrouted_graph));

  // Releases: one per begin; then the pool is gone.
  for (int i = 0; i < 3; ++i) REQUIRE(capalloc_torch_release_pool(0, 7, 0) == CAPALLOC_OK);
  CHECK(capalloc_torch_release_pool(0, 7, 0) == CAPALLOC_ERROR_NOT_FOUND);
  CHECK(capalloc_torch_pool(0, 7, 0, &pool, &uses) == CAPALLOC_ERROR_NOT_FOUND);

  REQUIRE_OK(rt.destroy_graph(first.graph));
  REQUIRE_OK(rt.destroy_graph(second.graph));
  capalloc_torch_free(first.ws, n * sizeof(float), 0, side);
  capalloc_torch_free(second.ws, n * sizeof(float), 0, side);
  capalloc_torch_free(src, n * sizeof(float), 0, nullptr);
  REQUIRE(capalloc_stream_synchronize(side) == CAPALLOC_OK);
  // The tracker learns of the destroyed graphs at its next call and drops
  // their records; then the memory they kept goes back, and the pool with it.
  const char* after = nullptr;
  REQUIRE(capalloc_check(&after) == CAPALLOC_OK);
  REQUIRE(capalloc_empty_cache(-1) == CAPALLOC_OK);
  const capalloc_status invariants = capalloc_check_invariants();
  INFO(capalloc_last_error());
  CHECK(invariants == CAPALLOC_OK);
  REQUIRE(capalloc_stream_destroy(side) == CAPALLOC_OK);
}

namespace {

// A filter that allocates and frees through the torch entry points on the
// default stream (not capturing) each time it is asked.
struct AllocatingFilter {
  void* stream = nullptr;
  void* got = nullptr;
};
int allocating_filter(void* context, void* stream) {
  auto* f = static_cast<AllocatingFilter*>(context);
  f->got = capalloc_torch_malloc(128, 0, nullptr);
  return stream == f->stream ? 1 : 0;
}

}  // namespace

// Found by a review of 2f78d49: every allocation made while a pool begin was
// underway took the torch pools' lock to note the allocator, and a filter
// (asked under that lock) that allocated waited for it forever. The capture
// runs on a thread of its own, so that a deadlock fails the test instead of
// hanging it.
TEST_CASE("C ABI: a PyTorch pool filter may allocate on a stream that is not capturing",
          "[c_api][capture][torch]") {
  use_host_runtime();
  auto global = capalloc::detail::global_capalloc();
  REQUIRE_OK(global);
  capalloc::DeviceRuntime& rt = *global->allocator->device_runtime();
  void* warm = capalloc_torch_malloc(64, 0, nullptr);  // the allocator known usable
  REQUIRE(warm != nullptr);
  void* side = nullptr;
  REQUIRE(capalloc_stream_create(0, &side) == CAPALLOC_OK);
  AllocatingFilter filter{side, nullptr};
  REQUIRE(capalloc_torch_begin_allocate_to_pool(0, 31, 0, allocating_filter, &filter) ==
          CAPALLOC_OK);
  const auto stream = reinterpret_cast<capalloc::StreamHandle>(side);
  std::promise<void*> allocated;
  std::future<void*> result = allocated.get_future();
  absl::StatusOr<capalloc::GraphHandle> graph = absl::UnknownError("not ended");
  std::thread capture([&] {
    if (!rt.begin_capture(stream, capalloc::CaptureMode::kThreadLocal).ok()) {
      allocated.set_value(nullptr);
      return;
    }
    void* p = capalloc_torch_malloc(4096, 0, side);
    graph = rt.end_capture(stream);
    allocated.set_value(p);
  });
  if (result.wait_for(std::chrono::seconds(30)) != std::future_status::ready) {
    capture.detach();  // blocked for good: the deadlock
    FAIL("capalloc_torch_malloc during the capture did not return in 30 s");
  }
  capture.join();
  void* p = result.get();
  REQUIRE(p != nullptr);
  REQUIRE(filter.got != nullptr);
  REQUIRE_OK(graph);
  uint64_t pool = 0;
  REQUIRE(capalloc_torch_pool(0, 31, 0, &pool, nullptr) == CAPALLOC_OK);
  CHECK(global->allocator->block_info(p)->pool == pool);            // routed
  CHECK(global->allocator->block_info(filter.got)->pool != pool);  // not routed
  REQUIRE(capalloc_torch_end_allocate_to_pool(0, 31, 0, nullptr) == CAPALLOC_OK);
  REQUIRE_OK(rt.destroy_graph(*graph));
  capalloc_torch_free(p, 4096, 0, side);
  capalloc_torch_free(filter.got, 128, 0, nullptr);
  capalloc_torch_free(warm, 64, 0, nullptr);
  REQUIRE(capalloc_torch_release_pool(0, 31, 0) == CAPALLOC_OK);
  REQUIRE(capalloc_stream_synchronize(side) == CAPALLOC_OK);
  const char* after = nullptr;
  REQUIRE(capalloc_check(&after) == CAPALLOC_OK);
  REQUIRE(capalloc_empty_cache(-1) == CAPALLOC_OK);
  CHECK(capalloc_check_invariants() == CAPALLOC_OK);
  REQUIRE(capalloc_stream_destroy(side) == CAPALLOC_OK);
}

// Found by tests/fuzz/c_api_fuzzer: a graph pool whose last reference and
// block are gone stays (with its segments) while another live graph's record
// reads its memory, as Allocator::Impl::maybe_destroy_pool intends; the
// invariant check called that state a bug (CAPALLOC_ERROR_INTERNAL).
TEST_CASE("C ABI: a graph pool kept for another graph's record passes the invariant check",
          "[c_api][capture][fuzz]") {
  NativeScene scene;
  capalloc::DeviceRuntime& rt = *scene.rt;
  void* side = scene.side;
  const capalloc::StreamHandle stream = scene.stream;
  REQUIRE(capalloc_empty_cache(-1) == CAPALLOC_OK);
  const capalloc_stats before = device0_stats();

  // Graph A's private pool holds X, live after A's capture.
  REQUIRE(capalloc_capture_begin(0, side, 0, "A") == CAPALLOC_OK);
  void* x = nullptr;
  REQUIRE(capalloc_malloc(&x, 4096, 0, side) == CAPALLOC_OK);
  uint64_t a = 0;
  REQUIRE(capalloc_capture_end(side, &a, nullptr) == CAPALLOC_OK);
  // Graph B (another private pool) reads X: B's record names A's memory.
  REQUIRE(capalloc_capture_begin(0, side, 0, "B") == CAPALLOC_OK);
  capalloc::KernelLaunch read_x{.name = "read_x", .reads = {{x, 4096}}, .host_body = [] {}};
  REQUIRE_OK(rt.launch_kernel(stream, std::move(read_x)));
  uint64_t b = 0;
  REQUIRE(capalloc_capture_end(side, &b, nullptr) == CAPALLOC_OK);

  // A's pool loses its graph and its block; B's record keeps its segment.
  REQUIRE(capalloc_graph_destroy(a) == CAPALLOC_OK);
  REQUIRE(capalloc_free(x) == CAPALLOC_OK);
  CHECK(capalloc_check_invariants() == CAPALLOC_OK);
  INFO(capalloc_last_error());
  REQUIRE(capalloc_empty_cache(-1) == CAPALLOC_OK);
  CHECK(capalloc_check_invariants() == CAPALLOC_OK);

  // Once B is gone, empty_cache returns the memory, and the pool goes.
  REQUIRE(capalloc_graph_destroy(b) == CAPALLOC_OK);
  REQUIRE(capalloc_empty_cache(-1) == CAPALLOC_OK);
  CHECK(capalloc_check_invariants() == CAPALLOC_OK);
  check_memory_back_to(before);
  REQUIRE(capalloc_stream_destroy(side) == CAPALLOC_OK);
}

// Found by tests/fuzz/c_api_fuzzer: the tracker ends the routes of native
// captures it finds over (any check, another pool's end hook); PyTorch's end
// hook then got NOT_FOUND from the allocator for that route, the begin stayed
// underway for good, and the pool could never be released.
TEST_CASE("C ABI: PyTorch's end hook after a check that already ended the capture's route",
          "[c_api][torch][fuzz]") {
  NativeScene scene;
  capalloc::DeviceRuntime& rt = *scene.rt;
  void* side = scene.side;
  const capalloc::StreamHandle stream = scene.stream;

  REQUIRE(capalloc_torch_begin_allocate_to_pool(0, 31, 0, nullptr, nullptr) == CAPALLOC_OK);
  REQUIRE_OK(rt.begin_capture(stream, capalloc::CaptureMode::kGlobal));
  void* p = capalloc_torch_malloc(4096, 0, side);
  REQUIRE(p != nullptr);
  auto graph = rt.end_capture(stream);
  REQUIRE_OK(graph);
  // A check between the capture's end and PyTorch's end hook.
  const char* json = nullptr;
  REQUIRE(capalloc_check(&json) == CAPALLOC_OK);
  CHECK(capalloc_torch_end_allocate_to_pool(0, 31, 0, &json) == CAPALLOC_OK);
  INFO(capalloc_last_error());
  CHECK(capalloc_torch_release_pool(0, 31, 0) == CAPALLOC_OK);
  uint64_t pool = 0;
  CHECK(capalloc_torch_pool(0, 31, 0, &pool, nullptr) == CAPALLOC_ERROR_NOT_FOUND);

  capalloc_torch_free(p, 4096, 0, side);
  REQUIRE_OK(rt.destroy_graph(*graph));
  REQUIRE(capalloc_stream_destroy(side) == CAPALLOC_OK);
  CHECK(capalloc_check_invariants() == CAPALLOC_OK);
}

// Found by tests/fuzz/c_api_fuzzer: the tracker learns that a native graph
// is gone only at its next operation, and until then its record kept the
// graph's memory mapped, so empty_cache (and the out-of-memory retry) could
// not return the memory of a graph already destroyed.
TEST_CASE("C ABI: empty_cache returns the memory of a destroyed native graph at once",
          "[c_api][torch][fuzz]") {
  NativeScene scene;
  capalloc::DeviceRuntime& rt = *scene.rt;
  void* side = scene.side;
  const capalloc::StreamHandle stream = scene.stream;
  // What earlier cases left to be reclaimed goes first (a check catches the
  // tracker up with graphs destroyed before).
  const char* json = nullptr;
  REQUIRE(capalloc_check(&json) == CAPALLOC_OK);
  REQUIRE(capalloc_empty_cache(-1) == CAPALLOC_OK);
  const capalloc_stats before = device0_stats();

  // PyTorch's capture: begin, the native capture writing its block, end.
  REQUIRE(capalloc_torch_begin_allocate_to_pool(0, 33, 0, nullptr, nullptr) == CAPALLOC_OK);
  REQUIRE_OK(rt.begin_capture(stream, capalloc::CaptureMode::kGlobal));
  constexpr std::size_t kBytes = 1 << 16;
  void* p = capalloc_torch_malloc(kBytes, 0, side);
  REQUIRE(p != nullptr);
  REQUIRE_OK(rt.memset_async(p, 0, kBytes, stream));
  auto graph = rt.end_capture(stream);
  REQUIRE_OK(graph);
  REQUIRE(capalloc_torch_end_allocate_to_pool(0, 33, 0, nullptr) == CAPALLOC_OK);
  REQUIRE(capalloc_torch_release_pool(0, 33, 0) == CAPALLOC_OK);
  capalloc_torch_free(p, kBytes, 0, side);
  capalloc_stats live{};
  REQUIRE(capalloc_get_stats(0, &live) == CAPALLOC_OK);
  CHECK(live.reserved_bytes > before.reserved_bytes);  // the graph keeps its memory

  // PyTorch destroys the graph; nothing else happens before empty_cache.
  REQUIRE_OK(rt.destroy_graph(*graph));
  REQUIRE(capalloc_empty_cache(-1) == CAPALLOC_OK);
  check_memory_back_to(before);
  CHECK(capalloc_check_invariants() == CAPALLOC_OK);
  REQUIRE(capalloc_stream_destroy(side) == CAPALLOC_OK);
}

// Found by tests/fuzz/c_api_fuzzer: empty_cache processed the frees deferred
// during a capture before it ended the routes of captures that were over (a
// native capture nobody announced, a graph destroyed), so those frees stayed
// deferred, and their memory reserved, until some later call.
TEST_CASE("C ABI: empty_cache completes frees deferred by a native capture that is over",
          "[c_api][capture][fuzz]") {
  NativeScene scene;
  capalloc::DeviceRuntime& rt = *scene.rt;
  void* side = scene.side;
  const capalloc::StreamHandle stream = scene.stream;
  void* user = nullptr;
  REQUIRE(capalloc_stream_create(0, &user) == CAPALLOC_OK);

  // A block also used on `user`, freed while a native capture is routed.
  void* p = nullptr;
  REQUIRE(capalloc_malloc(&p, 4096, 0, nullptr) == CAPALLOC_OK);
  REQUIRE(capalloc_record_stream(p, user) == CAPALLOC_OK);
  REQUIRE_OK(rt.begin_capture(stream, capalloc::CaptureMode::kGlobal));
  void* q = nullptr;
  REQUIRE(capalloc_malloc(&q, 4096, 0, side) == CAPALLOC_OK);  // the capture shows
  auto graph = rt.end_capture(stream);
  REQUIRE_OK(graph);
  REQUIRE(capalloc_free(p) == CAPALLOC_OK);  // deferred: the route is still there
  capalloc_stats s{};
  REQUIRE(capalloc_get_stats(0, &s) == CAPALLOC_OK);
  CHECK(s.pending_free_blocks == 1);

  // The capture is over: empty_cache ends its route, then records the free's
  // event on `user`; once `user` has passed it, the next call completes it.
  REQUIRE(capalloc_empty_cache(-1) == CAPALLOC_OK);
  REQUIRE(capalloc_stream_synchronize(user) == CAPALLOC_OK);
  // `user` is held busy now: an event recorded only from here on (as it was
  // when empty_cache left the free deferred) could not complete.
  std::atomic<bool> go{false};
  REQUIRE_OK(rt.launch_kernel(reinterpret_cast<capalloc::StreamHandle>(user),
                              capalloc::KernelLaunch{.name = "hold", .host_body = [&go] {
                                while (!go.load()) std::this_thread::yield();
                              }}));
  void* r = nullptr;
  REQUIRE(capalloc_malloc(&r, 64, 0, nullptr) == CAPALLOC_OK);  // polls pending frees
  REQUIRE(capalloc_get_stats(0, &s) == CAPALLOC_OK);
  CHECK(s.pending_free_blocks == 0);
  go = true;
  REQUIRE(capalloc_stream_synchronize(user) == CAPALLOC_OK);

  REQUIRE(capalloc_free(r) == CAPALLOC_OK);
  REQUIRE(capalloc_free(q) == CAPALLOC_OK);
  REQUIRE_OK(rt.destroy_graph(*graph));
  REQUIRE(capalloc_stream_destroy(side) == CAPALLOC_OK);
  REQUIRE(capalloc_stream_destroy(user) == CAPALLOC_OK);
  CHECK(capalloc_check_invariants() == CAPALLOC_OK);
}
