// gpu_runtimes.hpp: the factories of the GPU DeviceRuntimes, `cuda`
// (CudaRuntime, cuda_runtime.cpp) and `hip` (HipRuntime, hip_runtime.cpp),
// for runtime_factory.cpp.
//
// Both classes are one implementation (gpu_runtime.inc and gpu_graph.inc)
// compiled twice against macro-mapped native names, so their definitions live
// in those translation units, beside the native headers; this header carries
// no native type and is safe to include from any capalloc source. Each factory
// is declared only when its runtime is built in (CAPALLOC_HAVE_CUDA_RUNTIME,
// CAPALLOC_HAVE_HIP_RUNTIME). A factory fails with kUnavailable ("no CUDA
// device") when the toolkit's runtime reports no device, so a runtime that
// exists always has device_count() >= 1.
#ifndef CAPALLOC_RUNTIME_GPU_RUNTIMES_HPP_
#define CAPALLOC_RUNTIME_GPU_RUNTIMES_HPP_

#include <memory>

#include "absl/status/statusor.h"
#include "capalloc/runtime.hpp"

namespace capalloc::detail {

#if defined(CAPALLOC_HAVE_CUDA_RUNTIME)
absl::StatusOr<std::shared_ptr<DeviceRuntime>> make_cuda_runtime();
#endif
#if defined(CAPALLOC_HAVE_HIP_RUNTIME)
absl::StatusOr<std::shared_ptr<DeviceRuntime>> make_hip_runtime();
#endif

}  // namespace capalloc::detail

#endif  // CAPALLOC_RUNTIME_GPU_RUNTIMES_HPP_
