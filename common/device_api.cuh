// common/device_api.cuh: the one map from capalloc's portable device code to
// CUDA's or HIP's names, for the .cu sources built by nvcc (with
// CAPALLOC_DEVICE_API_CUDA) and by hipcc (with CAPALLOC_DEVICE_API_HIP):
// gemm/split_k_device.cu and tools/scenarios/scenario_kernels.cu.
//
//   CAPALLOC_GPU(name)       cuda##name or hip##name (Stream_t, GetLastError...)
//   CAPALLOC_DEVICE_EXPORT   a launcher a plugin exports by its C name, for
//                            plugin_symbol() (runtime/plugins.hpp)
//
// Each plugin is built for one toolkit, so the kernels need no per-toolkit
// namespace. (The host-compiled runtimes map names through their API traits,
// not through this header.)
#ifndef CAPALLOC_COMMON_DEVICE_API_CUH_
#define CAPALLOC_COMMON_DEVICE_API_CUH_

#if defined(CAPALLOC_DEVICE_API_CUDA)
#include <cuda_runtime.h>
#define CAPALLOC_GPU(name) cuda##name
#elif defined(CAPALLOC_DEVICE_API_HIP)
#include <hip/hip_runtime.h>
#define CAPALLOC_GPU(name) hip##name
#else
#error "define CAPALLOC_DEVICE_API_CUDA or CAPALLOC_DEVICE_API_HIP"
#endif

#define CAPALLOC_DEVICE_EXPORT extern "C" __attribute__((visibility("default")))

#endif  // CAPALLOC_COMMON_DEVICE_API_CUH_
