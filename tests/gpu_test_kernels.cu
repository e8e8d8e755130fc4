// gpu_test_kernels.cu: a CUDA kernel for gpu_runtime_test, built by nvcc when
// CUDA is found. It fills floats and takes a pointer and a 64-bit count by
// value, so the cuda runtime's kernel node inspection has 8-byte parameters
// to read: the pointer (a real write) and the count (a candidate that points
// nowhere, which the tracker must tolerate). A second kernel takes its two
// pointers inside a struct passed by value after an int, as PyTorch's
// elementwise kernels take theirs: inspection must see pointers in structs.
#include <cuda_runtime.h>

namespace {

__global__ void fill_f32_kernel(float* dst, unsigned long long count, float value) {
  const unsigned long long i =
      static_cast<unsigned long long>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < count) dst[i] = value;
}

struct ScalePointers {
  float* dst;
  const float* src;
};

__global__ void scale_f32_struct_kernel(int count, float factor, ScalePointers p) {
  const int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (i < count) p.dst[i] = p.src[i] * factor;
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

// dst[i] = src[i] * factor for i < count, the pointers in a struct by value;
// 0 on success.
extern "C" int capalloc_test_scale_f32_struct(void* stream, float* dst, const float* src,
                                              int count, float factor) {
  if (count <= 0) return 0;
  const unsigned blocks = static_cast<unsigned>((count + 255) / 256);
  scale_f32_struct_kernel<<<blocks, 256, 0, static_cast<cudaStream_t>(stream)>>>(
      count, factor, ScalePointers{dst, src});
  return cudaGetLastError() == cudaSuccess ? 0 : 1;
}
