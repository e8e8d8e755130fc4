// errors_doc_test, captures, the tracker, persistent buffers and the GEMM.
// Rows of docs/errors.md that no other suite checks whole: for each, the
// status code, the fixed part of the message the doc quotes, and the state
// the doc promises after the error. Each TEST_CASE name is referenced from a
// row of docs/errors.md (tests/check_errors_doc.cmake keeps them together).
#include "errors_doc_support.hpp"

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

