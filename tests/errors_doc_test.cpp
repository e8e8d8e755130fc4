// The rows of docs/errors.md that no other suite checks whole: for each, the
// status code, the fixed part of the message the doc quotes, and the state
// the doc promises after the error. Each TEST_CASE name here is referenced
// from a row of docs/errors.md (tests/check_errors_doc.cmake keeps the two
// together).
//
// White-box (capalloc_add_test): the map from absl codes to capalloc_status
// is checked on c_api's own conversion, and a C ABI capture that PyTorch's
// hooks route needs the process-wide runtime. Everything else goes through
// the public headers only.
#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "c_api/c_api_support.hpp"
#include "c_api/global.hpp"
#include "capalloc/allocator.hpp"
#include "capalloc/capalloc.h"
#include "capalloc/capture.hpp"
#include "capalloc/gemm.hpp"
#include "capalloc/persistent_cache.hpp"
#include "capalloc/runtime.hpp"
#include "test_support.hpp"

extern char** environ;

using namespace capalloc;
using capalloc::testing::host_runtime;
using capalloc::testing::make_allocator;
using capalloc::testing::same_state;
using Code = absl::StatusCode;

namespace {

std::string message_of(const absl::Status& s) { return std::string(s.message()); }
template <typename T>
std::string message_of(const absl::StatusOr<T>& s) {
  return std::string(s.status().message());
}
template <typename T>
absl::Status status_of(const absl::StatusOr<T>& s) {
  return s.status();
}
absl::Status status_of(const absl::Status& s) { return s; }

// The row's code and the fixed part of its message.
#define CHECK_ERROR(expr, expected_code, expected_pattern)                       \
  do {                                                                          \
    const absl::Status errors_doc_status_ = status_of(expr);                    \
    INFO(errors_doc_status_.ToString());                                        \
    CHECK(errors_doc_status_.code() == (expected_code));                        \
    CHECK_THAT(message_of(errors_doc_status_), Catch::Contains(expected_pattern)); \
  } while (0)

// The C ABI's code and the calling thread's last error.
#define CHECK_C_ERROR(expr, expected_code, expected_pattern)                     \
  do {                                                                          \
    const capalloc_status errors_doc_c_ = (expr);                               \
    const std::string errors_doc_last_ = capalloc_last_error();                 \
    INFO(errors_doc_last_);                                                     \
    CHECK(errors_doc_c_ == (expected_code));                                    \
    CHECK_THAT(errors_doc_last_, Catch::Contains(expected_pattern));            \
  } while (0)

std::string hex(std::uintptr_t v) { return absl::StrFormat("0x%x", v); }

// How many graph pools the allocator holds (describe() lists each).
int graph_pools(const Allocator& a) {
  const std::string d = a.describe();
  int n = 0;
  for (std::size_t at = d.find("  graph pool "); at != std::string::npos;
       at = d.find("  graph pool ", at + 1)) {
    ++n;
  }
  return n;
}

// A kernel that waits for `gate` and reads `span`.
KernelLaunch gate_kernel(const capalloc::testing::Gate& gate, const void* p, std::size_t bytes) {
  return gate.kernel(p, bytes);
}

KernelLaunch write_kernel(void* p, std::size_t bytes, int value) {
  KernelLaunch k;
  k.name = "write";
  k.writes = {{p, bytes}};
  k.host_body = [p, bytes, value] { std::memset(p, value, bytes); };
  return k;
}

// A host runtime behind a forwarding layer whose faults a test switches on:
// what a GPU runtime does when the driver refuses. `Base` is MemoryRuntime
// (the memory seam only) or DeviceRuntime.
template <typename Base>
class Forwarding : public Base {
 public:
  explicit Forwarding(std::shared_ptr<DeviceRuntime> inner) : in_(std::move(inner)) {}
  int devices = -1;  // -1: the inner runtime's count
  std::atomic<bool> fail_create_event{false};
  std::atomic<bool> fail_release{false};

  RuntimeKind kind() const override { return in_->kind(); }
  int device_count() const override { return devices >= 0 ? devices : in_->device_count(); }
  absl::StatusOr<DeviceMemoryInfo> memory_info(int d) const override { return in_->memory_info(d); }
  absl::StatusOr<void*> reserve(int d, std::size_t b) override { return in_->reserve(d, b); }
  absl::Status release(int d, void* p, std::size_t b) override {
    if (fail_release) return absl::InternalError("release: injected driver failure");
    return in_->release(d, p, b);
  }
  CaptureMode exchange_thread_capture_mode(CaptureMode m) override {
    return in_->exchange_thread_capture_mode(m);
  }
  absl::StatusOr<StreamHandle> create_stream(int d) override { return in_->create_stream(d); }
  absl::Status destroy_stream(StreamHandle s) override { return in_->destroy_stream(s); }
  void watch_stream_destruction(std::function<bool(StreamHandle)> f) override {
    in_->watch_stream_destruction(std::move(f));
  }
  absl::Status synchronize_stream(StreamHandle s) override { return in_->synchronize_stream(s); }
  absl::StatusOr<EventHandle> create_event(int d) override {
    if (fail_create_event) return absl::InternalError("create_event: injected driver failure");
    return in_->create_event(d);
  }
  absl::Status destroy_event(EventHandle e) override { return in_->destroy_event(e); }
  absl::Status record_event(EventHandle e, StreamHandle s) override {
    return in_->record_event(e, s);
  }
  absl::StatusOr<bool> query_event(EventHandle e) override { return in_->query_event(e); }
  absl::Status synchronize_event(EventHandle e) override { return in_->synchronize_event(e); }
  absl::Status stream_wait_event(StreamHandle s, EventHandle e) override {
    return in_->stream_wait_event(s, e);
  }
  absl::StatusOr<CaptureInfo> capture_info(StreamHandle s) override { return in_->capture_info(s); }
  bool any_capture_active(int d) const override { return in_->any_capture_active(d); }
  absl::Status watch_capture_graph(StreamHandle s, std::function<void()> f) override {
    return in_->watch_capture_graph(s, std::move(f));
  }

 protected:
  std::shared_ptr<DeviceRuntime> in_;
};

// The memory seam only: no launches, no captures.
class MemoryOnly final : public Forwarding<MemoryRuntime> {
 public:
  using Forwarding::Forwarding;
};

class Faulty final : public Forwarding<DeviceRuntime> {
 public:
  using Forwarding::Forwarding;
  absl::Status launch_kernel(StreamHandle s, KernelLaunch k) override {
    return in_->launch_kernel(s, std::move(k));
  }
  absl::Status memset_async(void* d, int v, std::size_t b, StreamHandle s) override {
    return in_->memset_async(d, v, b, s);
  }
  absl::Status memcpy_async(void* d, const void* src, std::size_t b, StreamHandle s) override {
    return in_->memcpy_async(d, src, b, s);
  }
  absl::StatusOr<CaptureId> begin_capture(StreamHandle s, CaptureMode m) override {
    return in_->begin_capture(s, m);
  }
  absl::StatusOr<GraphHandle> end_capture(StreamHandle s) override { return in_->end_capture(s); }
  absl::Status launch_graph(GraphHandle g, StreamHandle s) override {
    return in_->launch_graph(g, s);
  }
  absl::Status destroy_graph(GraphHandle g) override { return in_->destroy_graph(g); }
  absl::StatusOr<std::vector<GraphWrite>> graph_writes(GraphHandle g) override {
    return in_->graph_writes(g);
  }
  absl::StatusOr<GraphDependencies> graph_dependencies(GraphHandle g) override {
    return in_->graph_dependencies(g);
  }
};

// An allocator with a tracker, a side stream, one live block and one cached
// free block; unchanged() checks that a failed call left all of it alone.
struct Scene {
  std::shared_ptr<DeviceRuntime> rt;
  std::unique_ptr<Allocator> alloc;
  std::unique_ptr<CaptureTracker> tracker;
  StreamHandle side = kDefaultStream;
  void* live = nullptr;
  void* freed = nullptr;
  AllocatorStats before;
  int pools_before = 0;

  explicit Scene(std::size_t limit = std::size_t{16} << 30, int devices = 1,
                 TrackerOptions tracker_options = {})
      : rt(host_runtime(limit, devices)) {
    alloc = make_allocator(rt);
    auto t = CaptureTracker::create(*alloc, tracker_options);
    REQUIRE_OK(t);
    tracker = *std::move(t);
    side = *rt->create_stream(0);
    live = *alloc->allocate(4096);
    freed = *alloc->allocate(4096);
    REQUIRE_OK(alloc->deallocate(freed));
    mark();
  }
  ~Scene() {
    tracker.reset();
    alloc.reset();
  }
  // The state unchanged() compares against.
  void mark() {
    before = *alloc->stats(0);
    pools_before = graph_pools(*alloc);
  }
  void unchanged() {
    REQUIRE_OK(alloc->CheckInvariants());
    CHECK(same_state(before, *alloc->stats(0)));
    CHECK(graph_pools(*alloc) == pools_before);
    CHECK(alloc->block_info(live)->state == BlockState::kAllocated);
  }
};

// Runs the hidden TEST_CASE `name` of this program in a fresh process (the
// C ABI's allocator starts once per process, and this one's may have
// started) with `env` set; returns what it wrote to $ERRORS_DOC_RESULT.
std::string in_fresh_process(const std::string& name,
                             const std::vector<std::pair<std::string, std::string>>& env) {
  char result_path[] = "/tmp/capalloc_errors_doc_result_XXXXXX";
  const int fd = ::mkstemp(result_path);
  REQUIRE(fd >= 0);
  ::close(fd);
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    for (const auto& [var, value] : env) ::setenv(var.c_str(), value.c_str(), 1);
    ::setenv("ERRORS_DOC_RESULT", result_path, 1);
    const int null_fd = ::open("/dev/null", O_WRONLY);
    ::dup2(null_fd, STDOUT_FILENO);
    std::string self = "errors_doc_test";
    std::string test = name;
    char* argv[] = {self.data(), test.data(), nullptr};
    ::execv("/proc/self/exe", argv);
    ::_exit(127);
  }
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
  std::ifstream in(result_path);
  std::stringstream text;
  text << in.rdbuf();
  ::unlink(result_path);
  return text.str();
}

// What a hidden case reports back to in_fresh_process.
void report_result(const std::string& out) {
  const char* path = std::getenv("ERRORS_DOC_RESULT");
  REQUIRE(path != nullptr);
  std::ofstream(path) << out;
}

void use_host_runtime() { ::setenv("CAPALLOC_RUNTIME", "host", 1); }

capalloc_stats c_stats() {
  capalloc_stats s{};
  REQUIRE(capalloc_get_stats(0, &s) == CAPALLOC_OK);
  return s;
}

bool same_c_stats(const capalloc_stats& a, const capalloc_stats& b) {
  return a.allocated_bytes == b.allocated_bytes && a.reserved_bytes == b.reserved_bytes &&
         a.segments == b.segments && a.allocated_blocks == b.allocated_blocks &&
         a.free_blocks == b.free_blocks && a.allocations == b.allocations &&
         a.frees == b.frees;
}

std::string scratch_dir(const std::string& name) {
  const auto dir = std::filesystem::temp_directory_path() / ("capalloc_errors_doc_" + name);
  std::filesystem::create_directories(dir);
  return dir.string();
}

}  // namespace

// --- Allocation and free ---------------------------------------------------------

TEST_CASE("errors: Allocator::create refuses a null runtime and invalid options",
          "[errors][alloc]") {
  CHECK_ERROR(Allocator::create(nullptr), Code::kInvalidArgument,
              "Allocator::create: runtime is null");
  AllocatorOptions odd;
  odd.round_granularity = 384;
  CHECK_ERROR(Allocator::create(host_runtime(), odd), Code::kInvalidArgument,
              "round_granularity 384 must be a power of two of at least 256");
  AllocatorOptions small;
  small.round_granularity = 128;
  CHECK_ERROR(Allocator::create(host_runtime(), small), Code::kInvalidArgument,
              "must be a power of two of at least 256");
  AllocatorOptions classes;
  classes.small_request_limit = std::size_t{4} << 20;  // larger than its 2 MiB segments
  CHECK_ERROR(Allocator::create(host_runtime(), classes), Code::kInvalidArgument,
              "segment sizes must hold their size class's largest request");
  // Nothing was created: the runtime holds no memory.
  auto rt = host_runtime();
  CHECK_FALSE(Allocator::create(rt, odd).ok());
  CHECK(rt->memory_info(0)->free_bytes == rt->memory_info(0)->total_bytes);
}

TEST_CASE("errors: Allocator::create over a runtime with no device", "[errors][alloc]") {
  auto inner = host_runtime();
  auto none = std::make_shared<MemoryOnly>(inner);
  none->devices = 0;
  CHECK_ERROR(Allocator::create(none), Code::kFailedPrecondition, "the host runtime reports no device");
  CHECK(inner->memory_info(0)->free_bytes == inner->memory_info(0)->total_bytes);
}

TEST_CASE("errors: allocate of size 0 or an implausible size changes nothing", "[errors][alloc]") {
  Scene s;
  CHECK_ERROR(s.alloc->allocate(0), Code::kInvalidArgument,
              "allocate: size 0; a zero-byte block has no address to give");
  CHECK_ERROR(s.alloc->allocate(~std::size_t{0}), Code::kInvalidArgument,
              "is not a plausible request");
  CHECK_ERROR(s.alloc->allocate(0, 0, s.side), Code::kInvalidArgument, "size 0");
  s.unchanged();
}

TEST_CASE("errors: allocate on an unknown stream is INVALID_ARGUMENT while a capture is active too",
          "[errors][alloc][streams]") {
  Scene s;
  // A capture on the device makes allocate ask the runtime about the stream
  // first; the answer for an unknown stream is still INVALID_ARGUMENT.
  REQUIRE_OK(s.tracker->begin_capture(0, s.side));
  s.mark();
  const StreamHandle garbage = 0xdead0000;
  CHECK_ERROR(s.alloc->allocate(4096, 0, garbage), Code::kInvalidArgument,
              absl::StrCat("allocate: stream ", hex(garbage),
                           " is not a live stream of the host runtime"));
  s.unchanged();
  CHECK(s.rt->capture_info(s.side)->status == CaptureStatus::kActive);
  auto done = s.tracker->end_capture(s.side);
  REQUIRE_OK(done);
  REQUIRE_OK(s.tracker->destroy_graph(done->graph));
}

TEST_CASE("errors: out of memory releases the cache, allocates nothing and counts an OOM",
          "[errors][alloc][oom]") {
  constexpr std::size_t kMiB = std::size_t{1} << 20;
  Scene s(64 * kMiB);
  // 40 MiB cached on the side stream, where the default stream cannot use it.
  auto cached = s.alloc->allocate(40 * kMiB, 0, s.side);
  REQUIRE_OK(cached);
  REQUIRE_OK(s.alloc->deallocate(*cached));
  const AllocatorStats before = *s.alloc->stats(0);
  CHECK(before.reserved_bytes.current > static_cast<std::int64_t>(40 * kMiB));
  auto p = s.alloc->allocate(63 * kMiB);
  CHECK_ERROR(p, Code::kResourceExhausted, "out of memory: requested 63.00 MiB");
  CHECK_THAT(message_of(p), Catch::Contains("after the cache was released") &&
                                Catch::Contains("on device 0 of the host runtime"));
  const AllocatorStats after = *s.alloc->stats(0);
  CHECK(after.allocated_blocks.current == before.allocated_blocks.current);
  CHECK(after.allocations == before.allocations);
  CHECK(after.ooms == before.ooms + 1);
  CHECK(after.retries == before.retries + 1);
  // The cached 40 MiB segment went back to the runtime on the way.
  CHECK(after.reserved_bytes.current < before.reserved_bytes.current);
  REQUIRE_OK(s.alloc->CheckInvariants());
  // A request larger than the device is refused before anything is released.
  const AllocatorStats mid = *s.alloc->stats(0);
  CHECK_ERROR(s.alloc->allocate(65 * kMiB), Code::kResourceExhausted,
              "the device has only 64.00 MiB in all");
  CHECK(s.alloc->stats(0)->reserved_bytes.current == mid.reserved_bytes.current);
}

TEST_CASE("errors: deallocate of a null pointer changes nothing", "[errors][alloc]") {
  Scene s;
  CHECK_ERROR(s.alloc->deallocate(nullptr), Code::kInvalidArgument, "deallocate: null pointer");
  CHECK_ERROR(s.alloc->deallocate_owned(nullptr, "x"), Code::kInvalidArgument,
              "deallocate: null pointer");
  s.unchanged();
}

TEST_CASE("errors: deallocate of a split's free remainder is NOT_FOUND and changes nothing",
          "[errors][alloc]") {
  Scene s;
  // A 4 KiB block split off a segment's free memory: the remainder starts
  // right after it, free, and was never handed out.
  auto p = s.alloc->allocate(4096);
  REQUIRE_OK(p);
  void* rest = static_cast<char*>(*p) + 4096;
  REQUIRE(s.alloc->block_info(rest)->ptr == rest);
  s.mark();
  CHECK_ERROR(s.alloc->deallocate(rest), Code::kNotFound,
              "capalloc did not hand out this pointer");
  CHECK_THAT(message_of(s.alloc->deallocate(rest)), !Catch::Contains("double free"));
  s.unchanged();
  CHECK(s.alloc->block_info(rest)->state == BlockState::kFree);
  REQUIRE_OK(s.alloc->deallocate(*p));
}

TEST_CASE("errors: a second free of a block still waiting on stream events is refused",
          "[errors][alloc][streams]") {
  Scene s;
  capalloc::testing::Gate gate;
  auto p = s.alloc->allocate(4096);
  REQUIRE_OK(p);
  REQUIRE_OK(s.alloc->record_stream(*p, s.side));
  REQUIRE_OK(s.rt->launch_kernel(s.side, gate_kernel(gate, *p, 4096)));
  REQUIRE_OK(s.alloc->deallocate(*p));  // pending: the side stream still reads it
  REQUIRE(s.alloc->block_info(*p)->state == BlockState::kPendingFree);
  s.mark();
  CHECK_ERROR(s.alloc->deallocate(*p), Code::kFailedPrecondition,
              "block is already freed and waiting on stream events (double free or use after "
              "free");
  CHECK(s.alloc->block_info(*p)->state == BlockState::kPendingFree);
  s.unchanged();
  gate.open();
  REQUIRE_OK(s.rt->synchronize_stream(s.side));
}

TEST_CASE("errors: deallocate_owned by another owner or of an unowned block is refused",
          "[errors][alloc][persistent]") {
  Scene s;
  auto owned = s.alloc->allocate(4096, 0, kDefaultStream,
                                 {.lifetime = Lifetime::kPersistent, .tag = "kv", .owner = "me"});
  REQUIRE_OK(owned);
  s.mark();
  CHECK_ERROR(s.alloc->deallocate_owned(*owned, "someone else"), Code::kPermissionDenied,
              "the block's owner is 'me', not 'someone else'");
  CHECK_ERROR(s.alloc->deallocate_owned(s.live, "me"), Code::kPermissionDenied,
              "the block's owner is '', not 'me'");
  CHECK(s.alloc->block_info(*owned)->state == BlockState::kAllocated);
  s.unchanged();
  REQUIRE_OK(s.alloc->deallocate_owned(*owned, "me"));
}

TEST_CASE("errors: a free whose stream event cannot be recorded leaves the block allocated",
          "[errors][alloc][streams]") {
  auto faulty = std::make_shared<Faulty>(host_runtime());
  auto alloc = make_allocator(faulty);
  auto tracker = CaptureTracker::create(*alloc);
  REQUIRE_OK(tracker);
  const StreamHandle side = *faulty->create_stream(0);
  const StreamHandle other = *faulty->create_stream(0);
  // A block allocated during a capture: the tracker hears of its free.
  REQUIRE_OK((*tracker)->begin_capture(0, side));
  auto p = alloc->allocate(4096, 0, side);
  REQUIRE_OK(p);
  auto done = (*tracker)->end_capture(side);
  REQUIRE_OK(done);
  REQUIRE_OK(alloc->record_stream(*p, other));
  const AllocatorStats before = *alloc->stats(0);

  faulty->fail_create_event = true;
  CHECK_ERROR(alloc->deallocate(*p), Code::kInternal,
              absl::StrCat("recording an event on stream ", hex(other), " failed"));
  CHECK_THAT(message_of(alloc->deallocate(*p)), Catch::Contains("; block left allocated"));
  CHECK(alloc->block_info(*p)->state == BlockState::kAllocated);
  CHECK(same_state(before, *alloc->stats(0)));
  REQUIRE_OK(alloc->CheckInvariants());
  // The tracker was not told of a free that did not happen: the block is
  // live in its history too.
  const auto chain = (*tracker)->reuse_chain(0, MemorySpan{*p, 4096});
  REQUIRE_FALSE(chain.empty());
  CHECK(chain.back().live);

  faulty->fail_create_event = false;
  REQUIRE_OK(alloc->deallocate(*p));  // the free can be retried
  REQUIRE_OK(faulty->synchronize_stream(other));
  REQUIRE_OK((*tracker)->destroy_graph(done->graph));
  REQUIRE_OK(alloc->CheckInvariants());
  tracker->reset();
  REQUIRE_OK(faulty->destroy_stream(other));
  REQUIRE_OK(faulty->destroy_stream(side));
}

TEST_CASE("errors: record_stream on an unknown, freed or interior pointer changes nothing",
          "[errors][alloc][streams]") {
  Scene s;
  int on_stack = 0;
  CHECK_ERROR(s.alloc->record_stream(&on_stack, s.side), Code::kNotFound,
              "record_stream(");
  CHECK_ERROR(s.alloc->record_stream(&on_stack, s.side), Code::kNotFound,
              "capalloc did not allocate this pointer");
  CHECK_ERROR(s.alloc->record_stream(s.freed, s.side), Code::kFailedPrecondition,
              "block is already free");
  CHECK_ERROR(s.alloc->record_stream(static_cast<char*>(s.live) + 256, s.side),
              Code::kInvalidArgument, "256 bytes into the allocated block");
  s.unchanged();
  // The live block was not marked as used on the side stream: its free is
  // immediate, not pending.
  REQUIRE_OK(s.alloc->deallocate(s.live));
  CHECK(s.alloc->block_info(s.live)->state == BlockState::kFree);
}

TEST_CASE("errors: record_stream with an unknown stream is INVALID_ARGUMENT and changes nothing",
          "[errors][alloc][streams]") {
  Scene s;
  const StreamHandle garbage = 0xdead0000;
  CHECK_ERROR(s.alloc->record_stream(s.live, garbage), Code::kInvalidArgument,
              absl::StrCat("record_stream: stream ", hex(garbage),
                           " is not a live stream of the host runtime"));
  s.unchanged();
  REQUIRE_OK(s.alloc->deallocate(s.live));
  CHECK(s.alloc->block_info(s.live)->state == BlockState::kFree);  // not pending on it
}

TEST_CASE("errors: empty_cache, stats, pool_stats and block_info refuse bad arguments",
          "[errors][alloc]") {
  Scene s;
  CHECK_ERROR(s.alloc->empty_cache(9), Code::kInvalidArgument,
              "device 9 does not exist: the host runtime has 1 device(s)");
  CHECK_ERROR(s.alloc->stats(9), Code::kInvalidArgument, "device 9 does not exist");
  CHECK_ERROR(s.alloc->stats(-1), Code::kInvalidArgument, "device -1 does not exist");
  CHECK_ERROR(s.alloc->pool_stats(kDefaultPool), Code::kInvalidArgument,
              "pool_stats: the default pool has no handle; use stats(device)");
  CHECK_ERROR(s.alloc->pool_stats(4242), Code::kNotFound, "graph pool 4242 does not exist");
  int on_stack = 0;
  CHECK_ERROR(s.alloc->block_info(&on_stack), Code::kNotFound,
              "capalloc did not allocate this pointer");
  // A failed empty_cache released nothing: the cached block is still there.
  s.unchanged();
  CHECK(s.alloc->stats(0)->free_blocks >= 1);
}

TEST_CASE("errors: empty_cache when the runtime refuses a release", "[errors][alloc]") {
  auto faulty = std::make_shared<Faulty>(host_runtime());
  auto alloc = make_allocator(faulty);
  auto p = alloc->allocate(4096);
  REQUIRE_OK(p);
  REQUIRE_OK(alloc->deallocate(*p));
  REQUIRE(alloc->stats(0)->reserved_bytes.current > 0);
  faulty->fail_release = true;
  CHECK_ERROR(alloc->empty_cache(), Code::kInternal, "release: injected driver failure");
  // The segment is no longer capalloc's (it is not retried); the allocator
  // stays consistent and serves the next request from a new segment.
  CHECK(alloc->stats(0)->reserved_bytes.current == 0);
  REQUIRE_OK(alloc->CheckInvariants());
  faulty->fail_release = false;
  auto q = alloc->allocate(4096);
  REQUIRE_OK(q);
  REQUIRE_OK(alloc->deallocate(*q));
  REQUIRE_OK(alloc->CheckInvariants());
}

TEST_CASE("errors: a second capture listener (a second CaptureTracker) is refused",
          "[errors][alloc][capture]") {
  Scene s;
  CHECK_ERROR(CaptureTracker::create(*s.alloc), Code::kAlreadyExists,
              "the allocator already has a capture listener (one CaptureTracker per allocator)");
  // The first tracker still hears of captures.
  REQUIRE_OK(s.tracker->begin_capture(0, s.side));
  auto p = s.alloc->allocate(4096, 0, s.side);
  REQUIRE_OK(p);
  auto done = s.tracker->end_capture(s.side);
  REQUIRE_OK(done);
  CHECK(s.tracker->write_record(done->graph)->capture != 0);
  REQUIRE_OK(s.alloc->deallocate(*p));
  REQUIRE_OK(s.tracker->destroy_graph(done->graph));
}

// --- Graph pools ---------------------------------------------------------------------

TEST_CASE("errors: graph pool calls on a pool that does not exist change nothing",
          "[errors][pool]") {
  Scene s;
  CHECK_ERROR(s.alloc->create_graph_pool(3), Code::kInvalidArgument, "device 3 does not exist");
  CHECK_ERROR(s.alloc->retain_graph_pool(4242), Code::kNotFound,
              "retain_graph_pool: graph pool 4242 does not exist (never created, or destroyed "
              "after its last reference and block were gone)");
  CHECK_ERROR(s.alloc->release_graph_pool(4242), Code::kNotFound,
              "release_graph_pool: graph pool 4242 does not exist");
  CHECK_ERROR(s.alloc->hold_graph_pool(4242, 7), Code::kNotFound,
              "hold_graph_pool: graph pool 4242 does not exist");
  CHECK_ERROR(s.alloc->drop_graph_pool_hold(4242, 7), Code::kNotFound,
              "graph pool 4242 does not exist");
  CHECK_ERROR(s.alloc->begin_allocate_to_pool(0, 7, 4242), Code::kNotFound,
              "begin_allocate_to_pool: graph pool 4242 does not exist");
  s.unchanged();
}

TEST_CASE("errors: a pool whose handles are all released refuses handle calls",
          "[errors][pool]") {
  Scene s;
  auto pool = s.alloc->create_graph_pool(0);
  REQUIRE_OK(pool);
  REQUIRE_OK(s.alloc->hold_graph_pool(*pool, 77));  // a graph's reference keeps it alive
  REQUIRE_OK(s.alloc->release_graph_pool(*pool));
  s.mark();
  const std::string every = absl::StrCat("every handle to graph pool ", *pool, " was released");
  CHECK_ERROR(s.alloc->release_graph_pool(*pool), Code::kFailedPrecondition,
              "release_graph_pool: " + every);
  CHECK_ERROR(s.alloc->retain_graph_pool(*pool), Code::kFailedPrecondition,
              "retain_graph_pool: " + every);
  CHECK_ERROR(s.alloc->hold_graph_pool(*pool, 78), Code::kFailedPrecondition,
              "hold_graph_pool: " + every);
  CHECK_ERROR(s.alloc->begin_allocate_to_pool(0, 78, *pool), Code::kFailedPrecondition,
              "begin_allocate_to_pool: " + every);
  CHECK_THAT(message_of(s.alloc->retain_graph_pool(*pool)), Catch::Contains("Create a new pool"));
  s.unchanged();
  REQUIRE_OK(s.alloc->pool_stats(*pool));  // still alive for its graph
  REQUIRE_OK(s.alloc->drop_graph_pool_hold(*pool, 77));
  CHECK(s.alloc->pool_stats(*pool).status().code() == Code::kNotFound);
}

TEST_CASE("errors: hold_graph_pool and drop_graph_pool_hold refuse what is not theirs",
          "[errors][pool]") {
  Scene s;
  auto pool = s.alloc->create_graph_pool(0);
  REQUIRE_OK(pool);
  REQUIRE_OK(s.alloc->hold_graph_pool(*pool, 77));
  s.mark();
  CHECK_ERROR(s.alloc->hold_graph_pool(*pool, 0), Code::kInvalidArgument,
              "hold_graph_pool: capture id 0");
  CHECK_ERROR(s.alloc->hold_graph_pool(*pool, 77), Code::kAlreadyExists,
              absl::StrCat("hold_graph_pool: the graph of capture 77 already holds graph pool ",
                           *pool));
  CHECK_ERROR(s.alloc->drop_graph_pool_hold(*pool, 78), Code::kNotFound,
              absl::StrCat("drop_graph_pool_hold: the graph of capture 78 holds no reference on "
                           "graph pool ",
                           *pool));
  s.unchanged();
  // Capture 77's one hold and the handle are still what keeps the pool.
  REQUIRE_OK(s.alloc->release_graph_pool(*pool));
  REQUIRE_OK(s.alloc->pool_stats(*pool));
  REQUIRE_OK(s.alloc->drop_graph_pool_hold(*pool, 77));
  CHECK(s.alloc->pool_stats(*pool).status().code() == Code::kNotFound);
}

TEST_CASE("errors: begin_allocate_to_pool refuses bad routes and changes nothing",
          "[errors][pool]") {
  Scene s(std::size_t{16} << 30, 2);
  auto pool = s.alloc->create_graph_pool(0);
  REQUIRE_OK(pool);
  REQUIRE_OK(s.alloc->begin_allocate_to_pool(0, 77, *pool));
  s.mark();
  CHECK_ERROR(s.alloc->begin_allocate_to_pool(5, 78, *pool), Code::kInvalidArgument,
              "device 5 does not exist");
  CHECK_ERROR(s.alloc->begin_allocate_to_pool(0, 0, *pool), Code::kInvalidArgument,
              "begin_allocate_to_pool: capture id 0");
  CHECK_ERROR(s.alloc->begin_allocate_to_pool(1, 78, *pool), Code::kInvalidArgument,
              absl::StrCat("begin_allocate_to_pool: graph pool ", *pool, " is on device 0, not 1"));
  CHECK_ERROR(s.alloc->begin_allocate_to_pool(0, 77, *pool), Code::kAlreadyExists,
              "begin_allocate_to_pool: capture 77 already allocates to a pool");
  s.unchanged();
  // One route, ended once.
  REQUIRE_OK(s.alloc->end_allocate_to_pool(77));
  REQUIRE_OK(s.alloc->release_graph_pool(*pool));
  CHECK(s.alloc->pool_stats(*pool).status().code() == Code::kNotFound);
}

TEST_CASE("errors: end_allocate_to_pool of a capture with no route changes nothing",
          "[errors][pool]") {
  Scene s;
  CHECK_ERROR(s.alloc->end_allocate_to_pool(4242), Code::kNotFound,
              "end_allocate_to_pool: capture 4242 has no pool route");
  s.unchanged();
}

TEST_CASE("errors: end_allocate_to_pool during its capture keeps the route and the capture",
          "[errors][pool][capture]") {
  Scene s;
  auto pool = s.alloc->create_graph_pool(0);
  REQUIRE_OK(pool);
  auto id = s.rt->begin_capture(s.side, CaptureMode::kGlobal);
  REQUIRE_OK(id);
  REQUIRE_OK(s.alloc->begin_allocate_to_pool(0, *id, *pool));
  auto p = s.alloc->allocate(4096, 0, s.side);
  REQUIRE_OK(p);
  CHECK_ERROR(s.alloc->end_allocate_to_pool(*id), Code::kFailedPrecondition,
              absl::StrCat("end_allocate_to_pool: capture ", *id, " is still active on stream ",
                           hex(s.side), "; end the capture first (the route stays)"));
  CHECK(s.rt->capture_info(s.side)->status == CaptureStatus::kActive);
  auto q = s.alloc->allocate(4096, 0, s.side);
  REQUIRE_OK(q);
  CHECK(s.alloc->block_info(*q)->pool == *pool);
  auto g = s.rt->end_capture(s.side);
  REQUIRE_OK(g);
  REQUIRE_OK(s.alloc->end_allocate_to_pool(*id));
  REQUIRE_OK(s.rt->destroy_graph(*g));
  REQUIRE_OK(s.alloc->deallocate(*p));
  REQUIRE_OK(s.alloc->deallocate(*q));
  REQUIRE_OK(s.alloc->release_graph_pool(*pool));
  REQUIRE_OK(s.alloc->CheckInvariants());
}

// --- Captures and the tracker ----------------------------------------------------------

TEST_CASE("errors: CaptureTracker::create over a runtime without the graph seam",
          "[errors][capture]") {
  auto memory_only = std::make_shared<MemoryOnly>(host_runtime());
  auto created = Allocator::create(memory_only);
  REQUIRE_OK(created);
  auto alloc = *std::move(created);
  CHECK_ERROR(CaptureTracker::create(*alloc), Code::kFailedPrecondition,
              "CaptureTracker::create: the allocator's host runtime has no graph and launch seam");
  // No listener was left registered: a tracker over a full runtime is still
  // refused only for the seam, and the allocator works.
  auto p = alloc->allocate(4096);
  REQUIRE_OK(p);
  REQUIRE_OK(alloc->deallocate(*p));
  REQUIRE_OK(alloc->CheckInvariants());
}

TEST_CASE("errors: begin_capture refusals leave no capture and no pool behind",
          "[errors][capture]") {
  Scene s(std::size_t{16} << 30, 2);
  const StreamHandle on_device_1 = *s.rt->create_stream(1);
  SECTION("the default stream") {
    CHECK_ERROR(s.tracker->begin_capture(0, kDefaultStream), Code::kInvalidArgument,
                "begin_capture: the default (legacy) stream cannot be captured");
  }
  SECTION("an unknown device") {
    CHECK_ERROR(s.tracker->begin_capture(7, s.side), Code::kInvalidArgument,
                "device 7 does not exist");
  }
  SECTION("a pool that does not exist") {
    CHECK_ERROR(s.tracker->begin_capture(0, s.side, {.pool = 4242}), Code::kNotFound,
                "retain_graph_pool: graph pool 4242 does not exist");
  }
  SECTION("a pool on another device") {
    auto pool = s.alloc->create_graph_pool(0);
    REQUIRE_OK(pool);
    s.mark();
    CHECK_ERROR(s.tracker->begin_capture(1, on_device_1, {.pool = *pool}),
                Code::kInvalidArgument,
                absl::StrCat("graph pool ", *pool, " is on device 0, not 1"));
    CHECK(s.rt->capture_info(on_device_1)->status == CaptureStatus::kNone);
    s.unchanged();
    REQUIRE_OK(s.alloc->release_graph_pool(*pool));
    s.mark();
  }
  CHECK(s.rt->capture_info(s.side)->status == CaptureStatus::kNone);
  CHECK_FALSE(s.tracker->end_capture(s.side).ok());
  s.unchanged();
  REQUIRE_OK(s.rt->destroy_stream(on_device_1));
}

TEST_CASE("errors: begin_capture on a stream already capturing keeps the first capture",
          "[errors][capture]") {
  Scene s;
  auto first = s.tracker->begin_capture(0, s.side);
  REQUIRE_OK(first);
  s.mark();
  CHECK_ERROR(s.tracker->begin_capture(0, s.side), Code::kFailedPrecondition,
              absl::StrCat("is already part of capture ", *first));
  s.unchanged();
  auto info = s.rt->capture_info(s.side);
  CHECK(info->status == CaptureStatus::kActive);
  CHECK(info->id == *first);
  auto done = s.tracker->end_capture(s.side);
  REQUIRE_OK(done);
  REQUIRE_OK(s.tracker->destroy_graph(done->graph));
  CHECK(graph_pools(*s.alloc) == 0);
}

TEST_CASE("errors: end_capture on a stream the tracker did not begin changes nothing",
          "[errors][capture]") {
  Scene s;
  CHECK_ERROR(s.tracker->end_capture(s.side), Code::kFailedPrecondition,
              absl::StrCat("end_capture: stream ", hex(s.side),
                           " has no capture begun through this tracker"));
  // A capture begun natively is not the tracker's to end.
  auto id = s.rt->begin_capture(s.side, CaptureMode::kGlobal);
  REQUIRE_OK(id);
  s.mark();
  CHECK_ERROR(s.tracker->end_capture(s.side), Code::kFailedPrecondition,
              "has no capture begun through this tracker");
  CHECK(s.rt->capture_info(s.side)->status == CaptureStatus::kActive);
  s.unchanged();
  auto g = s.rt->end_capture(s.side);
  REQUIRE_OK(g);
  REQUIRE_OK(s.rt->destroy_graph(*g));
}

TEST_CASE("errors: end_capture of an unjoined capture ends it and keeps its blocks",
          "[errors][capture]") {
  Scene s;
  const StreamHandle fork_stream = *s.rt->create_stream(0);
  auto fork = s.rt->create_event(0);
  REQUIRE_OK(fork);
  auto id = s.tracker->begin_capture(0, s.side, {.label = "unjoined"});
  REQUIRE_OK(id);
  auto p = s.alloc->allocate(4096, 0, s.side);
  REQUIRE_OK(p);
  REQUIRE_OK(s.rt->record_event(*fork, s.side));
  REQUIRE_OK(s.rt->stream_wait_event(fork_stream, *fork));
  REQUIRE_OK(s.rt->launch_kernel(fork_stream, write_kernel(*p, 4096, 1)));
  auto ended = s.tracker->end_capture(s.side);
  CHECK_ERROR(ended, Code::kFailedPrecondition,
              absl::StrCat("end_capture: capture ", *id, " is unjoined"));
  // The capture is over on both streams; its block stays live in its pool.
  CHECK(s.rt->capture_info(s.side)->status == CaptureStatus::kNone);
  CHECK(s.rt->capture_info(fork_stream)->status == CaptureStatus::kNone);
  const BlockInfo info = *s.alloc->block_info(*p);
  CHECK(info.state == BlockState::kAllocated);
  CHECK(info.capture == *id);
  REQUIRE_OK(s.alloc->CheckInvariants());
  REQUIRE_OK(s.alloc->deallocate(*p));
  CHECK(graph_pools(*s.alloc) == 0);  // the private pool went with its last block
  REQUIRE_OK(s.rt->destroy_event(*fork));
  REQUIRE_OK(s.rt->destroy_stream(fork_stream));
}

TEST_CASE("errors: replay, check_graph and write_record of a graph the tracker does not hold",
          "[errors][capture]") {
  Scene s;
  const std::string unknown =
      "graph 4242 is unknown to this tracker (not captured through it, or destroyed)";
  CHECK_ERROR(s.tracker->replay(4242, s.side), Code::kNotFound, unknown);
  CHECK_ERROR(s.tracker->check_graph(4242), Code::kNotFound, unknown);
  CHECK_ERROR(s.tracker->write_record(4242), Code::kNotFound, unknown);
  s.unchanged();
}

TEST_CASE("errors: a replay the runtime refuses returns the runtime's error",
          "[errors][capture]") {
  Scene s;
  REQUIRE_OK(s.tracker->begin_capture(0, s.side));
  auto done = s.tracker->end_capture(s.side);
  REQUIRE_OK(done);
  s.mark();
  const StreamHandle unknown = 4242;
  CHECK_ERROR(s.tracker->replay(done->graph, unknown), Code::kNotFound,
              "launch_graph: stream 4242 not found (never created or already destroyed)");
  s.unchanged();
  REQUIRE_OK(s.tracker->write_record(done->graph));  // still held, still replayable
  REQUIRE_OK(s.tracker->replay(done->graph, s.side));
  REQUIRE_OK(s.rt->synchronize_stream(s.side));
  REQUIRE_OK(s.tracker->destroy_graph(done->graph));
}

TEST_CASE("errors: the strict replay guard refuses before launching", "[errors][capture][strict]") {
  TrackerOptions strict;
  strict.strict = true;
  Scene s(std::size_t{16} << 30, 1, strict);
  constexpr std::size_t kBytes = 1 << 16;
  // Seed 003 arm A: T written in the capture, freed, WS allocated where T was
  // and left live: the graph's replay writes WS through T.
  REQUIRE_OK(s.tracker->begin_capture(0, s.side, {.label = "armA"}));
  auto t = s.alloc->allocate(kBytes, 0, s.side, {.tag = "T"});
  REQUIRE_OK(t);
  REQUIRE_OK(s.rt->launch_kernel(s.side, write_kernel(*t, kBytes, 0x11)));
  REQUIRE_OK(s.alloc->deallocate(*t));
  auto ws = s.alloc->allocate(kBytes, 0, s.side, {.tag = "WS"});
  REQUIRE_OK(ws);
  REQUIRE(*ws == *t);
  auto done = s.tracker->end_capture(s.side);
  REQUIRE_OK(done);
  REQUIRE_FALSE(done->new_findings.empty());
  std::memset(*ws, 0x22, kBytes);
  CHECK_ERROR(s.tracker->replay(done->graph, s.side), Code::kFailedPrecondition,
              absl::StrCat("replay of graph ", done->graph,
                           " refused (strict mode): it would clobber live blocks:"));
  REQUIRE_OK(s.rt->synchronize_stream(s.side));
  CHECK(static_cast<unsigned char*>(*ws)[0] == 0x22);  // nothing ran
  REQUIRE_OK(s.tracker->write_record(done->graph));
  REQUIRE_OK(s.alloc->deallocate(*ws));
  REQUIRE_OK(s.tracker->destroy_graph(done->graph));
}

TEST_CASE("errors: waive refuses an empty reason, no victim, an unknown graph or a dead block",
          "[errors][capture][waive]") {
  Scene s;
  REQUIRE_OK(s.tracker->begin_capture(0, s.side));
  auto done = s.tracker->end_capture(s.side);
  REQUIRE_OK(done);
  const GraphHandle g = done->graph;
  CHECK_ERROR(s.tracker->waive(g, s.live, "", ""), Code::kInvalidArgument,
              "waive: give the reason the finding is benign");
  CHECK_ERROR(s.tracker->waive(g, nullptr, "", "benign"), Code::kInvalidArgument,
              "waive: name the victim by a pointer into it or by its tag");
  CHECK_ERROR(s.tracker->waive(g + 4242, s.live, "", "benign"), Code::kNotFound,
              absl::StrCat("waive: graph ", g + 4242, " is unknown to this tracker"));
  int on_stack = 0;
  CHECK_ERROR(s.tracker->waive(g, &on_stack, "", "benign"), Code::kNotFound, "is in no live block");
  // A pointer into memory that is free (a block freed, cached) is no victim either.
  CHECK_ERROR(s.tracker->waive(g, s.freed, "", "benign"), Code::kNotFound, "is in no live block");
  // Nothing was recorded: the snapshot lists no waiver.
  CHECK_THAT(s.tracker->snapshot_json(), !Catch::Contains("benign"));
  REQUIRE_OK(s.tracker->destroy_graph(g));
}

TEST_CASE("errors: illegal work on a capturing stream invalidates the capture, as on CUDA",
          "[errors][capture][runtime]") {
  Scene s;
  auto id = s.tracker->begin_capture(0, s.side, {.label = "spoiled"});
  REQUIRE_OK(id);
  auto p = s.alloc->allocate(4096, 0, s.side);
  REQUIRE_OK(p);
  CHECK_ERROR(s.rt->synchronize_stream(s.side), Code::kFailedPrecondition,
              absl::StrFormat("synchronize_stream(stream %d) is illegal during stream capture", s.side));
  CHECK_THAT(message_of(s.rt->synchronize_stream(s.side)),
             Catch::Contains(absl::StrCat("capture ", *id, " is invalidated")));
  CHECK(s.rt->capture_info(s.side)->status == CaptureStatus::kInvalidated);
  // Later work on the stream is refused, naming the first cause.
  CHECK_ERROR(s.rt->launch_kernel(s.side, write_kernel(*p, 4096, 1)), Code::kFailedPrecondition,
              absl::StrCat("which was invalidated by synchronize_stream"));
  auto ended = s.tracker->end_capture(s.side);
  CHECK_ERROR(ended, Code::kFailedPrecondition,
              absl::StrCat("end_capture: capture ", *id, " was invalidated by synchronize_stream"));
  CHECK(s.rt->capture_info(s.side)->status == CaptureStatus::kNone);
  CHECK(s.alloc->block_info(*p)->state == BlockState::kAllocated);
  REQUIRE_OK(s.alloc->deallocate(*p));
  REQUIRE_OK(s.alloc->CheckInvariants());
}

// --- Persistent buffers ----------------------------------------------------------------

TEST_CASE("errors: PersistentCache refuses an empty key, zero bytes and growing a key",
          "[errors][persistent]") {
  Scene s;
  PersistentCache cache(*s.alloc);
  auto kv = cache.preallocate(0, "kv", 1 << 16);
  REQUIRE_OK(kv);
  s.mark();
  CHECK_ERROR(cache.preallocate(0, "", 64), Code::kInvalidArgument, "preallocate: empty key");
  CHECK_ERROR(cache.preallocate(0, "z", 0), Code::kInvalidArgument,
              "preallocate(0, \"z\"): zero bytes");
  CHECK_ERROR(cache.preallocate(0, "kv", 1 << 17), Code::kFailedPrecondition,
              "preallocate(0, \"kv\", 131072): the key already holds 65536 bytes; growing it "
              "would move a buffer that captured graphs may point at");
  s.unchanged();
  CHECK(*cache.get(0, "kv") == *kv);
  CHECK(cache.entries().size() == 1);
  REQUIRE_OK(cache.release(0, "kv"));
}

TEST_CASE("errors: PersistentCache get of a cold key and release of an unknown key",
          "[errors][persistent]") {
  Scene s;
  PersistentCache cache(*s.alloc);
  CHECK_ERROR(cache.get(0, "cold"), Code::kNotFound,
              "persistent buffer \"cold\" on device 0 was never preallocated; call "
              "PersistentCache::preallocate(0, \"cold\", bytes) during warmup");
  CHECK_ERROR(cache.release(0, "cold"), Code::kNotFound,
              "release: no persistent buffer \"cold\" on device 0");
  s.unchanged();
  CHECK(cache.entries().empty());
}

TEST_CASE("errors: PersistentCache preallocate during a capture names the key and the fix",
          "[errors][persistent][capture]") {
  Scene s;
  PersistentCache cache(*s.alloc);
  auto id = s.tracker->begin_capture(0, s.side);
  REQUIRE_OK(id);
  s.mark();
  CHECK_ERROR(cache.preallocate(0, "late", 4096), Code::kFailedPrecondition,
              "persistent allocation 'late' (4.00 KiB on device 0) refused");
  CHECK_THAT(message_of(cache.preallocate(0, "late", 4096)),
             Catch::Contains("PersistentCache::preallocate(0, \"late\", 4096)"));
  s.unchanged();
  CHECK(cache.entries().empty());
  CHECK(s.rt->capture_info(s.side)->status == CaptureStatus::kActive);  // the capture goes on
  auto done = s.tracker->end_capture(s.side);
  REQUIRE_OK(done);
  REQUIRE_OK(s.tracker->destroy_graph(done->graph));
}

// --- The GEMM ------------------------------------------------------------------------------

TEST_CASE("errors: SplitKGemm over a runtime that cannot launch, and its cold buffers",
          "[errors][gemm]") {
  auto memory_only = std::make_shared<MemoryOnly>(host_runtime());
  auto created = Allocator::create(memory_only);
  REQUIRE_OK(created);
  auto alloc = *std::move(created);
  PersistentCache cache(*alloc);
  SplitKGemm gemm(*alloc, cache);
  float dummy[4] = {};
  const GemmProblem problem{.m = 16, .n = 64, .k = 256, .a = dummy, .b = dummy, .c = dummy};
  const std::string seam = "split-K GEMM: the allocator's runtime cannot launch kernels (a "
                           "MemoryRuntime only)";
  CHECK_ERROR(gemm.preallocate_split_k(0), Code::kFailedPrecondition, seam);
  CHECK_ERROR(gemm.run(0, kDefaultStream, problem), Code::kFailedPrecondition, seam);
  CHECK_ERROR(gemm.buffers(0), Code::kNotFound,
              "the split-K workspace and semaphore of device 0 are not preallocated; call "
              "SplitKGemm::preallocate_split_k(0) during warmup");
  CHECK(alloc->stats(0)->allocations == 0);
  CHECK(cache.entries().empty());
}

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
  options.replay_order = [](const std::vector<std::vector<std::size_t>>& deps) {
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

struct CliRun {
  int exit_code = -1;
  std::string err;
};

// Runs the CLI with `args`, its environment this one's minus CAPALLOC_*
// plus `env`; returns its exit status and stderr.
CliRun run_cli(const std::vector<std::string>& args,
               const std::vector<std::pair<std::string, std::string>>& env) {
  std::vector<std::string> env_strings;
  for (char** e = environ; *e != nullptr; ++e) {
    if (std::strncmp(*e, "CAPALLOC_", 9) != 0) env_strings.emplace_back(*e);
  }
  for (const auto& [name, value] : env) env_strings.push_back(name + "=" + value);
  std::vector<char*> envp;
  for (std::string& s : env_strings) envp.push_back(s.data());
  envp.push_back(nullptr);
  std::vector<std::string> argv_strings = {CAPALLOC_CLI_PATH};
  argv_strings.insert(argv_strings.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& s : argv_strings) argv.push_back(s.data());
  argv.push_back(nullptr);
  char err_path[] = "/tmp/capalloc_errors_doc_err_XXXXXX";
  const int err_fd = ::mkstemp(err_path);
  REQUIRE(err_fd >= 0);
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    const int null_fd = ::open("/dev/null", O_WRONLY);
    ::dup2(null_fd, STDOUT_FILENO);
    ::dup2(err_fd, STDERR_FILENO);
    ::execve(argv[0], argv.data(), envp.data());
    ::_exit(127);
  }
  ::close(err_fd);
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  CliRun r;
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  std::ifstream in(err_path);
  std::stringstream text;
  text << in.rdbuf();
  r.err = text.str();
  ::unlink(err_path);
  return r;
}

}  // namespace

TEST_CASE("errors: the CLI exits 1 when the runtime it is told to use is unavailable",
          "[errors][cli]") {
  const CliRun r = run_cli({"describe", "--runtime", "cuda"},
                           {{"CAPALLOC_BACKEND_PATH", scratch_dir("empty")}});
  INFO(r.err);
  CHECK(r.exit_code == 1);
  CHECK_THAT(r.err, Catch::StartsWith("capalloc: UNAVAILABLE: runtime 'cuda': "));
}
#endif
