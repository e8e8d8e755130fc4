// gemm/split_k_device.hpp: the launch of the portable split-K kernel on a GPU
// runtime's native stream. The kernels are compiled from split_k_device.cu by
// nvcc and by hipcc into the cuda and hip backend plugins
// (runtime/plugins.hpp); a runtime whose plugin lacks them gets kUnavailable.
#ifndef CAPALLOC_GEMM_SPLIT_K_DEVICE_HPP_
#define CAPALLOC_GEMM_SPLIT_K_DEVICE_HPP_

#include <string_view>

#include "absl/status/status.h"
#include "capalloc/runtime.hpp"
#include "gemm/split_k_kernel.cuh"

namespace capalloc::detail {

absl::Status launch_split_k_on_device(RuntimeKind runtime, const splitk::Params& params,
                                      void* native_stream);

}  // namespace capalloc::detail

#endif  // CAPALLOC_GEMM_SPLIT_K_DEVICE_HPP_
