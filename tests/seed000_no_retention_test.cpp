// tests/seed000_no_retention_test.cpp: field report 000 (seeds/000_*.txt)
// for every launch path capalloc offers. The report: a launch path kept its
// last launch's tensors alive (10.6 GiB held after the caller freed them).
// Here, after each launch returns and the caller drops its buffers,
// capalloc must hold none of them: no live block (allocator stats, the
// blocks' states, live_blocks over their spans), none pending on a stream,
// and no reference to an object of the caller's (a weak_ptr to it expires).
//
// Paths: the split-K GEMM (gemm/), the scenario kernels (tools/scenarios/),
// a plain KernelLaunch (what both go through), the release queue and DLPack
// import.
#include <dlpack/dlpack.h>

#include <future>
#include <memory>
#include <random>
#include <vector>

#include "capalloc/capture.hpp"
#include "capalloc/dlpack.hpp"
#include "capalloc/gemm.hpp"
#include "capalloc/persistent_cache.hpp"
#include "capalloc/release.hpp"
#include "release_test_support.hpp"
#include "test_support.hpp"
#include "tools/scenarios/kernels.hpp"

namespace capalloc::testing {
namespace {

struct World {
  std::shared_ptr<DeviceRuntime> rt = host_runtime();
  std::unique_ptr<Allocator> alloc = make_allocator(rt);
  StreamHandle stream = rt->create_stream(0).value();

  std::int64_t live_blocks() { return alloc->stats(0)->allocated_blocks.current; }

  // Frees the caller's buffers and checks that capalloc holds none of them:
  // each block is free (not pending on any stream) and none is live over
  // its span.
  void drop_and_check(const std::vector<void*>& buffers) {
    std::vector<MemorySpan> spans;
    for (void* p : buffers) {
      auto info = alloc->block_info(p);
      REQUIRE_OK(info);
      spans.push_back(info->span());
    }
    for (void* p : buffers) REQUIRE_OK(alloc->deallocate(p));
    for (void* p : buffers) CHECK(alloc->block_info(p)->state == BlockState::kFree);
    CHECK(alloc->live_blocks(0, spans).empty());
    CHECK(alloc->stats(0)->pending_free_blocks == 0);
    REQUIRE_OK(alloc->CheckInvariants());
  }
};

TEST_CASE("seed 000: the split-K GEMM's launch path holds none of the caller's buffers") {
  World w;
  PersistentCache cache(*w.alloc);
  SplitKGemm gemm(*w.alloc, cache);
  REQUIRE_OK(gemm.preallocate_split_k(0, w.stream));
  const std::int64_t own = w.live_blocks();  // the workspace and the semaphore
  CHECK(own == 2);
  constexpr int m = 16, n = 64, k = 256;
  void* a = w.alloc->allocate(sizeof(float) * m * k, 0, w.stream).value();
  void* b = w.alloc->allocate(sizeof(float) * n * k, 0, w.stream).value();
  void* c = w.alloc->allocate(sizeof(float) * m * n, 0, w.stream).value();
  std::fill_n(static_cast<float*>(a), m * k, 1.0f);
  std::fill_n(static_cast<float*>(b), n * k, 0.5f);
  GemmProblem p{
      .m = m, .n = n, .k = k, .a = a, .b = b, .c = c, .c_type = DType::kF32, .split_k = 4};
  for (int launch = 0; launch < 3; ++launch) REQUIRE_OK(gemm.run(0, w.stream, p));
  REQUIRE_OK(w.rt->synchronize_stream(w.stream));
  CHECK(static_cast<float*>(c)[0] == 128.0f);
  w.drop_and_check({a, b, c});
  CHECK(w.live_blocks() == own);
}

TEST_CASE("seed 000: the scenario kernels hold none of the caller's buffers") {
  World w;
  constexpr std::size_t n = 1024;
  auto* x = static_cast<float*>(w.alloc->allocate(n * sizeof(float), 0, w.stream).value());
  auto* y = static_cast<float*>(w.alloc->allocate(n * sizeof(float), 0, w.stream).value());
  auto* total = static_cast<float*>(w.alloc->allocate(sizeof(float), 0, w.stream).value());
  REQUIRE_OK(w.rt->launch_kernel(w.stream, scenarios::fill_kernel(x, n, 2.0f)));
  REQUIRE_OK(w.rt->launch_kernel(w.stream, scenarios::scale_kernel(y, x, n, 3.0f)));
  REQUIRE_OK(w.rt->launch_kernel(w.stream, scenarios::sum_kernel(total, y, n)));
  REQUIRE_OK(w.rt->synchronize_stream(w.stream));
  CHECK(*total == 6.0f * n);
  w.drop_and_check({x, y, total});
  CHECK(w.live_blocks() == 0);
}

TEST_CASE("seed 000: a kernel launch holds nothing of the caller's once it has run") {
  World w;
  auto tensor = std::make_shared<std::vector<float>>(256, 1.0f);
  std::weak_ptr<std::vector<float>> watch = tensor;
  KernelLaunch k;
  k.name = "holds_a_tensor";
  k.host_body = [tensor] { (*tensor)[0] += 1.0f; };
  REQUIRE_OK(w.rt->launch_kernel(w.stream, std::move(k)));
  k = KernelLaunch{};
  tensor.reset();  // the caller drops it; the queued launch still has it
  REQUIRE_OK(w.rt->synchronize_stream(w.stream));
  CHECK(watch.expired());
}

TEST_CASE("seed 000: a stream-ordered release holds nothing once it has run") {
  World w;
  auto queue = ReleaseQueue::create(*w.rt).value();
  const StreamHandle idle = w.rt->create_stream(0).value();
  for (int i = 0; i < 20; ++i) {
    void* buffer = w.alloc->allocate(1 << 16, 0, w.stream).value();
    // The caller's object owning the buffer, handed to the release.
    auto owner =
        std::shared_ptr<void>(buffer, [&w](void* p) { w.alloc->deallocate(p).IgnoreError(); });
    std::weak_ptr<void> watch = owner;
    REQUIRE_OK(w.rt->launch_kernel(
        w.stream,
        scenarios::fill_kernel(static_cast<float*>(buffer), (1 << 16) / sizeof(float), 1.0f)));
    std::promise<void> ran;
    REQUIRE_OK(queue->release(0, w.stream, [owner = std::move(owner), &ran]() mutable {
      owner.reset();
      ran.set_value();
    }));
    ran.get_future().wait();
    wait_for_a_pass(*queue, idle);
    CHECK(watch.expired());
    CHECK(w.live_blocks() == 0);
  }
  REQUIRE_OK(queue->drain());  // the last probe's count lands after its callback
  const ReleaseQueueStats stats = queue->stats();
  CHECK(stats.pending == 0);
  CHECK(stats.run_at_teardown == 0);
  CHECK(stats.completed == stats.requested);
}

TEST_CASE("seed 000: a DLPack import holds nothing once its deleter has run") {
  World w;
  auto queue = ReleaseQueue::create(*w.rt).value();
  DlpackImports imports(*queue);
  struct Context {
    std::shared_ptr<std::vector<float>> storage;
    std::promise<void> deleted;
  };
  auto storage = std::make_shared<std::vector<float>>(64, 1.0f);
  std::weak_ptr<std::vector<float>> watch = storage;
  std::int64_t shape = 64;
  auto* ctx = new Context{std::move(storage), {}};
  auto deleted = ctx->deleted.get_future();
  DLManagedTensor t{};
  t.dl_tensor.data = ctx->storage->data();
  t.dl_tensor.device = {kDLCPU, 0};
  t.dl_tensor.ndim = 1;
  t.dl_tensor.dtype = {kDLFloat, 32, 1};
  t.dl_tensor.shape = &shape;
  t.manager_ctx = ctx;
  t.deleter = [](DLManagedTensor* self) {
    auto* c = static_cast<Context*>(self->manager_ctx);
    c->storage.reset();
    c->deleted.set_value();
  };
  auto view = imports.import(&t, w.stream);
  REQUIRE_OK(view);
  REQUIRE_OK(w.rt->launch_kernel(
      w.stream, scenarios::scale_kernel(static_cast<float*>(view->data),
                                        static_cast<float*>(view->data), 64, 2.0f)));
  REQUIRE_OK(imports.release(&t));
  CHECK(imports.imported() == 0);
  deleted.wait();
  REQUIRE_OK(queue->drain());  // the deleter has returned: ctx may go
  CHECK(watch.expired());
  delete ctx;
}

}  // namespace
}  // namespace capalloc::testing
