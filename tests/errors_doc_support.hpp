// tests/errors_doc_support.hpp: what the errors_doc_test files share (the
// checks of docs/errors.md's rows): the code-and-message checks, a host
// runtime whose faults a test switches on, a scene with an allocator, a
// tracker and a cache, and helpers to run a case in a fresh process.
#ifndef CAPALLOC_TESTS_ERRORS_DOC_SUPPORT_HPP_
#define CAPALLOC_TESTS_ERRORS_DOC_SUPPORT_HPP_

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
#include "forwarding_runtime.hpp"
#include "test_support.hpp"

extern char** environ;

using namespace capalloc;
using capalloc::testing::host_runtime;
using capalloc::testing::make_allocator;
using capalloc::testing::same_state;
using Code = absl::StatusCode;

namespace capalloc::errors_doc {

inline std::string message_of(const absl::Status& s) { return std::string(s.message()); }
template <typename T>
inline std::string message_of(const absl::StatusOr<T>& s) {
  return std::string(s.status().message());
}
template <typename T>
inline absl::Status status_of(const absl::StatusOr<T>& s) {
  return s.status();
}
inline absl::Status status_of(const absl::Status& s) { return s; }

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

inline std::string hex(std::uintptr_t v) { return absl::StrFormat("0x%x", v); }

// How many graph pools the allocator holds (describe() lists each).
inline int graph_pools(const Allocator& a) {
  const std::string d = a.describe();
  int n = 0;
  for (std::size_t at = d.find("  graph pool "); at != std::string::npos;
       at = d.find("  graph pool ", at + 1)) {
    ++n;
  }
  return n;
}

// A kernel that waits for `gate` and reads `span`.
inline KernelLaunch gate_kernel(const capalloc::testing::Gate& gate, const void* p, std::size_t bytes) {
  return gate.kernel(p, bytes);
}

inline KernelLaunch write_kernel(void* p, std::size_t bytes, int value) {
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
class Forwarding : public capalloc::testing::ForwardingRuntime<Base> {
 public:
  using capalloc::testing::ForwardingRuntime<Base>::ForwardingRuntime;
  int devices = -1;  // -1: the inner runtime's count
  std::atomic<bool> fail_create_event{false};
  std::atomic<bool> fail_release{false};

  int device_count() const override { return devices >= 0 ? devices : this->in_->device_count(); }
  absl::Status release(int d, void* p, std::size_t b) override {
    if (fail_release) return absl::InternalError("release: injected driver failure");
    return this->in_->release(d, p, b);
  }
  // false: destroyed streams are never reported (a CUDA application that
  // destroys a stream natively, behind capalloc). Set before the allocator
  // is created.
  bool report_destroyed = true;
  void watch_stream_destruction(std::function<bool(StreamHandle)> f) override {
    if (report_destroyed) this->in_->watch_stream_destruction(std::move(f));
  }
  absl::StatusOr<EventHandle> create_event(int d) override {
    if (fail_create_event) return absl::InternalError("create_event: injected driver failure");
    return this->in_->create_event(d);
  }
  // Called with the stream before each record_event is forwarded: a test
  // destroys the stream there, as another thread could at that moment.
  std::function<void(StreamHandle)> before_record_event;
  absl::Status record_event(EventHandle e, StreamHandle s) override {
    if (before_record_event) before_record_event(s);
    return this->in_->record_event(e, s);
  }
  absl::Status watch_capture_graph(StreamHandle s, std::function<void()> f) override {
    return this->in_->watch_capture_graph(s, std::move(f));
  }
};

// The memory seam only: no launches, no captures.
class MemoryOnly final : public Forwarding<MemoryRuntime> {
 public:
  using Forwarding::Forwarding;
};

class Faulty final : public Forwarding<DeviceRuntime> {
 public:
  using Forwarding::Forwarding;
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
inline std::string in_fresh_process(const std::string& name,
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
inline void report_result(const std::string& out) {
  const char* path = std::getenv("ERRORS_DOC_RESULT");
  REQUIRE(path != nullptr);
  std::ofstream(path) << out;
}

inline void use_host_runtime() { ::setenv("CAPALLOC_RUNTIME", "host", 1); }

inline capalloc_stats c_stats() {
  capalloc_stats s{};
  REQUIRE(capalloc_get_stats(0, &s) == CAPALLOC_OK);
  return s;
}

inline bool same_c_stats(const capalloc_stats& a, const capalloc_stats& b) {
  return a.allocated_bytes == b.allocated_bytes && a.reserved_bytes == b.reserved_bytes &&
         a.segments == b.segments && a.allocated_blocks == b.allocated_blocks &&
         a.free_blocks == b.free_blocks && a.allocations == b.allocations &&
         a.frees == b.frees;
}

inline std::string scratch_dir(const std::string& name) {
  const auto dir = std::filesystem::temp_directory_path() / ("capalloc_errors_doc_" + name);
  std::filesystem::create_directories(dir);
  return dir.string();
}

}  // namespace capalloc::errors_doc

// The four errors_doc_*_test.cpp files use the names above unqualified.
using namespace capalloc::errors_doc;

#endif  // CAPALLOC_TESTS_ERRORS_DOC_SUPPORT_HPP_
