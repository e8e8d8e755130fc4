// gemm_numeric_test.cpp: the split-K GEMM's numbers. First the element
// conversions the GEMM's callers and kernels use (fp8 e4m3 "FN" encode and
// decode over all 256 codes, round-to-nearest-even at every midpoint,
// saturation to +-448; bf16 round-to-nearest-even over all 65536 codes, NaN
// kept NaN). Then C = A * B^T on the host runtime against a double-precision
// reference computed from the decoded inputs (exactly what the kernel reads),
// for seeded random shapes that include N and K not multiples of the
// 16x64x256 tile, split_k 1..8, every supported input/output type pair, and
// slices left empty when split_k exceeds K's tile_k steps; every launch also
// leaves the semaphore zero and writes nothing past C. Last, validate()
// refuses each malformed problem with kInvalidArgument and a message that
// names what is wrong, and run() refuses it without allocating.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "capalloc/persistent_cache.hpp"
#include "gemm_test_support.hpp"
#include "test_support.hpp"

using namespace capalloc;
using namespace capalloc::testing;
using capalloc::detail::bf16_to_float;
using capalloc::detail::float_to_bf16;
using capalloc::detail::float_to_fp8_e4m3;
using capalloc::detail::fp8_e4m3_to_float;

namespace {

// --- Buffers -------------------------------------------------------------------
constexpr int kGuard = 64;  // elements of C's buffer past M x N that must stay poison

// A host runtime, an allocator and a warmed SplitKGemm. Host runtime memory
// is host memory: tests write inputs and read C directly (after synchronize).
struct Rig {
  std::shared_ptr<DeviceRuntime> rt = host_runtime();
  std::unique_ptr<Allocator> alloc = make_allocator(rt);
  PersistentCache cache{*alloc};
  SplitKGemm gemm{*alloc, cache};
  std::vector<void*> blocks;

  Rig() { REQUIRE_OK(gemm.preallocate_split_k(0)); }
  ~Rig() {
    rt->synchronize_stream(kDefaultStream).IgnoreError();
    for (void* p : blocks) alloc->deallocate(p).IgnoreError();
  }
  void* buffer(std::size_t bytes, std::string_view tag) {
    auto p = alloc->allocate(bytes, 0, kDefaultStream, {.tag = tag});
    REQUIRE_OK(p);
    blocks.push_back(*p);
    return *p;
  }
  bool semaphore_clear() const {
    auto b = gemm.buffers(0);
    REQUIRE_OK(b);
    return std::all_of(b->semaphore, b->semaphore + kSplitKMaxTiles,
                       [](std::int32_t s) { return s == 0; });
  }
};

Operands make_operands(Rig& rig, int m, int n, int k, DType in, DType out, int split_k,
                       std::mt19937& rng) {
  Operands o;
  const bool fp8 = in == DType::kFP8E4M3;
  const auto mk = static_cast<std::size_t>(m) * k, nk = static_cast<std::size_t>(n) * k;
  const std::size_t mn = static_cast<std::size_t>(m) * n;
  void* a = rig.buffer(element_bytes(in) * mk, "A");
  void* b = rig.buffer(element_bytes(in) * nk, "B");
  void* c = rig.buffer(element_bytes(out) * (mn + kGuard), "C");
  auto* sa = fp8 ? static_cast<float*>(rig.buffer(sizeof(float) * m, "a_scale")) : nullptr;
  auto* sb = fp8 ? static_cast<float*>(rig.buffer(sizeof(float) * n, "b_scale")) : nullptr;
  // fp8 values spread over many binades (subnormals included); f32 and bf16 in [-1, 1).
  std::uniform_real_distribution<float> value(fp8 ? -4.0f : -1.0f, fp8 ? 4.0f : 1.0f);
  std::uniform_real_distribution<float> scale(0.5f, 1.5f);
  for (std::size_t i = 0; i < mk; ++i) o.a.push_back(put(a, in, i, value(rng)));
  for (std::size_t i = 0; i < nk; ++i) o.b.push_back(put(b, in, i, value(rng)));
  for (int i = 0; fp8 && i < m; ++i) o.sa.push_back(sa[i] = scale(rng));
  for (int i = 0; fp8 && i < n; ++i) o.sb.push_back(sb[i] = scale(rng));
  for (std::size_t i = 0; i < mn + kGuard; ++i) put(c, out, i, kPoison);
  o.p = {.m = m, .n = n, .k = k, .a = a, .a_type = in, .b = b, .b_type = in,
         .a_scale = sa, .b_scale = sb, .c = c, .c_type = out, .split_k = split_k};
  return o;
}

// Outputs outside tolerance (or guard elements overwritten); the first few
// are described in `detail`.
std::size_t count_wrong(const Operands& o, std::string& detail) {
  const GemmProblem& p = o.p;
  std::size_t wrong = 0;
  std::ostringstream out;
  for (int i = 0; i < p.m; ++i) {
    for (int j = 0; j < p.n; ++j) {
      const auto [ref, abs_sum] = reference(o, i, j);
      const double c = get(p.c, p.c_type, static_cast<std::size_t>(i) * p.n + j);
      const double tol = tolerance(p.c_type, p.k, p.split_k, ref, abs_sum);
      if (!(std::fabs(c - ref) <= tol) && wrong++ < 4) {
        out << "C[" << i << "][" << j << "] = " << c << ", reference " << ref << " +- " << tol
            << "; ";
      }
    }
  }
  const std::size_t mn = static_cast<std::size_t>(p.m) * p.n;
  const float poison = stored_poison(p.c_type);
  for (std::size_t g = 0; g < kGuard; ++g) {
    if (get(p.c, p.c_type, mn + g) != poison && wrong++ < 4) {
      out << "guard " << g << " written; ";
    }
  }
  detail = out.str();
  return wrong;
}

// Runs the problem on the default stream, waits, and checks C and the semaphore.
void run_and_check(Rig& rig, const Operands& o) {
  const GemmProblem& p = o.p;
  INFO("M=" << p.m << " N=" << p.n << " K=" << p.k << " split_k=" << p.split_k << " "
            << dtype_name(p.a_type) << " -> " << dtype_name(p.c_type));
  REQUIRE_OK(rig.gemm.run(0, kDefaultStream, p));
  REQUIRE_OK(rig.rt->synchronize_stream(kDefaultStream));
  std::string detail;
  const std::size_t wrong = count_wrong(o, detail);
  INFO(detail);
  CHECK(wrong == 0);
  CHECK(rig.semaphore_clear());
}

struct TypePair {
  DType in, out;
};
constexpr TypePair kTypePairs[] = {{DType::kF32, DType::kF32},   {DType::kF32, DType::kBF16},
                                   {DType::kBF16, DType::kBF16}, {DType::kBF16, DType::kF32},
                                   {DType::kFP8E4M3, DType::kBF16}};

void expect_invalid(const GemmProblem& p, const std::string& needle) {
  const absl::Status s = validate(p);
  INFO(s.ToString());
  CHECK(s.code() == absl::StatusCode::kInvalidArgument);
  CHECK_THAT(std::string(s.message()), Catch::Contains(needle));
}

}  // namespace

// --- Conversions -------------------------------------------------------------------

TEST_CASE("fp8 e4m3: every code decodes and re-encodes to itself, NaN codes decode to NaN",
          "[gemm][numeric][fp8]") {
  for (int code = 0; code < 256; ++code) {
    INFO("code 0x" << std::hex << code);
    const auto c = static_cast<std::uint8_t>(code);
    const float v = fp8_e4m3_to_float(c);
    if ((code & 0x7f) == 0x7f) {
      CHECK(std::isnan(v));
      CHECK(float_to_fp8_e4m3(v) == 0x7f);  // the canonical NaN
      continue;
    }
    CHECK(std::isfinite(v));
    CHECK(std::signbit(v) == ((code & 0x80) != 0));  // 0x80 is -0: keeps its sign
    CHECK(float_to_fp8_e4m3(v) == c);
  }
  CHECK(fp8_e4m3_to_float(0x7e) == 448.0f);
  CHECK(fp8_e4m3_to_float(0xfe) == -448.0f);
  CHECK(fp8_e4m3_to_float(0x08) == 0x1p-6f);  // smallest normal
  CHECK(fp8_e4m3_to_float(0x07) == 7 * 0x1p-9f);  // largest subnormal
  CHECK(fp8_e4m3_to_float(0x01) == 0x1p-9f);  // smallest subnormal
  CHECK(fp8_e4m3_to_float(0x38) == 1.0f);
  CHECK(float_to_fp8_e4m3(-0.0f) == 0x80);
  CHECK(float_to_fp8_e4m3(0.0f) == 0x00);
  CHECK(float_to_fp8_e4m3(std::numeric_limits<float>::quiet_NaN()) == 0x7f);
  CHECK(float_to_fp8_e4m3(-std::numeric_limits<float>::quiet_NaN()) == 0x7f);
}

TEST_CASE("fp8 e4m3: midpoints round to the even code, everything else to the nearest",
          "[gemm][numeric][fp8]") {
  // Adjacent finite codes c, c+1 (including subnormal -> normal and across
  // binades). Consecutive codes alternate the mantissa's low bit, so the even
  // neighbour is the even code. The midpoint is exact in f32.
  for (int c = 0; c < 0x7e; ++c) {
    for (const std::uint8_t sign : {std::uint8_t{0x00}, std::uint8_t{0x80}}) {
      const auto lo = static_cast<std::uint8_t>(sign | c);
      const auto hi = static_cast<std::uint8_t>(sign | (c + 1));
      const float vlo = fp8_e4m3_to_float(lo), vhi = fp8_e4m3_to_float(hi);
      const float mid = (vlo + vhi) / 2;
      INFO("between 0x" << std::hex << int{lo} << " and 0x" << int{hi} << ": " << mid);
      REQUIRE(static_cast<double>(mid) == (static_cast<double>(vlo) + vhi) / 2);
      CHECK(float_to_fp8_e4m3(mid) == ((c % 2 == 0) ? lo : hi));
      CHECK(float_to_fp8_e4m3(std::nextafter(mid, vlo)) == lo);
      CHECK(float_to_fp8_e4m3(std::nextafter(mid, vhi)) == hi);
    }
  }
  // Half the smallest subnormal ties to 0 (even); just above it, to 2^-9.
  CHECK(float_to_fp8_e4m3(0x1p-10f) == 0x00);
  CHECK(float_to_fp8_e4m3(std::nextafter(0x1p-10f, 1.0f)) == 0x01);
  CHECK(float_to_fp8_e4m3(-0x1p-10f) == 0x80);
}

TEST_CASE("fp8 e4m3: values at or beyond 448 saturate to +-448", "[gemm][numeric][fp8]") {
  const float inf = std::numeric_limits<float>::infinity();
  for (const float v : {448.0f, 449.0f, 464.0f, 479.0f, 480.0f, 500.0f, 1e6f,
                        std::numeric_limits<float>::max(), inf}) {
    INFO(v);
    CHECK(float_to_fp8_e4m3(v) == 0x7e);
    CHECK(float_to_fp8_e4m3(-v) == 0xfe);
  }
  // Below 448: 432 is the midpoint of 416 (0x7d, odd) and 448: to even, 448.
  CHECK(float_to_fp8_e4m3(432.0f) == 0x7e);
  CHECK(float_to_fp8_e4m3(431.0f) == 0x7d);
}

TEST_CASE("bf16: round to nearest even, all codes round-trip, NaN stays NaN",
          "[gemm][numeric][bf16]") {
  CHECK(float_to_bf16(1.0f) == 0x3f80);
  CHECK(float_to_bf16(1.0f + 0x1p-8f) == 0x3f80);  // tie between 1 and 1+2^-7: even (down)
  CHECK(float_to_bf16(1.0f + 3 * 0x1p-8f) == 0x3f82);  // tie between odd 0x3f81 and 0x3f82: up
  CHECK(float_to_bf16(1.0f + 0x1p-8f + 0x1p-20f) == 0x3f81);  // above the tie: up
  CHECK(float_to_bf16(1.0f + 0x1p-8f - 0x1p-20f) == 0x3f80);  // below the tie: down
  CHECK(float_to_bf16(-1.0f - 3 * 0x1p-8f) == 0xbf82);
  CHECK(float_to_bf16(std::numeric_limits<float>::max()) == 0x7f80);  // rounds up to +inf
  for (const std::uint32_t nan_bits : {0x7fc00000u, 0x7f800001u, 0xff800001u, 0x7fffffffu}) {
    INFO("NaN bits 0x" << std::hex << nan_bits);
    CHECK(std::isnan(bf16_to_float(float_to_bf16(std::bit_cast<float>(nan_bits)))));
  }
  int mismatches = 0;
  for (std::uint32_t code = 0; code < 0x10000; ++code) {
    const auto c = static_cast<std::uint16_t>(code);
    const float v = bf16_to_float(c);
    const bool ok =
        std::isnan(v) ? std::isnan(bf16_to_float(float_to_bf16(v))) : float_to_bf16(v) == c;
    if (!ok) ++mismatches;
  }
  CHECK(mismatches == 0);
}

// --- C = A * B^T against the reference ---------------------------------------------

TEST_CASE("C = A * B^T matches a double reference for every type pair, shape and split_k",
          "[gemm][numeric]") {
  constexpr int kMs[] = {1, 7, 16, 33, 64};
  constexpr int kNs[] = {64, 100, 257};
  constexpr int kKs[] = {256, 300, 1000};
  constexpr int kSplits[] = {1, 2, 3, 4, 8};
  const std::size_t pair = GENERATE(range<std::size_t>(0, std::size(kTypePairs)));
  const TypePair types = kTypePairs[pair];
  INFO(dtype_name(types.in) << " inputs, " << dtype_name(types.out) << " output");
  Rig rig;
  std::mt19937 rng(0x5eed0000u + static_cast<unsigned>(pair));
  // Every (M, split_k) pair once, in random order; N and K cycle through all
  // nine (N, K) combinations along that order, so every value is covered and
  // the pairing with M and split_k is random.
  std::vector<std::pair<int, int>> shapes;
  for (int m : kMs)
    for (int s : kSplits) shapes.emplace_back(m, s);
  std::shuffle(shapes.begin(), shapes.end(), rng);
  for (std::size_t i = 0; i < shapes.size(); ++i) {
    const Operands o = make_operands(rig, shapes[i].first, kNs[i % 3], kKs[(i / 3) % 3], types.in,
                                     types.out, shapes[i].second, rng);
    run_and_check(rig, o);
  }
}

TEST_CASE("split_k beyond K's tile_k steps leaves slices empty and the result correct",
          "[gemm][numeric][empty-slices]") {
  Rig rig;
  std::mt19937 rng(3);
  struct Case {
    int m, n, k, split_k;
  };
  // K=256 is one tile_k step: with split_k 8 or 16, every slice but the first
  // is empty. K=300 is two steps (the second short): slices 2.. are empty.
  for (const Case c : {Case{1, 64, 256, 8}, Case{33, 100, 256, 8}, Case{16, 257, 256, 16},
                       Case{7, 100, 300, 8}, Case{64, 64, 300, 16}, Case{1, 2048, 512, 16}}) {
    for (const TypePair t : {kTypePairs[0], kTypePairs[4]}) {
      run_and_check(rig, make_operands(rig, c.m, c.n, c.k, t.in, t.out, c.split_k, rng));
    }
  }
}

// --- validate() ---------------------------------------------------------------------

TEST_CASE("validate refuses each malformed problem with kInvalidArgument naming the problem",
          "[gemm][validate]") {
  float dummy[4] = {};
  const GemmProblem good{.m = 16, .n = 64, .k = 256, .a = dummy, .b = dummy, .c = dummy};
  REQUIRE_OK(validate(good));
  const float* scale = dummy;
  const GemmProblem fp8{.m = 16, .n = 64, .k = 256, .a = dummy, .a_type = DType::kFP8E4M3,
                        .b = dummy, .b_type = DType::kFP8E4M3, .a_scale = scale,
                        .b_scale = scale, .c = dummy, .c_type = DType::kBF16};
  REQUIRE_OK(validate(fp8));
  auto with = [](GemmProblem p, auto&& edit) {
    edit(p);
    return p;
  };
  expect_invalid(with(good, [](GemmProblem& p) { p.m = 0; }), "M=0");
  expect_invalid(with(good, [](GemmProblem& p) { p.n = -3; }), "N=-3");
  expect_invalid(with(good, [](GemmProblem& p) { p.k = 0; }), "must be positive");
  expect_invalid(with(good, [](GemmProblem& p) { p.a = nullptr; }), "A, B and C must all be given");
  expect_invalid(with(good, [](GemmProblem& p) { p.b = nullptr; }), "A, B and C must all be given");
  expect_invalid(with(good, [](GemmProblem& p) { p.c = nullptr; }), "A, B and C must all be given");
  expect_invalid(with(good, [](GemmProblem& p) { p.split_k = 0; }), "split_k 0 is outside 1..16");
  expect_invalid(with(good, [](GemmProblem& p) { p.split_k = 17; }), "split_k 17 is outside 1..16");
  // 4 tile rows x 65 tile columns = 260 tiles > 256 semaphore slots.
  expect_invalid(with(good, [](GemmProblem& p) { p.m = 64; p.n = 64 * 65; }), "needs 260 tiles");
  CHECK_OK(validate(with(good, [](GemmProblem& p) { p.m = 64; p.n = 64 * 64; })));  // 256: fits
  expect_invalid(with(good, [](GemmProblem& p) { p.b_type = DType::kBF16; }),
                 "A is f32 but B is bf16");
  expect_invalid(with(fp8, [](GemmProblem& p) { p.a_scale = nullptr; p.b_scale = nullptr; }),
                 "fp8 inputs need a per-row scale for A and a per-column scale for B");
  expect_invalid(with(fp8, [](GemmProblem& p) { p.b_scale = nullptr; }), "fp8 inputs need");
  expect_invalid(with(good, [&](GemmProblem& p) { p.a_scale = scale; }),
                 "scales apply to fp8 inputs only");
  expect_invalid(with(good, [&](GemmProblem& p) { p.a_scale = scale; p.b_scale = scale; }),
                 "scales apply to fp8 inputs only");
  expect_invalid(with(good, [](GemmProblem& p) { p.c_type = DType::kFP8E4M3; }),
                 "output type fp8_e4m3 is not supported");
  expect_invalid(with(fp8, [](GemmProblem& p) { p.c_type = DType::kFP8E4M3; }),
                 "output type fp8_e4m3 is not supported");
  expect_invalid(with(fp8, [](GemmProblem& p) { p.c_type = DType::kF32; }),
                 "output type f32 is not supported with fp8_e4m3 inputs");

  // run() refuses the same way before touching anything: no allocation, not even a cold cache's.
  auto rt = host_runtime();
  auto alloc = make_allocator(rt);
  PersistentCache cache(*alloc);
  SplitKGemm gemm(*alloc, cache);
  const absl::Status s =
      gemm.run(0, kDefaultStream, with(good, [](GemmProblem& p) { p.split_k = 17; }));
  CHECK(s.code() == absl::StatusCode::kInvalidArgument);
  CHECK(alloc->stats(0)->allocations == 0);
  CHECK(gemm.buffers(0).status().code() == absl::StatusCode::kNotFound);
  // The raw entry point wants its buffers.
  const absl::Status raw = launch_split_k_gemm(*rt, kDefaultStream, good, SplitKBuffers{});
  CHECK(raw.code() == absl::StatusCode::kInvalidArgument);
  CHECK_THAT(std::string(raw.message()), Catch::Contains("workspace and semaphore"));
}
