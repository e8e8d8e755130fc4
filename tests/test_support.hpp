// tests/test_support.hpp: helpers shared by the Catch2 suites.
#ifndef CAPALLOC_TESTS_TEST_SUPPORT_HPP_
#define CAPALLOC_TESTS_TEST_SUPPORT_HPP_

#include <catch2/catch.hpp>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <future>
#include <memory>
#include <string>
#include <thread>

#include "capalloc/allocator.hpp"
#include "capalloc/runtime.hpp"

// Requires an absl::Status (or StatusOr) to be OK, printing the message if not.
#define REQUIRE_OK(expr)                                          \
  do {                                                            \
    const auto& capalloc_status_ = (expr);                        \
    INFO(::capalloc::testing::status_of(capalloc_status_));       \
    REQUIRE(::capalloc::testing::is_ok(capalloc_status_));        \
  } while (0)

#define CHECK_OK(expr)                                            \
  do {                                                            \
    const auto& capalloc_status_ = (expr);                        \
    INFO(::capalloc::testing::status_of(capalloc_status_));       \
    CHECK(::capalloc::testing::is_ok(capalloc_status_));          \
  } while (0)

namespace capalloc::testing {

inline bool is_ok(const absl::Status& s) { return s.ok(); }
template <typename T>
bool is_ok(const absl::StatusOr<T>& s) {
  return s.ok();
}
inline std::string status_of(const absl::Status& s) { return s.ToString(); }
template <typename T>
std::string status_of(const absl::StatusOr<T>& s) {
  return s.status().ToString();
}

inline std::shared_ptr<DeviceRuntime> host_runtime(std::size_t limit = std::size_t{16} << 30,
                                                   int devices = 1) {
  HostRuntimeOptions options;
  options.memory_limit_per_device = limit;
  options.device_count = devices;
  auto rt = make_host_runtime(options);
  REQUIRE(rt.ok());
  return *rt;
}

inline std::unique_ptr<Allocator> make_allocator(std::shared_ptr<DeviceRuntime> rt,
                                                 AllocatorOptions options = {}) {
  auto a = Allocator::create(std::move(rt), options);
  REQUIRE(a.ok());
  return *std::move(a);
}

// A kernel that sleeps, then writes `value` over [p, p + bytes): work a
// stream still has queued when the host moves on.
inline KernelLaunch slow_fill(void* p, std::size_t bytes, int value,
                              std::chrono::milliseconds delay = std::chrono::milliseconds(50)) {
  KernelLaunch k;
  k.name = "slow_fill";
  k.writes = {MemorySpan{p, bytes}};
  k.host_body = [p, bytes, value, delay] {
    std::this_thread::sleep_for(delay);
    std::memset(p, value, bytes);
  };
  return k;
}

// Whether [a, a + an) and [b, b + bn) share a byte.
inline bool overlaps(const void* a, std::size_t an, const void* b, std::size_t bn) {
  const auto x = reinterpret_cast<std::uintptr_t>(a), y = reinterpret_cast<std::uintptr_t>(b);
  return x < y + bn && y < x + an;
}

// Writes a cookie derived from `seed` over the first `bytes` (up to 256) of p.
inline void write_cookie(void* p, std::size_t bytes, std::uint64_t seed) {
  auto* words = static_cast<std::uint64_t*>(p);
  const std::size_t n = std::min<std::size_t>(bytes, 256) / sizeof(std::uint64_t);
  for (std::size_t i = 0; i < n; ++i) words[i] = seed * 0x9E3779B97F4A7C15ull + i;
  if (n == 0) std::memset(p, static_cast<int>(seed & 0xff), bytes);
}

inline bool cookie_intact(const void* p, std::size_t bytes, std::uint64_t seed) {
  const auto* words = static_cast<const std::uint64_t*>(p);
  const std::size_t n = std::min<std::size_t>(bytes, 256) / sizeof(std::uint64_t);
  for (std::size_t i = 0; i < n; ++i)
    if (words[i] != seed * 0x9E3779B97F4A7C15ull + i) return false;
  if (n == 0) {
    const auto* b = static_cast<const unsigned char*>(p);
    for (std::size_t i = 0; i < bytes; ++i)
      if (b[i] != static_cast<unsigned char>(seed & 0xff)) return false;
  }
  return true;
}

// Holds a stream's queue until opened: kernel() is a launch that reads
// [reads, reads + bytes) and waits for open(). Declare it after what the held
// work touches (the runtime, a World): its destructor opens it, so the stream
// drains before they are torn down even when an assertion fails.
class Gate {
 public:
  ~Gate() { open(); }
  void open() {
    if (!opened_) {
      opened_ = true;
      promise_.set_value();
    }
  }
  KernelLaunch kernel(const void* reads, std::size_t bytes) const {
    KernelLaunch k;
    k.name = "gate";
    k.reads = {{reads, bytes}};
    k.host_body = [f = future_] { f.wait(); };
    return k;
  }

 private:
  std::promise<void> promise_;
  std::shared_future<void> future_ = promise_.get_future().share();
  bool opened_ = false;
};

// Stats that must not move when a call fails.
inline bool same_state(const AllocatorStats& a, const AllocatorStats& b) {
  return a.allocated_bytes.current == b.allocated_bytes.current &&
         a.requested_bytes.current == b.requested_bytes.current &&
         a.reserved_bytes.current == b.reserved_bytes.current &&
         a.segments.current == b.segments.current &&
         a.allocated_blocks.current == b.allocated_blocks.current &&
         a.free_blocks == b.free_blocks && a.pending_free_blocks == b.pending_free_blocks &&
         a.allocations == b.allocations && a.frees == b.frees;
}

}  // namespace capalloc::testing

#endif  // CAPALLOC_TESTS_TEST_SUPPORT_HPP_
