// tools/scenarios/scenario_kernels.cu: device versions of the scenarios'
// element-wise kernels (fill, scale, sum), one source for CUDA and HIP like
// gemm/split_k_device.cu. Built by nvcc with CAPALLOC_DEVICE_API_CUDA and by
// hipcc with CAPALLOC_DEVICE_API_HIP; kernels.cpp calls the launchers from a
// KernelLaunch's device_body.
#include "common/device_api.cuh"

#include <cstddef>

namespace capalloc::scenarios::device {

constexpr int kThreads = 256;

__global__ void fill(float* dst, std::size_t n, float value) {
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    dst[i] = value;
  }
}

__global__ void scale(float* dst, const float* src, std::size_t n, float factor) {
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    dst[i] = src[i] * factor;
  }
}

// One block; double accumulation, as the host version sums.
__global__ void sum(float* dst, const float* src, std::size_t n) {
  __shared__ double partial[kThreads];
  double acc = 0;
  for (std::size_t i = threadIdx.x; i < n; i += kThreads) acc += src[i];
  partial[threadIdx.x] = acc;
  __syncthreads();
  for (int stride = kThreads / 2; stride > 0; stride /= 2) {
    if (static_cast<int>(threadIdx.x) < stride) partial[threadIdx.x] += partial[threadIdx.x + stride];
    __syncthreads();
  }
  if (threadIdx.x == 0) dst[0] = static_cast<float>(partial[0]);
}

inline unsigned blocks_for(std::size_t n) {
  const std::size_t b = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(b < 4096 ? (b == 0 ? 1 : b) : 4096);
}

}  // namespace capalloc::scenarios::device

namespace ns = capalloc::scenarios::device;

// Each returns 0, or the native error code after a failed launch.
CAPALLOC_DEVICE_EXPORT int capalloc_scenario_fill(float* dst, std::size_t n, float value,
                                                  void* stream) {
  ns::fill<<<ns::blocks_for(n), ns::kThreads, 0, static_cast<CAPALLOC_GPU(Stream_t)>(stream)>>>(dst, n, value);
  return static_cast<int>(CAPALLOC_GPU(GetLastError)());
}

CAPALLOC_DEVICE_EXPORT int capalloc_scenario_scale(float* dst, const float* src, std::size_t n,
                                                   float factor, void* stream) {
  ns::scale<<<ns::blocks_for(n), ns::kThreads, 0, static_cast<CAPALLOC_GPU(Stream_t)>(stream)>>>(
      dst, src, n, factor);
  return static_cast<int>(CAPALLOC_GPU(GetLastError)());
}

CAPALLOC_DEVICE_EXPORT int capalloc_scenario_sum(float* dst, const float* src, std::size_t n,
                                                 void* stream) {
  ns::sum<<<1, ns::kThreads, 0, static_cast<CAPALLOC_GPU(Stream_t)>(stream)>>>(dst, src, n);
  return static_cast<int>(CAPALLOC_GPU(GetLastError)());
}
