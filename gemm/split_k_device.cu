// gemm/split_k_device.cu: the split-K GEMM kernel, one source for CUDA and
// HIP. Built by nvcc with CAPALLOC_DEVICE_API_CUDA and by hipcc with
// CAPALLOC_DEVICE_API_HIP; the arithmetic is split_k_kernel.cuh's, shared
// with the host runtime's units.
//
// One thread block per (tile, slice) unit: its threads write the unit's
// partial plane, a fence makes the plane visible device-wide, thread 0
// arrives on the tile's semaphore slot, and the block that arrives last
// (arrival == split_k - 1) reduces the tile into C and resets the slot.
#include "gemm/split_k_kernel.cuh"

#include "common/device_api.cuh"

#include <cstdio>

namespace capalloc::detail::splitk::device {

constexpr int kThreads = 256;

__global__ void __launch_bounds__(kThreads) split_k_gemm_kernel(Params p) {
  const int tile = static_cast<int>(blockIdx.x);
  const int slice = static_cast<int>(blockIdx.y);
  const int elements = p.tile_m * p.tile_n;
  for (int local = static_cast<int>(threadIdx.x); local < elements; local += kThreads) {
    partial_one(p, tile, slice, local);
  }
  // Release: every thread's plane writes, then the barrier, then the
  // arriving thread fences again (cumulativity under the PTX model) before
  // its atomic; acquire: it fences after the atomic, before the barrier.
  __threadfence();
  __syncthreads();
  __shared__ int arrival;
  if (threadIdx.x == 0) {
    __threadfence();
    arrival = atomicAdd(&p.semaphore[tile], 1);
    __threadfence();
  }
  __syncthreads();
  if (arrival != p.split_k - 1) return;
  __threadfence();
  for (int local = static_cast<int>(threadIdx.x); local < elements; local += kThreads) {
    reduce_one(p, tile, local);
  }
  __syncthreads();
  if (threadIdx.x == 0) atomicExch(&p.semaphore[tile], 0);
}

}  // namespace capalloc::detail::splitk::device

// Looked up by name in the backend plugin (gemm/split_k_device.cpp).
CAPALLOC_DEVICE_EXPORT int capalloc_splitk_launch(const capalloc::detail::splitk::Params* params,
                                                  void* stream, char* error,
                                                  unsigned long error_bytes) {
  using namespace capalloc::detail::splitk::device;
  const dim3 grid(static_cast<unsigned>(params->tiles), static_cast<unsigned>(params->split_k));
  split_k_gemm_kernel<<<grid, kThreads, 0, static_cast<CAPALLOC_GPU(Stream_t)>(stream)>>>(*params);
  const auto status = CAPALLOC_GPU(GetLastError)();
  if (status != CAPALLOC_GPU(Success)) {
    std::snprintf(error, error_bytes, "%s: %s", CAPALLOC_GPU(GetErrorName)(status),
                  CAPALLOC_GPU(GetErrorString)(status));
    return 1;
  }
  return 0;
}
