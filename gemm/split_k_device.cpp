// gemm/split_k_device.cpp: dispatch of a split-K launch to the kernels built
// for the runtime (see split_k_device.hpp).
#include "gemm/split_k_device.hpp"

#include <string>

#include "absl/strings/str_format.h"

// Defined in split_k_device.cu, compiled once per GPU toolkit. They return 0
// on success, else write the error into `error`.
extern "C" {
#if defined(CAPALLOC_HAVE_CUDA_KERNELS)
int capalloc_splitk_launch_cuda(const capalloc::detail::splitk::Params* params, void* stream,
                                char* error, unsigned long error_bytes);
#endif
#if defined(CAPALLOC_HAVE_HIP_KERNELS)
int capalloc_splitk_launch_hip(const capalloc::detail::splitk::Params* params, void* stream,
                               char* error, unsigned long error_bytes);
#endif
}

namespace capalloc::detail {

absl::Status launch_split_k_on_device(std::string_view runtime, const splitk::Params& params,
                                      void* native_stream) {
  (void)params, (void)native_stream;  // unused when built without GPU kernels
  char error[256] = {};
  int rc = -1;
  if (runtime == "cuda") {
#if defined(CAPALLOC_HAVE_CUDA_KERNELS)
    rc = capalloc_splitk_launch_cuda(&params, native_stream, error, sizeof error);
#else
    return absl::UnavailableError("split-K GEMM: this library was built without CUDA kernels");
#endif
  } else if (runtime == "hip") {
#if defined(CAPALLOC_HAVE_HIP_KERNELS)
    rc = capalloc_splitk_launch_hip(&params, native_stream, error, sizeof error);
#else
    return absl::UnavailableError("split-K GEMM: this library was built without HIP kernels");
#endif
  } else {
    return absl::UnimplementedError(absl::StrFormat(
        "split-K GEMM: no device kernel for the %s runtime", std::string(runtime)));
  }
  if (rc != 0) {
    return absl::InternalError(absl::StrFormat("split-K GEMM launch on %s failed: %s",
                                               std::string(runtime), error));
  }
  return absl::OkStatus();
}

}  // namespace capalloc::detail
