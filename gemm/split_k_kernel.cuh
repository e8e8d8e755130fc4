// gemm/split_k_kernel.cuh: the portable core of the split-K GEMM, shared by
// the host runtime's units (host threads), the CUDA kernel and the HIP kernel.
//
// C = A * B^T with A (M x K), B (N x K), C (M x N), all row-major. The output
// is cut into tiles of tile_m x tile_n; K into split_k slices of whole tile_k
// steps. A unit is a (tile, slice) pair:
//   1. it writes the fp32 partial sums of its slice into its plane of the
//      workspace (plane = slice * kMaxTiles + tile);
//   2. it increments the tile's semaphore slot; the old value is its arrival;
//   3. the unit whose arrival is split_k - 1 adds the tile's planes, applies
//      the scales, stores C, and resets the slot to zero.
// A slot that is not zero when a launch starts (dirtied by someone else's
// write) breaks step 3: either no unit sees split_k - 1 (the tile is never
// written: a stale tile) or one sees it early (it reduces planes not yet
// written). That is seed 003's failure, reproduced faithfully.
//
// This header is self-contained (no Abseil, no STL containers) so that nvcc
// and hipcc compile it as they are.
#ifndef CAPALLOC_GEMM_SPLIT_K_KERNEL_CUH_
#define CAPALLOC_GEMM_SPLIT_K_KERNEL_CUH_

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__) || defined(__HIPCC__)
#define CAPALLOC_HD __host__ __device__
#else
#define CAPALLOC_HD
#include <cmath>
#endif

namespace capalloc::detail::splitk {

// Mirrors capalloc::DType (same values).
enum class Elem : int { kF32 = 0, kBF16 = 1, kFP8E4M3 = 2 };

inline constexpr int kMaxTiles = 256;
inline constexpr int kMaxSlices = 16;
inline constexpr int kTileElements = 16 * 64;

struct Params {
  int m, n, k;
  const void* a;
  Elem a_type;
  const void* b;
  Elem b_type;
  const float* a_scale;  // null: 1
  const float* b_scale;  // null: 1
  void* c;
  Elem c_type;
  int split_k;
  int tile_m, tile_n, tile_k;
  int tiles_n;     // tiles along N
  int tiles;       // tiles in all
  int slice_len;   // K elements per slice (a multiple of tile_k)
  float* workspace;
  std::int32_t* semaphore;
};

CAPALLOC_HD inline float bits_to_float(std::uint32_t bits) {
  float f;
  __builtin_memcpy(&f, &bits, sizeof f);
  return f;
}

CAPALLOC_HD inline std::uint32_t float_to_bits(float f) {
  std::uint32_t bits;
  __builtin_memcpy(&bits, &f, sizeof bits);
  return bits;
}

CAPALLOC_HD inline float bf16_to_float(std::uint16_t v) {
  return bits_to_float(static_cast<std::uint32_t>(v) << 16);
}

// Round to nearest even; NaN stays NaN.
CAPALLOC_HD inline std::uint16_t float_to_bf16(float f) {
  std::uint32_t bits = float_to_bits(f);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((bits >> 16) | 0x40);
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<std::uint16_t>(bits >> 16);
}

// OCP fp8 e4m3 ("FN"): bias 7, no infinities, S.1111.111 is NaN, max 448.
CAPALLOC_HD inline float fp8_e4m3_to_float(std::uint8_t v) {
  const int exponent = (v >> 3) & 0xf;
  const int mantissa = v & 0x7;
  float magnitude;
  if (exponent == 0xf && mantissa == 0x7) {
    magnitude = bits_to_float(0x7fc00000u);
  } else if (exponent == 0) {
    magnitude = static_cast<float>(mantissa) * (1.0f / 512.0f);  // m/8 * 2^-6
  } else {
    magnitude = ldexpf(1.0f + static_cast<float>(mantissa) * 0.125f, exponent - 7);
  }
  return (v & 0x80) ? -magnitude : magnitude;
}

CAPALLOC_HD inline float load(const void* base, Elem type, long long index) {
  switch (type) {
    case Elem::kF32:
      return static_cast<const float*>(base)[index];
    case Elem::kBF16:
      return bf16_to_float(static_cast<const std::uint16_t*>(base)[index]);
    case Elem::kFP8E4M3:
      return fp8_e4m3_to_float(static_cast<const std::uint8_t*>(base)[index]);
  }
  return 0.0f;
}

CAPALLOC_HD inline void store(void* base, Elem type, long long index, float value) {
  if (type == Elem::kF32) {
    static_cast<float*>(base)[index] = value;
  } else {
    static_cast<std::uint16_t*>(base)[index] = float_to_bf16(value);
  }
}

CAPALLOC_HD inline float* plane(const Params& p, int slice, int tile) {
  return p.workspace + (static_cast<long long>(slice) * kMaxTiles + tile) * kTileElements;
}

// The partial sum of output (row, col) over the slice's K range.
CAPALLOC_HD inline float partial(const Params& p, int slice, int row, int col) {
  const int k_begin = slice * p.slice_len;
  const int k_end = k_begin + p.slice_len < p.k ? k_begin + p.slice_len : p.k;
  float sum = 0.0f;
  const long long a_row = static_cast<long long>(row) * p.k;
  const long long b_row = static_cast<long long>(col) * p.k;
  for (int kk = k_begin; kk < k_end; ++kk) {
    sum += load(p.a, p.a_type, a_row + kk) * load(p.b, p.b_type, b_row + kk);
  }
  return sum;
}

// Sums the planes of one output, applies the scales and stores it in C.
CAPALLOC_HD inline void reduce_one(const Params& p, int tile, int local) {
  const int tile_row = tile / p.tiles_n;
  const int tile_col = tile % p.tiles_n;
  const int row = tile_row * p.tile_m + local / p.tile_n;
  const int col = tile_col * p.tile_n + local % p.tile_n;
  if (row >= p.m || col >= p.n) return;
  float sum = 0.0f;
  for (int s = 0; s < p.split_k; ++s) sum += plane(p, s, tile)[local];
  if (p.a_scale != nullptr) sum *= p.a_scale[row];
  if (p.b_scale != nullptr) sum *= p.b_scale[col];
  store(p.c, p.c_type, static_cast<long long>(row) * p.n + col, sum);
}

// Writes one output's partial into the unit's plane (zero outside C).
CAPALLOC_HD inline void partial_one(const Params& p, int tile, int slice, int local) {
  const int tile_row = tile / p.tiles_n;
  const int tile_col = tile % p.tiles_n;
  const int row = tile_row * p.tile_m + local / p.tile_n;
  const int col = tile_col * p.tile_n + local % p.tile_n;
  plane(p, slice, tile)[local] = (row < p.m && col < p.n) ? partial(p, slice, row, col) : 0.0f;
}

}  // namespace capalloc::detail::splitk

#endif  // CAPALLOC_GEMM_SPLIT_K_KERNEL_CUH_
