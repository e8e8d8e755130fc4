// tests/cuda_mr_static_test.cu: capalloc::CudaMemoryResource (cuda_mr.hpp)
// against the cuda::mr concepts of the installed CCCL, checked by nvcc at
// build time; then, at run time and without a GPU, the resource over the
// host runtime (capalloc's model of a device): allocate/deallocate and the
// _async pair on a stream, values written and read back, alignment refused,
// bad frees refused, equality, and use through cuda::mr::resource_ref.
#include "capalloc/cuda_mr.hpp"

#include <cstdio>
#include <cstring>
#include <new>
#include <stdexcept>

#include "capalloc/runtime.hpp"

using capalloc::CudaMemoryResource;

// --- The concepts (a build failure if one does not hold) -----------------------
static_assert(cuda::mr::resource<CudaMemoryResource>);
static_assert(cuda::mr::async_resource<CudaMemoryResource>);
static_assert(cuda::mr::resource_with<CudaMemoryResource, cuda::mr::device_accessible>);
static_assert(cuda::mr::async_resource_with<CudaMemoryResource, cuda::mr::device_accessible>);
static_assert(!cuda::mr::resource_with<CudaMemoryResource, cuda::mr::host_accessible>);

namespace {

int failures = 0;

void expect(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "FAIL: %s\n", what);
    ++failures;
  }
}

template <typename Exception, typename Fn>
void expect_throws(Fn&& fn, const char* what) {
  try {
    fn();
  } catch (const Exception& e) {
    std::printf("ok: %s: %s\n", what, e.what());
    return;
  }
  expect(false, what);
}

}  // namespace

int main() {
  capalloc::set_log_level("off").IgnoreError();
  auto runtime = capalloc::make_host_runtime().value();
  auto allocator = capalloc::Allocator::create(runtime).value();
  const capalloc::StreamHandle side = runtime->create_stream(0).value();
  const cuda::stream_ref side_ref(reinterpret_cast<cudaStream_t>(side));
  CudaMemoryResource mr(*allocator);

  // Synchronous pair: the block is usable, aligned, and returns to the pool.
  void* p = mr.allocate(1000, 256);
  expect(reinterpret_cast<std::uintptr_t>(p) % 256 == 0, "allocate honours alignment 256");
  std::memset(p, 0x5a, 1000);
  expect(static_cast<unsigned char*>(p)[999] == 0x5a, "allocate's block holds its bytes");
  mr.deallocate(p, 1000, 256);
  expect(allocator->stats(0).value().allocated_blocks.current == 0, "deallocate frees");

  // Stream-ordered pair: allocated on the side stream, freed on it.
  auto* q = static_cast<int*>(mr.allocate_async(4096 * sizeof(int), 16, side_ref));
  expect(allocator->block_info(q).value().stream == side, "allocate_async uses the stream");
  for (int i = 0; i < 4096; ++i) q[i] = i * 3;
  bool values_ok = true;
  for (int i = 0; i < 4096; ++i) values_ok = values_ok && q[i] == i * 3;
  expect(values_ok, "allocate_async's block round-trips values");
  mr.deallocate_async(q, 4096 * sizeof(int), 16, side_ref);
  expect(allocator->stats(0).value().allocated_blocks.current == 0, "deallocate_async frees");

  // Freed on another stream than its own: recorded there first, so it waits
  // for that stream's work (pending until the stream's event completes).
  void* r = mr.allocate_async(512, 256, side_ref);
  mr.deallocate_async(r, 512, 256, cuda::stream_ref(reinterpret_cast<cudaStream_t>(
                                       runtime->create_stream(0).value())));
  expect(allocator->stats(0).value().allocated_blocks.current == 0,
         "deallocate_async on another stream frees");

  // Bad input: a clear error, nothing changed.
  const auto before = allocator->stats(0).value();
  expect_throws<capalloc::CudaMrBadAlloc>([&] { (void)mr.allocate(64, 4096); },
                                          "alignment beyond the granularity is refused");
  expect_throws<std::invalid_argument>([&] { (void)mr.allocate(64, 48); },
                                       "alignment not a power of two is refused");
  int on_stack = 0;
  expect_throws<std::invalid_argument>([&] { mr.deallocate(&on_stack, 4, 4); },
                                       "a pointer capalloc never returned is refused");
  expect_throws<std::invalid_argument>([&] { mr.deallocate_async(&on_stack, 4, 4, side_ref); },
                                       "deallocate_async of a foreign pointer is refused");
  const auto after = allocator->stats(0).value();
  expect(after.allocations == before.allocations && after.frees == before.frees,
         "refused calls change nothing");
  void* zero = mr.allocate(0, 256);
  expect(zero != nullptr, "0 bytes gives a valid pointer");
  mr.deallocate(zero, 0, 256);

  // Equality: same allocator and device.
  auto other = capalloc::Allocator::create(runtime).value();
  expect(mr == CudaMemoryResource(*allocator), "same allocator: equal");
  expect(mr != CudaMemoryResource(*other), "another allocator: different");

  // Through a type-erased reference, as RMM and CUB hold resources.
  cuda::mr::async_resource_ref<cuda::mr::device_accessible> ref(mr);
  void* s = ref.allocate_async(2048, 256, side_ref);
  expect(allocator->block_info(s).ok(), "resource_ref allocates through capalloc");
  ref.deallocate_async(s, 2048, 256, side_ref);
  expect(allocator->CheckInvariants().ok(), "allocator invariants hold");

  std::printf(failures == 0 ? "cuda_mr_static_test: all passed\n"
                            : "cuda_mr_static_test: %d failed\n",
              failures);
  return failures == 0 ? 0 : 1;
}
