// tests/gemm_test_support.hpp: what the split-K GEMM suites
// (gemm_numeric_test.cpp, gemm_protocol_test.cpp) share: the tolerance of an
// output against a double-precision reference, element access to buffers of
// each DType (storing and decoding as the kernel does), the poison C is filled
// with, and Operands, a problem with the decoded inputs the kernel sees.
#ifndef CAPALLOC_TESTS_GEMM_TEST_SUPPORT_HPP_
#define CAPALLOC_TESTS_GEMM_TEST_SUPPORT_HPP_

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "capalloc/gemm.hpp"
#include "gemm/numeric.hpp"

namespace capalloc::testing {

// --- Tolerances ----------------------------------------------------------------
// The kernel multiplies in f32 (bf16 x bf16 and fp8 x fp8 products are exact
// in f32; f32 x f32 rounds once), sums each slice sequentially in f32, sums
// the split_k planes sequentially, then multiplies by the two scales. That is
// at most K + split_k + 3 roundings along any path, so by the standard bound
// for recursive summation (Higham, gamma_n = n*u / (1 - n*u), u = 2^-24):
//   |c_f32 - ref| <= gamma_{K + split_k + 3} * sum_k |a_k * b_k| * |sa * sb|.
// This is a worst-case bound, so the check is never flaky, yet it is far
// below any real defect: one dropped term of K=1000 is ~1/K = 1e-3 of the
// absolute sum, against gamma ~ 6e-5 here; a stale or early-reduced tile is
// off by the whole value. kAbsFloor only covers an all-zero absolute sum.
// A bf16 output then rounds that f32 value to nearest with 8 significant
// bits, moving it by at most 2^-8 of its magnitude (half an ulp):
//   |c_bf16 - ref| <= e * (1 + 2^-8) + 2^-8 * |ref|,  e the f32 bound above.
constexpr double kF32Unit = 0x1p-24;
constexpr double kBF16Unit = 0x1p-8;
constexpr double kAbsFloor = 1e-6;

inline double f32_bound(int k, int split_k, double abs_sum) {
  const double n = static_cast<double>(k + split_k + 3);
  return n * kF32Unit / (1.0 - n * kF32Unit) * abs_sum + kAbsFloor;
}

inline double tolerance(DType out, int k, int split_k, double ref, double abs_sum) {
  const double e = f32_bound(k, split_k, abs_sum);
  return out == DType::kF32 ? e : e * (1.0 + kBF16Unit) + kBF16Unit * std::fabs(ref);
}

// --- Buffers -------------------------------------------------------------------
constexpr float kPoison = -777.0f;

inline std::size_t element_bytes(DType t) {
  return t == DType::kF32 ? 4 : t == DType::kBF16 ? 2 : 1;
}

// Stores `v` as element i of a buffer of `type`; returns the value stored, decoded.
inline float put(void* base, DType type, std::size_t i, float v) {
  switch (type) {
    case DType::kF32:
      static_cast<float*>(base)[i] = v;
      return v;
    case DType::kBF16: {
      const std::uint16_t bits = detail::float_to_bf16(v);
      static_cast<std::uint16_t*>(base)[i] = bits;
      return detail::bf16_to_float(bits);
    }
    case DType::kFP8E4M3: {
      const std::uint8_t code = detail::float_to_fp8_e4m3(v);
      static_cast<std::uint8_t*>(base)[i] = code;
      return detail::fp8_e4m3_to_float(code);
    }
  }
  return 0.0f;
}

// Element i of an output buffer (f32 or bf16), decoded.
inline float get(const void* base, DType type, std::size_t i) {
  if (type == DType::kF32) return static_cast<const float*>(base)[i];
  return detail::bf16_to_float(static_cast<const std::uint16_t*>(base)[i]);
}

// kPoison as it reads back from an output buffer of `type`.
inline float stored_poison(DType type) {
  return type == DType::kF32 ? kPoison : detail::bf16_to_float(detail::float_to_bf16(kPoison));
}

// --- Problems ------------------------------------------------------------------
// One problem: its device buffers and the decoded inputs the kernel sees.
struct Operands {
  GemmProblem p;
  std::vector<float> a, b, sa, sb;
};

// C[i][j] computed in double from the decoded inputs, and the sum of the
// absolute products that bounds its rounding error (both times the scales).
struct Reference {
  double value = 0.0;
  double abs_sum = 0.0;
};

inline Reference reference(const Operands& o, int i, int j) {
  const GemmProblem& p = o.p;
  Reference r;
  for (int kk = 0; kk < p.k; ++kk) {
    const double t = static_cast<double>(o.a[static_cast<std::size_t>(i) * p.k + kk]) *
                     o.b[static_cast<std::size_t>(j) * p.k + kk];
    r.value += t;
    r.abs_sum += std::fabs(t);
  }
  if (!o.sa.empty()) {
    const double s = static_cast<double>(o.sa[i]) * o.sb[j];
    r.value *= s;
    r.abs_sum *= std::fabs(s);
  }
  return r;
}

}  // namespace capalloc::testing

#endif  // CAPALLOC_TESTS_GEMM_TEST_SUPPORT_HPP_
