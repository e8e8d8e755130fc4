// gemm/numeric.cpp: see numeric.hpp.
#include "gemm/numeric.hpp"

#include <cmath>

namespace capalloc::detail {

std::uint8_t float_to_fp8_e4m3(float value) {
  if (std::isnan(value)) return 0x7f;
  const std::uint8_t sign = std::signbit(value) ? 0x80 : 0x00;
  const float a = std::fabs(value);
  if (a >= 448.0f) return sign | 0x7e;  // saturate to the largest finite value
  constexpr float kMinNormal = 1.0f / 64.0f;  // 2^-6
  if (a < kMinNormal) {
    // Subnormals: multiples of 2^-9. nearbyint rounds half to even.
    const int q = static_cast<int>(std::nearbyint(a * 512.0f));
    return static_cast<std::uint8_t>(sign | (q == 8 ? 0x08 : q));  // 8 * 2^-9 = 2^-6: normal
  }
  int exponent = 0;
  const float fraction = std::frexp(a, &exponent);  // a = fraction * 2^exponent, fraction in [0.5, 1)
  int e = exponent - 1;                               // a = (2 * fraction) * 2^e
  int q = static_cast<int>(std::nearbyint((2.0f * fraction - 1.0f) * 8.0f));
  if (q == 8) {
    q = 0;
    ++e;
  }
  const int biased = e + 7;
  if (biased > 15 || (biased == 15 && q == 7)) return sign | 0x7e;
  return static_cast<std::uint8_t>(sign | (biased << 3) | q);
}

}  // namespace capalloc::detail
