// Bad input: each case gets a clear error, and neither the stats nor the
// invariants move. The block the caller did own stays usable.
#include <cstdlib>

#include "test_support.hpp"

using namespace capalloc;
using capalloc::testing::host_runtime;
using capalloc::testing::make_allocator;
using capalloc::testing::same_state;

namespace {

// An allocator with one live block and one cached free block, and a check
// that a failing call left all of it alone.
struct Scene {
  std::shared_ptr<DeviceRuntime> rt = host_runtime(std::size_t{1} << 30, 2);
  std::unique_ptr<Allocator> alloc = make_allocator(rt);
  void* live = nullptr;
  void* freed = nullptr;
  AllocatorStats before;

  Scene() {
    live = *alloc->allocate(4096);
    freed = *alloc->allocate(4096);
    REQUIRE_OK(alloc->deallocate(freed));
    before = *alloc->stats(0);
  }
  void require_unchanged() {
    REQUIRE_OK(alloc->CheckInvariants());
    CHECK(same_state(before, *alloc->stats(0)));
    CHECK(alloc->block_info(live)->state == BlockState::kAllocated);
    REQUIRE_OK(alloc->deallocate(live));  // still the caller's, still freeable
  }
};

std::string message_of(const absl::Status& s) { return std::string(s.message()); }

}  // namespace

TEST_CASE("bad input: free of a pointer capalloc never returned", "[bad_input]") {
  Scene scene;
  int on_stack = 0;
  void* heap = std::malloc(64);
  for (void* p : {static_cast<void*>(&on_stack), heap}) {
    absl::Status s = scene.alloc->deallocate(p);
    CHECK(s.code() == absl::StatusCode::kNotFound);
    CHECK_THAT(message_of(s), Catch::Contains("did not allocate"));
  }
  std::free(heap);
  scene.require_unchanged();
}

TEST_CASE("bad input: double free", "[bad_input]") {
  Scene scene;
  absl::Status s = scene.alloc->deallocate(scene.freed);
  CHECK(s.code() == absl::StatusCode::kFailedPrecondition);
  CHECK_THAT(message_of(s), Catch::Contains("double free"));
  scene.require_unchanged();
}

TEST_CASE("bad input: a double free of a block merged since names the double free",
          "[bad_input]") {
  // Blocks above the quick cache's sizes merge when freed: the second free
  // of `later` finds its address inside the free block that `earlier`'s
  // free made, no longer a block's start. The allocator cannot tell that
  // from a pointer into free memory, so the message names both.
  Scene scene;
  void* earlier = *scene.alloc->allocate(300 << 10);
  void* later = *scene.alloc->allocate(300 << 10);
  REQUIRE_OK(scene.alloc->deallocate(later));
  REQUIRE_OK(scene.alloc->deallocate(earlier));
  scene.before = *scene.alloc->stats(0);
  absl::Status s = scene.alloc->deallocate(later);
  CHECK(s.code() == absl::StatusCode::kInvalidArgument);
  CHECK_THAT(message_of(s), Catch::Contains("bytes into the free block"));
  CHECK_THAT(message_of(s), Catch::Contains("a double free"));
  scene.require_unchanged();
}

TEST_CASE("bad input: a pointer into the middle of a block", "[bad_input]") {
  Scene scene;
  void* middle = static_cast<char*>(scene.live) + 256;
  absl::Status s = scene.alloc->deallocate(middle);
  CHECK(s.code() == absl::StatusCode::kInvalidArgument);
  CHECK_THAT(message_of(s), Catch::Contains("256 bytes into the allocated block"));
  CHECK(scene.alloc->record_stream(middle, kDefaultStream).code() ==
        absl::StatusCode::kInvalidArgument);
  scene.require_unchanged();
}

TEST_CASE("bad input: the wrong device", "[bad_input]") {
  Scene scene;
  absl::Status s = scene.alloc->deallocate(scene.live, 1);
  CHECK(s.code() == absl::StatusCode::kInvalidArgument);
  CHECK_THAT(message_of(s), Catch::Contains("belongs to device 0, not device 1"));
  auto p = scene.alloc->allocate(64, 7);
  CHECK(p.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK_THAT(message_of(p.status()), Catch::Contains("device 7 does not exist"));
  CHECK(scene.alloc->allocate(64, -1).status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(scene.alloc->stats(9).status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(scene.alloc->empty_cache(9).code() == absl::StatusCode::kInvalidArgument);
  scene.require_unchanged();
}

TEST_CASE("bad input: record_stream on a freed block, or with an unknown stream", "[bad_input]") {
  Scene scene;
  const StreamHandle other = *scene.rt->create_stream(0);
  absl::Status s = scene.alloc->record_stream(scene.freed, other);
  CHECK(s.code() == absl::StatusCode::kFailedPrecondition);
  CHECK_THAT(message_of(s), Catch::Contains("already free"));
  absl::Status unknown = scene.alloc->record_stream(scene.live, StreamHandle{0xdead0});
  // An unknown stream is a bad argument (issue 11), as on allocate.
  CHECK(unknown.code() == absl::StatusCode::kInvalidArgument);
  CHECK_THAT(message_of(unknown), Catch::Contains("not a live stream"));
  scene.require_unchanged();
  REQUIRE_OK(scene.rt->destroy_stream(other));
}

TEST_CASE("bad input: null pointers and impossible sizes", "[bad_input]") {
  Scene scene;
  CHECK(scene.alloc->deallocate(nullptr).code() == absl::StatusCode::kInvalidArgument);
  CHECK(scene.alloc->allocate(0).status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(scene.alloc->allocate(~std::size_t{0}).status().code() ==
        absl::StatusCode::kInvalidArgument);
  scene.require_unchanged();
}

TEST_CASE("bad input: invalid allocator options are refused at creation", "[bad_input]") {
  AllocatorOptions options;
  options.round_granularity = 384;  // not a power of two
  auto a = Allocator::create(host_runtime(), options);
  CHECK(a.status().code() == absl::StatusCode::kInvalidArgument);
  options.round_granularity = 128;  // below the 256 B alignment guarantee
  CHECK(Allocator::create(host_runtime(), options).status().code() ==
        absl::StatusCode::kInvalidArgument);
  CHECK(Allocator::create(nullptr).status().code() == absl::StatusCode::kInvalidArgument);

  ::setenv("CAPALLOC_ROUND_GRANULARITY", "1000", 1);
  auto from_env = AllocatorOptions::from_env();
  CHECK(from_env.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK_THAT(message_of(from_env.status()), Catch::Contains("CAPALLOC_ROUND_GRANULARITY"));
  ::setenv("CAPALLOC_ROUND_GRANULARITY", "1024", 1);
  CHECK(AllocatorOptions::from_env()->round_granularity == 1024);
  ::unsetenv("CAPALLOC_ROUND_GRANULARITY");
}
