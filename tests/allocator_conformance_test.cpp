// One conformance suite run over every runtime that works on this machine
// (the host runtime always; GPU runtimes where a device is present), in the
// manner of RMM's mr_ref tests: sizes, alignment, non-overlap, invariants,
// and many threads.
#include <algorithm>
#include <atomic>
#include <random>
#include <mutex>
#include <thread>
#include <vector>

#include "test_support.hpp"

using namespace capalloc;
using capalloc::testing::host_runtime;
using capalloc::testing::make_allocator;

namespace {

// Every runtime this machine can run, by name.
std::vector<std::string> conformance_runtimes() {
  std::vector<std::string> names = {"host"};
  for (const char* gpu : {"cuda", "hip"}) {
    auto rt = make_runtime(gpu);
    if (rt.ok() && (*rt)->device_count() > 0) names.push_back(gpu);
  }
  return names;
}

std::shared_ptr<DeviceRuntime> runtime_named(const std::string& name) {
  if (name == "host") return host_runtime();
  auto rt = make_runtime(name);
  REQUIRE(rt.ok());
  return *rt;
}

}  // namespace

TEST_CASE("conformance: sizes from 1 B to 1 GiB, and the errors around them", "[conformance]") {
  const std::string name = GENERATE(from_range(conformance_runtimes()));
  INFO("runtime " << name);
  auto alloc = make_allocator(runtime_named(name));

  SECTION("size 0 is an error, not a block") {
    auto p = alloc->allocate(0);
    REQUIRE_FALSE(p.ok());
    CHECK(p.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK(alloc->stats(0)->allocations == 0);
  }
  SECTION("1 B, 1 KiB, 1 MiB and 1 GiB are served and usable end to end") {
    for (std::size_t size : {std::size_t{1}, std::size_t{1} << 10, std::size_t{1} << 20,
                             std::size_t{1} << 30}) {
      auto p = alloc->allocate(size);
      REQUIRE_OK(p);
      auto info = alloc->block_info(*p);
      REQUIRE_OK(info);
      CHECK(info->requested == size);
      CHECK(info->size >= size);
      CHECK(info->size % 512 == 0);
      if (name == "host") {
        // Touch the first and the last byte: the block is real memory.
        static_cast<unsigned char*>(*p)[0] = 0xAB;
        static_cast<unsigned char*>(*p)[size - 1] = 0xCD;
      }
      REQUIRE_OK(alloc->deallocate(*p));
      REQUIRE_OK(alloc->CheckInvariants());
    }
    CHECK(alloc->stats(0)->allocated_bytes.current == 0);
  }
  SECTION("1 PiB is a clean out-of-memory error that changes nothing") {
    auto keep = alloc->allocate(4096);
    REQUIRE_OK(keep);
    const auto before = *alloc->stats(0);
    auto p = alloc->allocate(std::size_t{1} << 50);
    REQUIRE_FALSE(p.ok());
    CHECK(p.status().code() == absl::StatusCode::kResourceExhausted);
    CHECK_THAT(std::string(p.status().message()), Catch::Contains("out of memory"));
    CHECK_THAT(std::string(p.status().message()), Catch::Contains("1.00 PiB"));
    const auto after = *alloc->stats(0);
    CHECK(capalloc::testing::same_state(before, after));
    CHECK(after.ooms == before.ooms + 1);
    REQUIRE_OK(alloc->CheckInvariants());
    REQUIRE_OK(alloc->deallocate(*keep));
  }
  SECTION("a size that overflows rounding is an invalid argument") {
    auto p = alloc->allocate(~std::size_t{0});
    REQUIRE_FALSE(p.ok());
    CHECK(p.status().code() == absl::StatusCode::kInvalidArgument);
  }
}

TEST_CASE("conformance: 1 GiB on a runtime limited below that is a clean OOM", "[conformance]") {
  auto alloc = make_allocator(host_runtime(std::size_t{256} << 20));
  auto p = alloc->allocate(std::size_t{1} << 30);
  REQUIRE_FALSE(p.ok());
  CHECK(p.status().code() == absl::StatusCode::kResourceExhausted);
  const std::string message(p.status().message());
  CHECK_THAT(message, Catch::Contains("requested 1.00 GiB"));
  CHECK_THAT(message, Catch::Contains("device 0"));
  CHECK_THAT(message, Catch::Contains("reserved"));
  CHECK(alloc->stats(0)->ooms == 1);
  CHECK(alloc->stats(0)->reserved_bytes.current == 0);
  REQUIRE_OK(alloc->CheckInvariants());
}

TEST_CASE("conformance: blocks are aligned to 256 B and to the granularity", "[conformance]") {
  const std::string name = GENERATE(from_range(conformance_runtimes()));
  const std::size_t granularity = GENERATE(std::size_t{256}, std::size_t{512}, std::size_t{4096});
  AllocatorOptions options;
  options.round_granularity = granularity;
  auto alloc = make_allocator(runtime_named(name), options);
  std::mt19937_64 rng(7);
  std::vector<void*> live;
  for (int i = 0; i < 500; ++i) {
    const std::size_t size = 1 + rng() % (3 << 20);
    auto p = alloc->allocate(size);
    REQUIRE_OK(p);
    const auto addr = reinterpret_cast<std::uintptr_t>(*p);
    CHECK(addr % 256 == 0);
    CHECK(addr % granularity == 0);
    CHECK(alloc->block_info(*p)->size % granularity == 0);
    live.push_back(*p);
  }
  for (void* p : live) REQUIRE_OK(alloc->deallocate(p));
  REQUIRE_OK(alloc->CheckInvariants());
}

TEST_CASE("conformance: distinct live blocks never overlap", "[conformance]") {
  const std::string name = GENERATE(from_range(conformance_runtimes()));
  auto alloc = make_allocator(runtime_named(name));
  std::mt19937_64 rng(11);
  struct Live {
    std::uintptr_t addr;
    std::size_t size;
  };
  std::vector<Live> live;
  for (int round = 0; round < 4; ++round) {
    for (int i = 0; i < 400; ++i) {
      const std::size_t size = (rng() % 8 == 0) ? 1 + rng() % (12 << 20) : 1 + rng() % 8192;
      auto p = alloc->allocate(size);
      REQUIRE_OK(p);
      live.push_back({reinterpret_cast<std::uintptr_t>(*p), size});
    }
    std::sort(live.begin(), live.end(), [](auto& a, auto& b) { return a.addr < b.addr; });
    for (std::size_t i = 1; i < live.size(); ++i) {
      REQUIRE(live[i - 1].addr + live[i - 1].size <= live[i].addr);
    }
    // Free every other block so the next round reuses and splits free space.
    std::vector<Live> kept;
    for (std::size_t i = 0; i < live.size(); ++i) {
      if (i % 2 == 0) {
        REQUIRE_OK(alloc->deallocate(reinterpret_cast<void*>(live[i].addr)));
      } else {
        kept.push_back(live[i]);
      }
    }
    live = kept;
    REQUIRE_OK(alloc->CheckInvariants());
  }
}

TEST_CASE("conformance: many threads allocating and freeing, across threads too",
          "[conformance][threads]") {
  const std::string name = GENERATE(from_range(conformance_runtimes()));
  auto rt = runtime_named(name);
  auto alloc = make_allocator(rt);
  constexpr int kThreads = 8;
  constexpr int kOpsPerThread = 20000;
  std::vector<StreamHandle> streams;
  for (int t = 0; t < kThreads; ++t) {
    auto s = rt->create_stream(0);
    REQUIRE_OK(s);
    streams.push_back(*s);
  }
  // Blocks handed from thread t to thread t+1 to free: frees from another
  // thread than the allocating one. Each block carries a cookie checked at
  // free time, so an overlap between two threads' blocks shows. Cookies are
  // written from the host, so only into host memory (the host runtime);
  // gpu_runtime_test proves non-overlap on a device with device writes.
  const bool host_memory = name == "host";
  struct Held {
    void* p;
    std::size_t cookie_bytes;
    std::uint64_t cookie;
  };
  std::vector<std::vector<Held>> handoff(kThreads);
  std::vector<std::mutex> handoff_mu(kThreads);
  std::atomic<int> failures{0};
  std::atomic<int> corrupted{0};
  auto release = [&](const Held& h) {
    if (host_memory && !capalloc::testing::cookie_intact(h.p, h.cookie_bytes, h.cookie)) {
      ++corrupted;
    }
    if (!alloc->deallocate(h.p).ok()) ++failures;
  };
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937_64 rng(1000 + t);
      std::vector<Held> mine;
      for (int i = 0; i < kOpsPerThread; ++i) {
        if (mine.size() < 32 && rng() % 3 != 0) {
          const std::size_t size = 1 + rng() % (rng() % 16 == 0 ? (4 << 20) : 4096);
          auto p = alloc->allocate(size, 0, streams[t]);
          if (!p.ok()) {
            ++failures;
            continue;
          }
          Held h{*p, std::min<std::size_t>(size, 64), rng()};
          if (host_memory) capalloc::testing::write_cookie(h.p, h.cookie_bytes, h.cookie);
          mine.push_back(h);
        } else if (!mine.empty()) {
          const std::size_t k = rng() % mine.size();
          const Held h = mine[k];
          mine[k] = mine.back();
          mine.pop_back();
          if (rng() % 4 == 0) {
            std::lock_guard lock(handoff_mu[(t + 1) % kThreads]);
            handoff[(t + 1) % kThreads].push_back(h);
          } else {
            release(h);
          }
        }
        if (i % 64 == 0) {
          std::vector<Held> theirs;
          {
            std::lock_guard lock(handoff_mu[t]);
            theirs.swap(handoff[t]);
          }
          for (const Held& h : theirs) release(h);
        }
      }
      for (const Held& h : mine) release(h);
    });
  }
  for (auto& th : threads) th.join();
  for (int t = 0; t < kThreads; ++t)
    for (const Held& h : handoff[t]) release(h);
  CHECK(failures.load() == 0);
  CHECK(corrupted.load() == 0);
  REQUIRE_OK(alloc->CheckInvariants());
  const auto stats = *alloc->stats(0);
  CHECK(stats.allocated_bytes.current == 0);
  CHECK(stats.allocated_blocks.current == 0);
  CHECK(stats.allocations == stats.frees);
  REQUIRE_OK(alloc->empty_cache());
  CHECK(alloc->stats(0)->reserved_bytes.current == 0);
  for (StreamHandle s : streams) REQUIRE_OK(rt->destroy_stream(s));
}
