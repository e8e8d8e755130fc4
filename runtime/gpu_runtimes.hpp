// gpu_runtimes.hpp: the factories of the GPU DeviceRuntimes, `cuda`
// (GpuRuntime<CudaApi>, cuda_runtime.cpp) and `hip` (GpuRuntime<HipApi>,
// hip_runtime.cpp), each the entry of its backend plugin (plugins.hpp).
//
// Both are one class template (gpu_runtime.hpp) over an API traits type
// (cuda_api.hpp, hip_api.hpp), instantiated in its backend's source beside
// the native headers; this header carries no native type and is safe to
// include from any capalloc source. Each factory is defined only in its own
// backend plugin. A factory fails with kUnavailable ("no CUDA device") when
// the toolkit's runtime reports no device, so a runtime that exists always
// has device_count() >= 1.
#ifndef CAPALLOC_RUNTIME_GPU_RUNTIMES_HPP_
#define CAPALLOC_RUNTIME_GPU_RUNTIMES_HPP_

#include <memory>

#include "absl/status/statusor.h"
#include "capalloc/runtime.hpp"

namespace capalloc::detail {

absl::StatusOr<std::shared_ptr<DeviceRuntime>> make_cuda_runtime();
absl::StatusOr<std::shared_ptr<DeviceRuntime>> make_hip_runtime();

}  // namespace capalloc::detail

#endif  // CAPALLOC_RUNTIME_GPU_RUNTIMES_HPP_
