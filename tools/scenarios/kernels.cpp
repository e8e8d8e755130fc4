// tools/scenarios/kernels.cpp: see kernels.hpp. Each kernel carries a host
// body (the host runtime) and a device body that launches the same kernel
// from scenario_kernels.cu on the runtime's native stream, when that file was
// built for the runtime's toolkit.
#include "tools/scenarios/kernels.hpp"

#include <algorithm>
#include <string>

#include "absl/strings/str_format.h"

// Defined in scenario_kernels.cu; each returns the native error code (0: ok).
extern "C" {
#if defined(CAPALLOC_SCENARIO_CUDA_KERNELS)
int capalloc_scenario_fill_cuda(float* dst, std::size_t n, float value, void* stream);
int capalloc_scenario_scale_cuda(float* dst, const float* src, std::size_t n, float factor,
                                 void* stream);
int capalloc_scenario_sum_cuda(float* dst, const float* src, std::size_t n, void* stream);
#endif
#if defined(CAPALLOC_SCENARIO_HIP_KERNELS)
int capalloc_scenario_fill_hip(float* dst, std::size_t n, float value, void* stream);
int capalloc_scenario_scale_hip(float* dst, const float* src, std::size_t n, float factor,
                                void* stream);
int capalloc_scenario_sum_hip(float* dst, const float* src, std::size_t n, void* stream);
#endif
}

namespace capalloc::scenarios {

namespace {

// Calls `cuda` or `hip` (each returning a native error code) by runtime name.
template <typename Cuda, typename Hip>
absl::Status on_device(std::string_view kernel, std::string_view runtime, Cuda&& cuda, Hip&& hip) {
  int rc = -1;
  if (runtime == "cuda") {
    rc = cuda();
  } else if (runtime == "hip") {
    rc = hip();
  }
  if (rc == 0) return absl::OkStatus();
  if (rc == -1) {
    return absl::UnavailableError(absl::StrFormat(
        "scenario kernel %s was not built for the %s runtime", std::string(kernel),
        std::string(runtime)));
  }
  return absl::InternalError(absl::StrFormat("scenario kernel %s on %s: launch failed (error %d)",
                                             std::string(kernel), std::string(runtime), rc));
}

[[maybe_unused]] constexpr int kNotBuilt = -1;

}  // namespace

KernelLaunch fill_kernel(float* dst, std::size_t n, float value) {
  KernelLaunch k;
  k.name = "fill";
  k.writes = {{dst, n * sizeof(float)}};
  k.host_body = [dst, n, value] { std::fill(dst, dst + n, value); };
  k.device_body = [dst, n, value](std::string_view runtime, [[maybe_unused]] void* stream) {
    return on_device(
        "fill", runtime,
        [&] {
#if defined(CAPALLOC_SCENARIO_CUDA_KERNELS)
          return capalloc_scenario_fill_cuda(dst, n, value, stream);
#else
          return kNotBuilt;
#endif
        },
        [&] {
#if defined(CAPALLOC_SCENARIO_HIP_KERNELS)
          return capalloc_scenario_fill_hip(dst, n, value, stream);
#else
          return kNotBuilt;
#endif
        });
  };
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
  k.device_body = [dst, src, n, factor](std::string_view runtime, [[maybe_unused]] void* stream) {
    return on_device(
        "scale", runtime,
        [&] {
#if defined(CAPALLOC_SCENARIO_CUDA_KERNELS)
          return capalloc_scenario_scale_cuda(dst, src, n, factor, stream);
#else
          return kNotBuilt;
#endif
        },
        [&] {
#if defined(CAPALLOC_SCENARIO_HIP_KERNELS)
          return capalloc_scenario_scale_hip(dst, src, n, factor, stream);
#else
          return kNotBuilt;
#endif
        });
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
  k.device_body = [dst, src, n](std::string_view runtime, [[maybe_unused]] void* stream) {
    return on_device(
        "sum", runtime,
        [&] {
#if defined(CAPALLOC_SCENARIO_CUDA_KERNELS)
          return capalloc_scenario_sum_cuda(dst, src, n, stream);
#else
          return kNotBuilt;
#endif
        },
        [&] {
#if defined(CAPALLOC_SCENARIO_HIP_KERNELS)
          return capalloc_scenario_sum_hip(dst, src, n, stream);
#else
          return kNotBuilt;
#endif
        });
  };
  return k;
}

}  // namespace capalloc::scenarios
