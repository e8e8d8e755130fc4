// gpu_cuda_mr_check.cu: capalloc::CudaMemoryResource (capalloc/cuda_mr.hpp)
// on a real CUDA device, for gpu_runtime_test's "cuda_mr" case (built by
// nvcc when CUDA is found). Allocates through the resource and through a
// cuda::mr::async_resource_ref on one stream, writes with a kernel, reads the
// values back, and frees stream-ordered on another stream.
#include <cuda_runtime.h>

#include <string>
#include <vector>

#include "capalloc/cuda_mr.hpp"

namespace {

__global__ void iota_half_kernel(float* dst, unsigned count) {
  const unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < count) dst[i] = 0.5f * static_cast<float>(i);
}

std::string cuda_failure(const char* call, cudaError_t e) {
  return std::string(call) + ": " + cudaGetErrorName(e);
}

}  // namespace

// "" when every check passed, else what failed. `allocator` runs over the
// cuda runtime; `a` and `b` are two of its streams (cudaStream_t).
std::string capalloc_test_cuda_mr_round_trip(capalloc::Allocator& allocator, void* a, void* b) {
  const cuda::stream_ref on_a(static_cast<cudaStream_t>(a));
  const cuda::stream_ref on_b(static_cast<cudaStream_t>(b));
  capalloc::CudaMemoryResource mr(allocator);
  cuda::mr::async_resource_ref<cuda::mr::device_accessible> ref(mr);
  constexpr unsigned kCount = 1u << 20;
  try {
    for (int round = 0; round < 2; ++round) {
      auto* p = static_cast<float*>(round == 0 ? mr.allocate_async(kCount * sizeof(float), 256, on_a)
                                               : ref.allocate_async(kCount * sizeof(float), 256, on_a));
      cudaPointerAttributes attributes{};
      if (cudaError_t e = cudaPointerGetAttributes(&attributes, p); e != cudaSuccess) {
        return cuda_failure("cudaPointerGetAttributes", e);
      }
      if (attributes.type != cudaMemoryTypeDevice) return "the block is not device memory";
      iota_half_kernel<<<(kCount + 255) / 256, 256, 0, on_a.get()>>>(p, kCount);
      std::vector<float> host(kCount);
      if (cudaError_t e = cudaMemcpyAsync(host.data(), p, kCount * sizeof(float),
                                          cudaMemcpyDeviceToHost, on_a.get());
          e != cudaSuccess) {
        return cuda_failure("cudaMemcpyAsync", e);
      }
      if (cudaError_t e = cudaStreamSynchronize(on_a.get()); e != cudaSuccess) {
        return cuda_failure("cudaStreamSynchronize", e);
      }
      for (unsigned i = 0; i < kCount; ++i) {
        if (host[i] != 0.5f * static_cast<float>(i)) {
          return "value " + std::to_string(i) + " did not round-trip: " + std::to_string(host[i]);
        }
      }
      // Round 0 frees on its own stream, round 1 on the other (recorded there).
      if (round == 0) {
        mr.deallocate_async(p, kCount * sizeof(float), 256, on_a);
      } else {
        ref.deallocate_async(p, kCount * sizeof(float), 256, on_b);
      }
    }
    if (cudaError_t e = cudaStreamSynchronize(on_b.get()); e != cudaSuccess) {
      return cuda_failure("cudaStreamSynchronize", e);
    }
  } catch (const std::exception& e) {
    return std::string("threw: ") + e.what();
  }
  auto stats = allocator.stats(0);
  if (!stats.ok()) return stats.status().ToString();
  if (stats->allocated_blocks.current != 0) return "blocks left allocated after the frees";
  if (stats->allocations != 2 || stats->frees != 2) return "not two allocations and two frees";
  auto invariants = allocator.CheckInvariants();
  return invariants.ok() ? std::string() : invariants.ToString();
}
