// Seeded random operation sequences with CheckInvariants() after every step
// (mimalloc/tcmalloc style): allocate, free, record_stream then free on
// another stream's schedule, empty_cache. Each block carries a cookie that
// is checked when it is freed, so two live blocks that overlap would show.
#include <random>
#include <vector>

#include "test_support.hpp"

using namespace capalloc;
using capalloc::testing::host_runtime;
using capalloc::testing::make_allocator;

namespace {

struct Held {
  void* p;
  std::size_t size;
  std::uint64_t cookie;
};

std::size_t random_size(std::mt19937_64& rng) {
  switch (rng() % 16) {
    case 0:
      return 1 + rng() % (24 << 20);  // medium and huge: own or 20 MiB segments
    case 1:
    case 2:
      return 1 + rng() % (2 << 20);
    default:
      return 1 + rng() % 16384;
  }
}

// Runs `ops` random operations; returns the number of invariant checks made.
void run_sequence(std::uint64_t seed, int ops, std::size_t max_live) {
  auto rt = host_runtime(std::size_t{64} << 30);
  auto alloc = make_allocator(rt);
  std::vector<StreamHandle> streams = {kDefaultStream, *rt->create_stream(0), *rt->create_stream(0)};
  std::mt19937_64 rng(seed);
  std::vector<Held> live;
  for (int op = 0; op < ops; ++op) {
    const unsigned dice = static_cast<unsigned>(rng() % 100);
    if (live.size() < max_live && (dice < 52 || live.empty())) {
      const std::size_t size = random_size(rng);
      const StreamHandle stream = streams[rng() % streams.size()];
      auto p = alloc->allocate(size, 0, stream);
      REQUIRE_OK(p);
      Held h{*p, size, rng()};
      capalloc::testing::write_cookie(h.p, std::min<std::size_t>(size, 64), h.cookie);
      live.push_back(h);
    } else if (dice < 97) {
      const std::size_t k = rng() % live.size();
      const Held h = live[k];
      live[k] = live.back();
      live.pop_back();
      REQUIRE(capalloc::testing::cookie_intact(h.p, std::min<std::size_t>(h.size, 64), h.cookie));
      if (dice % 4 == 0) REQUIRE_OK(alloc->record_stream(h.p, streams[rng() % streams.size()]));
      REQUIRE_OK(alloc->deallocate(h.p));
    } else if (dice < 99) {
      // Work on a stream, so pending frees complete in their own time.
      KernelLaunch k;
      k.name = "tick";
      k.host_body = [] {};
      REQUIRE_OK(rt->launch_kernel(streams[rng() % streams.size()], k));
    } else {
      REQUIRE_OK(alloc->empty_cache(0));
    }
    const absl::Status invariants = alloc->CheckInvariants();
    if (!invariants.ok()) {
      INFO("seed " << seed << ", operation " << op << ": " << invariants.ToString());
      REQUIRE(invariants.ok());
    }
  }
  for (const Held& h : live) REQUIRE_OK(alloc->deallocate(h.p));
  for (StreamHandle s : streams) REQUIRE_OK(rt->synchronize_stream(s));
  REQUIRE_OK(alloc->empty_cache());
  REQUIRE_OK(alloc->CheckInvariants());
  const auto stats = *alloc->stats(0);
  CHECK(stats.allocated_bytes.current == 0);
  CHECK(stats.pending_free_blocks == 0);
  CHECK(stats.reserved_bytes.current == 0);
  for (std::size_t i = 1; i < streams.size(); ++i) REQUIRE_OK(rt->destroy_stream(streams[i]));
}

}  // namespace

TEST_CASE("random sequence: one million operations with invariants checked after every one",
          "[random][slow]") {
  // Four seeds of 250,000 operations each: one million in all.
  for (std::uint64_t seed : {1u, 2u, 3u, 4u}) {
    INFO("seed " << seed);
    run_sequence(seed, 250000, 48);
  }
}

TEST_CASE("random sequence: a large live set", "[random]") {
  run_sequence(99, 40000, 2000);
}
