// tools/scenarios/kernels.cpp: see kernels.hpp.
#include "tools/scenarios/kernels.hpp"

#include <algorithm>

namespace capalloc::scenarios {

KernelLaunch fill_kernel(float* dst, std::size_t n, float value) {
  KernelLaunch k;
  k.name = "fill";
  k.writes = {{dst, n * sizeof(float)}};
  k.host_body = [dst, n, value] { std::fill(dst, dst + n, value); };
  return k;
}

KernelLaunch scale_kernel(float* dst, const float* src, std::size_t n, float factor) {
  KernelLaunch k;
  k.name = "scale";
  k.reads = {{src, n * sizeof(float)}};
  k.writes = {{dst, n * sizeof(float)}};
  k.host_body = [dst, src, n, factor] {
    for (std::size_t i = 0; i < n; ++i) dst[i] = src[i] * factor;
  };
  return k;
}

KernelLaunch sum_kernel(float* dst, const float* src, std::size_t n) {
  KernelLaunch k;
  k.name = "sum";
  k.reads = {{src, n * sizeof(float)}};
  k.writes = {{dst, sizeof(float)}};
  k.host_body = [dst, src, n] {
    double total = 0;
    for (std::size_t i = 0; i < n; ++i) total += src[i];
    dst[0] = static_cast<float>(total);
  };
  return k;
}

}  // namespace capalloc::scenarios
