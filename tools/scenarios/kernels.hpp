// tools/scenarios/kernels.hpp: the small element-wise kernels the seed 003
// scenarios launch (fill, scale, sum), as KernelLaunch values that declare
// the spans they read and write.
//
// On the host runtime they run as host functions on the stream's worker.
// Arguments are captured by value (pointers and sizes), as CUDA kernel
// arguments are: a graph replay uses the pointers of capture time.
#ifndef CAPALLOC_TOOLS_SCENARIOS_KERNELS_HPP_
#define CAPALLOC_TOOLS_SCENARIOS_KERNELS_HPP_

#include <cstddef>

#include "capalloc/runtime.hpp"

namespace capalloc::scenarios {

// dst[i] = value for i < n.
KernelLaunch fill_kernel(float* dst, std::size_t n, float value);
// dst[i] = src[i] * factor.
KernelLaunch scale_kernel(float* dst, const float* src, std::size_t n, float factor);
// dst[0] = sum of src[0..n). Sums in double, stores float (what T.sum() gives
// for these exactly representable values).
KernelLaunch sum_kernel(float* dst, const float* src, std::size_t n);

}  // namespace capalloc::scenarios

#endif  // CAPALLOC_TOOLS_SCENARIOS_KERNELS_HPP_
