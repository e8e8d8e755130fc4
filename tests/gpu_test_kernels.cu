// gpu_test_kernels.cu: a CUDA kernel for gpu_runtime_test, built by nvcc when
// CUDA is found. It fills floats and takes a pointer and a 64-bit count by
// value, so the cuda runtime's kernel node inspection has 8-byte parameters
// to read: the pointer (a real write) and the count (a candidate that points
// nowhere, which the tracker must tolerate).
#include <cuda_runtime.h>

namespace {

__global__ void fill_f32_kernel(float* dst, unsigned long long count, float value) {
  const unsigned long long i =
      static_cast<unsigned long long>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < count) dst[i] = value;
}

}  // namespace

// Enqueues the fill on `stream` (a cudaStream_t); 0 on success.
extern "C" int capalloc_test_fill_f32(void* stream, float* dst, unsigned long long count,
                                      float value) {
  if (count == 0) return 0;
  const unsigned blocks = static_cast<unsigned>((count + 255) / 256);
  fill_f32_kernel<<<blocks, 256, 0, static_cast<cudaStream_t>(stream)>>>(dst, count, value);
  return cudaGetLastError() == cudaSuccess ? 0 : 1;
}
