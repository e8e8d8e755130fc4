// capalloc/gemm.hpp: a split-K GEMM whose workspace and semaphore come from
// capalloc's persistent cache, keyed by device.
//
// C = A * B^T, with A (M x K) and B (N x K) row-major and C (M x N)
// row-major. K is split into `split_k` slices. Each (tile, slice) unit writes
// fp32 partial sums into its plane of the workspace, then increments the
// tile's slot in the semaphore; the unit that sees `arrival == split_k - 1`
// reduces the planes into C and resets the slot to zero (the self-cleaning
// protocol of seed 003). A semaphore left dirty by someone else therefore
// produces stale tiles, which is exactly what seed 003 measured.
//
// Seed 003's lesson is built in: the buffers are keyed by device, never by
// stream (a capture always runs on a fresh stream, so a stream-keyed cache
// can never be warmed), preallocate_split_k() warms them during warmup, and a
// first call inside a capture with a cold cache fails with an error naming
// that fix instead of allocating inside the capture.
//
//   capalloc::SplitKGemm gemm(*allocator, cache);
//   gemm.preallocate_split_k(0).IgnoreError();          // warmup
//   capalloc::GemmProblem p{.m = 1, .n = 2048, .k = 2048, .a = a, .b = b, .c = c,
//                           .split_k = 4};
//   gemm.run(0, stream, p);                             // eager or inside a capture
//
// Ordering: launches through one SplitKGemm on different streams of a device
// share one workspace and semaphore, so each eager launch waits (on the
// device, through an event) for the previous one. Launches recorded into
// graphs are ordered by whoever replays them: replays of graphs that use the
// buffers must not run concurrently with each other or with eager launches
// on other streams.
//
// The launch path keeps no reference to the caller's buffers after run()
// returns, other than the pointers the enqueued kernel was launched with
// (seed 000's lesson).
#ifndef CAPALLOC_GEMM_HPP_
#define CAPALLOC_GEMM_HPP_

#include <cstddef>
#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "capalloc/allocator.hpp"
#include "capalloc/export.h"
#include "capalloc/persistent_cache.hpp"
#include "capalloc/runtime.hpp"

namespace capalloc {

// Element types. kFP8E4M3 is OCP fp8 e4m3 ("FN": no infinities, max 448).
enum class DType { kF32, kBF16, kFP8E4M3 };
CAPALLOC_API const char* dtype_name(DType type);

struct GemmTiling {
  int tile_m = 16;
  int tile_n = 64;
  int tile_k = 256;
};

// Fixed buffer sizes (as the seed's kernel family has): 256 semaphore slots
// (1 KiB) and a workspace of 16 slices x 256 tiles x 16 x 64 fp32 (16 MiB).
inline constexpr int kSplitKMaxTiles = 256;
inline constexpr int kSplitKMaxSlices = 16;
inline constexpr std::size_t kSplitKTileElements = 16 * 64;
inline constexpr std::size_t kSplitKWorkspaceBytes =
    std::size_t{kSplitKMaxSlices} * kSplitKMaxTiles * kSplitKTileElements * sizeof(float);
inline constexpr std::size_t kSplitKSemaphoreBytes = kSplitKMaxTiles * sizeof(std::int32_t);

struct GemmProblem {
  int m = 0;
  int n = 0;
  int k = 0;
  const void* a = nullptr;  // M x K
  DType a_type = DType::kF32;
  const void* b = nullptr;  // N x K
  DType b_type = DType::kF32;
  // Per-row scale of A (M floats) and per-column scale of B (N floats):
  // required for fp8 inputs, absent otherwise.
  const float* a_scale = nullptr;
  const float* b_scale = nullptr;
  void* c = nullptr;  // M x N
  DType c_type = DType::kBF16;
  int split_k = 1;  // 1 .. kSplitKMaxSlices
};

struct SplitKBuffers {
  float* workspace = nullptr;        // kSplitKWorkspaceBytes
  std::int32_t* semaphore = nullptr;  // kSplitKSemaphoreBytes; all zero between launches
};

// Checks a problem against the tiling and the buffer limits. Errors name the
// offending field: kInvalidArgument.
CAPALLOC_API absl::Status validate(const GemmProblem& problem, const GemmTiling& tiling = {});

// Enqueues one split-K GEMM on `stream` with explicit buffers. This is the
// kernel library's raw entry point; seed 003's status-quo counter-example
// uses it with buffers of its own. On the host runtime the units run on host
// threads; on GPU runtimes the portable device kernel runs.
CAPALLOC_API absl::Status launch_split_k_gemm(DeviceRuntime& runtime, StreamHandle stream,
                                              const GemmProblem& problem,
                                              const SplitKBuffers& buffers,
                                              const GemmTiling& tiling = {});

class CAPALLOC_API SplitKGemm {
 public:
  // The buffers live in `cache` under "capalloc.splitk.workspace" and
  // "capalloc.splitk.semaphore" for each device. Both must outlive this.
  SplitKGemm(Allocator& allocator, PersistentCache& cache, GemmTiling tiling = {});
  ~SplitKGemm();
  SplitKGemm(const SplitKGemm&) = delete;
  SplitKGemm& operator=(const SplitKGemm&) = delete;

  // Warmup: creates the device's buffers (if needed) and zeroes the
  // semaphore, waiting for the zeroing on `stream`. Refused during a capture.
  absl::Status preallocate_split_k(int device, StreamHandle stream = kDefaultStream);
  // The device's buffers; kNotFound (naming preallocate_split_k) if cold;
  // kFailedPrecondition if the last preallocate_split_k failed to zero the
  // semaphore (run() then warms it again, or fails inside a capture).
  absl::StatusOr<SplitKBuffers> buffers(int device) const;

  // C = A * B^T on `stream`. Outside a capture a cold cache is warmed first;
  // inside a capture a cold cache is an error (kFailedPrecondition) that
  // names preallocate_split_k, and nothing is allocated.
  absl::Status run(int device, StreamHandle stream, const GemmProblem& problem);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace capalloc

#endif  // CAPALLOC_GEMM_HPP_
