// gpu_runtimes.hpp: the factories of the GPU DeviceRuntimes, `cuda`
// (CudaRuntime, cuda_runtime.cpp) and `hip` (HipRuntime, hip_runtime.cpp),
// each the entry of its backend plugin (plugins.hpp).
//
// Both classes are one implementation (gpu_runtime.inc and gpu_graph.inc)
// compiled twice against macro-mapped native names, so their definitions live
// in those translation units, beside the native headers; this header carries
// no native type and is safe to include from any capalloc source. Each factory
// is defined only in its own backend plugin. A factory fails with kUnavailable ("no CUDA
// device") when the toolkit's runtime reports no device, so a runtime that
// exists always has device_count() >= 1.
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
