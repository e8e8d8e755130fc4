// gemm/numeric.hpp: host-side conversions to the GEMM's element types, for
// callers preparing inputs (the scenario, the tests). Decoding lives in
// split_k_kernel.cuh, shared with the device kernels.
#ifndef CAPALLOC_GEMM_NUMERIC_HPP_
#define CAPALLOC_GEMM_NUMERIC_HPP_

#include <cstdint>

#include "gemm/split_k_kernel.cuh"

namespace capalloc::detail {

using splitk::bf16_to_float;
using splitk::float_to_bf16;
using splitk::fp8_e4m3_to_float;

// Round to nearest even, saturating to +-448 (what torch's .to(float8_e4m3fn)
// does for finite values in range; values beyond 448 saturate here rather
// than becoming NaN). NaN stays NaN.
std::uint8_t float_to_fp8_e4m3(float value);

}  // namespace capalloc::detail

#endif  // CAPALLOC_GEMM_NUMERIC_HPP_
