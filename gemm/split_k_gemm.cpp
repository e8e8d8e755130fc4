// gemm/split_k_gemm.cpp: validation, the launch on each runtime, and the
// device-keyed buffers of SplitKGemm.
//
// The host runtime runs the units of one launch on a few host threads that
// take (tile, slice) units from a shared counter, so units of a tile really
// race for the semaphore as thread blocks do on a GPU. GPU runtimes call the
// portable kernel through split_k_device.cu, compiled by nvcc and by hipcc.
#include <algorithm>
#include <atomic>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_format.h"
#include "common/status_macros.hpp"
#include "capalloc/gemm.hpp"
#include "gemm/split_k_device.hpp"
#include "gemm/split_k_kernel.cuh"

namespace capalloc {

namespace splitk = detail::splitk;

namespace {

constexpr const char* kWorkspaceKey = "capalloc.splitk.workspace";
constexpr const char* kSemaphoreKey = "capalloc.splitk.semaphore";

std::size_t element_bytes(DType t) {
  switch (t) {
    case DType::kF32:
      return 4;
    case DType::kBF16:
      return 2;
    case DType::kFP8E4M3:
      return 1;
  }
  return 0;
}

int ceil_div(int a, int b) { return (a + b - 1) / b; }

splitk::Params make_params(const GemmProblem& p, const SplitKBuffers& buffers,
                           const GemmTiling& tiling) {
  splitk::Params params{};
  params.m = p.m;
  params.n = p.n;
  params.k = p.k;
  params.a = p.a;
  params.a_type = static_cast<splitk::Elem>(p.a_type);
  params.b = p.b;
  params.b_type = static_cast<splitk::Elem>(p.b_type);
  params.a_scale = p.a_scale;
  params.b_scale = p.b_scale;
  params.c = p.c;
  params.c_type = static_cast<splitk::Elem>(p.c_type);
  params.split_k = p.split_k;
  params.tile_m = tiling.tile_m;
  params.tile_n = tiling.tile_n;
  params.tile_k = tiling.tile_k;
  params.tiles_n = ceil_div(p.n, tiling.tile_n);
  params.tiles = ceil_div(p.m, tiling.tile_m) * params.tiles_n;
  // Whole tile_k steps per slice; trailing slices may be short or empty.
  params.slice_len = ceil_div(ceil_div(p.k, tiling.tile_k), p.split_k) * tiling.tile_k;
  params.workspace = buffers.workspace;
  params.semaphore = buffers.semaphore;
  return params;
}

// Runs every (tile, slice) unit of one launch on host threads.
void run_units_on_host(const splitk::Params& p) {
  const int units = p.tiles * p.split_k;
  const int tile_elements = p.tile_m * p.tile_n;
  std::atomic<int> next{0};
  auto worker = [&] {
    for (int u = next.fetch_add(1); u < units; u = next.fetch_add(1)) {
      const int tile = u / p.split_k;
      const int slice = u % p.split_k;
      for (int local = 0; local < tile_elements; ++local) splitk::partial_one(p, tile, slice, local);
      // Publish the plane, then arrive. acq_rel: the reducer sees every plane.
      std::atomic_ref<std::int32_t> slot(p.semaphore[tile]);
      const std::int32_t arrival = slot.fetch_add(1, std::memory_order_acq_rel);
      if (arrival == p.split_k - 1) {
        for (int local = 0; local < tile_elements; ++local) splitk::reduce_one(p, tile, local);
        slot.store(0, std::memory_order_release);
      }
    }
  };
  const int threads = std::min(units, static_cast<int>(std::max(2u, std::min(8u, std::thread::hardware_concurrency()))));
  std::vector<std::thread> pool;
  for (int t = 1; t < threads; ++t) pool.emplace_back(worker);
  worker();
  for (auto& t : pool) t.join();
}

}  // namespace

const char* dtype_name(DType type) {
  switch (type) {
    case DType::kF32:
      return "f32";
    case DType::kBF16:
      return "bf16";
    case DType::kFP8E4M3:
      return "fp8_e4m3";
  }
  return "?";
}

absl::Status validate(const GemmProblem& p, const GemmTiling& t) {
  if (p.m <= 0 || p.n <= 0 || p.k <= 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("gemm: M, N and K must be positive (M=%d N=%d K=%d)", p.m, p.n, p.k));
  }
  if (p.a == nullptr || p.b == nullptr || p.c == nullptr) {
    return absl::InvalidArgumentError("gemm: A, B and C must all be given");
  }
  if (t.tile_m <= 0 || t.tile_n <= 0 || t.tile_k <= 0 ||
      static_cast<std::size_t>(t.tile_m) * t.tile_n > kSplitKTileElements) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "gemm: tile %dx%dx%d does not fit the workspace's %d-element planes", t.tile_m, t.tile_n,
        t.tile_k, kSplitKTileElements));
  }
  if (p.split_k < 1 || p.split_k > kSplitKMaxSlices) {
    return absl::InvalidArgumentError(
        absl::StrFormat("gemm: split_k %d is outside 1..%d", p.split_k, kSplitKMaxSlices));
  }
  const int tiles = ceil_div(p.m, t.tile_m) * ceil_div(p.n, t.tile_n);
  if (tiles > kSplitKMaxTiles) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "gemm: M=%d N=%d needs %d tiles of %dx%d; the semaphore has %d slots", p.m, p.n, tiles,
        t.tile_m, t.tile_n, kSplitKMaxTiles));
  }
  const bool fp8 = p.a_type == DType::kFP8E4M3;
  if (p.a_type != p.b_type) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "gemm: A is %s but B is %s; both inputs must have one type", dtype_name(p.a_type),
        dtype_name(p.b_type)));
  }
  if (fp8 != (p.a_scale != nullptr) || fp8 != (p.b_scale != nullptr)) {
    return absl::InvalidArgumentError(
        fp8 ? "gemm: fp8 inputs need a per-row scale for A and a per-column scale for B"
            : "gemm: scales apply to fp8 inputs only");
  }
  if (p.c_type == DType::kFP8E4M3 || (fp8 && p.c_type != DType::kBF16)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "gemm: output type %s is not supported with %s inputs (outputs: bf16, or f32 for "
        "f32/bf16 inputs)",
        dtype_name(p.c_type), dtype_name(p.a_type)));
  }
  return absl::OkStatus();
}

absl::Status launch_split_k_gemm(DeviceRuntime& runtime, StreamHandle stream,
                                 const GemmProblem& problem, const SplitKBuffers& buffers,
                                 const GemmTiling& tiling) {
  CAPALLOC_RETURN_IF_ERROR(validate(problem, tiling));
  if (buffers.workspace == nullptr || buffers.semaphore == nullptr) {
    return absl::InvalidArgumentError("gemm: workspace and semaphore must be given");
  }
  const splitk::Params params = make_params(problem, buffers, tiling);
  KernelLaunch k;
  k.name = absl::StrFormat("splitk_gemm_%s", dtype_name(problem.a_type));
  k.reads = {{problem.a, element_bytes(problem.a_type) * problem.m * problem.k},
             {problem.b, element_bytes(problem.b_type) * problem.n * problem.k}};
  if (problem.a_scale != nullptr) k.reads.push_back({problem.a_scale, sizeof(float) * problem.m});
  if (problem.b_scale != nullptr) k.reads.push_back({problem.b_scale, sizeof(float) * problem.n});
  // The planes each slice writes before the last unit of its tile reads them
  // (scratch: write), and C (write). The semaphore slots in use are state:
  // each launch reads them first, counts on them being zero, and leaves them
  // zero for the next launch, so a clobber between launches is a wrong result.
  for (int s = 0; s < params.split_k; ++s) {
    k.writes.push_back({splitk::plane(params, s, 0),
                        sizeof(float) * splitk::kTileElements * params.tiles});
  }
  k.state.push_back({buffers.semaphore, sizeof(std::int32_t) * params.tiles});
  k.writes.push_back({problem.c, element_bytes(problem.c_type) * problem.m * problem.n});
  // Arguments by value, as a GPU launch takes them: nothing of the caller's
  // is referenced once the launch has run.
  k.host_body = [params] { run_units_on_host(params); };
  k.device_body = [params](RuntimeKind kind, void* native_stream) {
    return detail::launch_split_k_on_device(kind, params, native_stream);
  };
  return runtime.launch_kernel(stream, std::move(k));
}

// --- SplitKGemm ---------------------------------------------------------------

struct CAPALLOC_INTERNAL SplitKGemm::Impl {
  Allocator* allocator;
  DeviceRuntime* runtime;  // the allocator's graph and launch seam; null if it has none
  PersistentCache* cache;
  GemmTiling tiling;
  struct DeviceOrder {
    EventHandle event = 0;
    StreamHandle last_stream = kDefaultStream;
    bool launched = false;
    // The last launch is enqueued but `event` does not mark it (its record
    // failed, and so did waiting for it then): the next launch on another
    // stream synchronizes last_stream instead of waiting for the event.
    bool unmarked = false;
  };
  std::mutex mu;
  absl::flat_hash_map<int, DeviceOrder> order;  // guarded by mu
  // Devices whose semaphore preallocate_split_k allocated but failed to zero
  // (guarded by mu): buffers() refuses it, and run() warms it again.
  absl::flat_hash_set<int> unzeroed;
};

SplitKGemm::SplitKGemm(Allocator& allocator, PersistentCache& cache, GemmTiling tiling)
    : impl_(std::make_unique<Impl>()) {
  impl_->allocator = &allocator;
  impl_->runtime = allocator.device_runtime();
  impl_->cache = &cache;
  impl_->tiling = tiling;
}

SplitKGemm::~SplitKGemm() {
  for (auto& [device, o] : impl_->order) {
    if (o.event != 0) impl_->allocator->runtime().destroy_event(o.event).IgnoreError();
  }
}

absl::Status SplitKGemm::preallocate_split_k(int device, StreamHandle stream) {
  if (impl_->runtime == nullptr) {
    return absl::FailedPreconditionError(
        "split-K GEMM: the allocator's runtime cannot launch kernels (a MemoryRuntime only)");
  }
  DeviceRuntime& rt = *impl_->runtime;
  CAPALLOC_ASSIGN_OR_RETURN(const CaptureInfo info, rt.capture_info(stream));
  if (info.status != CaptureStatus::kNone) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "preallocate_split_k(%d): stream 0x%x is capturing (capture %d); warm the split-K "
        "buffers during warmup, before any capture",
        device, stream, info.id));
  }
  CAPALLOC_ASSIGN_OR_RETURN(void* ws, impl_->cache->preallocate(device, kWorkspaceKey,
                                                                kSplitKWorkspaceBytes));
  CAPALLOC_ASSIGN_OR_RETURN(void* sem, impl_->cache->preallocate(device, kSemaphoreKey,
                                                                 kSplitKSemaphoreBytes));
  (void)ws;
  // The split-K protocol reads the semaphore first: one whose zeroing
  // failed (its memory holds whatever was there) must not reach a launch.
  absl::Status zeroed = rt.memset_async(sem, 0, kSplitKSemaphoreBytes, stream);
  if (zeroed.ok()) zeroed = rt.synchronize_stream(stream);
  std::lock_guard lock(impl_->mu);
  if (zeroed.ok()) {
    impl_->unzeroed.erase(device);
  } else {
    impl_->unzeroed.insert(device);
  }
  return zeroed;
}

absl::StatusOr<SplitKBuffers> SplitKGemm::buffers(int device) const {
  {
    std::lock_guard lock(impl_->mu);
    if (impl_->unzeroed.contains(device)) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "the split-K semaphore of device %d was allocated but zeroing it failed; call "
          "SplitKGemm::preallocate_split_k(%d) again",
          device, device));
    }
  }
  auto ws = impl_->cache->get(device, kWorkspaceKey);
  auto sem = impl_->cache->get(device, kSemaphoreKey);
  if (!ws.ok() || !sem.ok()) {
    return absl::NotFoundError(absl::StrFormat(
        "the split-K workspace and semaphore of device %d are not preallocated; call "
        "SplitKGemm::preallocate_split_k(%d) during warmup",
        device, device));
  }
  return SplitKBuffers{static_cast<float*>(*ws), static_cast<std::int32_t*>(*sem)};
}

absl::Status SplitKGemm::run(int device, StreamHandle stream, const GemmProblem& problem) {
  CAPALLOC_RETURN_IF_ERROR(validate(problem, impl_->tiling));
  if (impl_->runtime == nullptr) {
    return absl::FailedPreconditionError(
        "split-K GEMM: the allocator's runtime cannot launch kernels (a MemoryRuntime only)");
  }
  DeviceRuntime& rt = *impl_->runtime;
  CAPALLOC_ASSIGN_OR_RETURN(const CaptureInfo info, rt.capture_info(stream));
  const bool capturing = info.status != CaptureStatus::kNone;
  auto buffers = this->buffers(device);
  if (!buffers.ok()) {
    if (capturing && !absl::IsNotFound(buffers.status())) return buffers.status();
    if (capturing) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "split-K GEMM on device %d: first call inside capture %d (stream 0x%x) with a cold "
          "buffer cache. Allocating the workspace and semaphore here would put them where a "
          "graph replay may write (seed 003). Fix: call SplitKGemm::preallocate_split_k(%d) "
          "during warmup, before any capture.",
          device, info.id, stream, device));
    }
    CAPALLOC_RETURN_IF_ERROR(preallocate_split_k(device, stream));
    buffers = this->buffers(device);
    if (!buffers.ok()) return buffers.status();
  }
  if (capturing) {
    // Recorded into a graph: its replays are ordered by whoever launches them.
    return launch_split_k_gemm(rt, stream, problem, *buffers, impl_->tiling);
  }
  std::lock_guard lock(impl_->mu);
  Impl::DeviceOrder& o = impl_->order[device];
  if (o.event == 0) {
    CAPALLOC_ASSIGN_OR_RETURN(o.event, rt.create_event(device));
  }
  if (o.launched && o.last_stream != stream) {
    // One workspace per device: wait for the previous launch's stream.
    if (o.unmarked) {
      CAPALLOC_RETURN_IF_ERROR(rt.synchronize_stream(o.last_stream));
      o.unmarked = false;
    } else {
      CAPALLOC_RETURN_IF_ERROR(rt.stream_wait_event(stream, o.event));
    }
  }
  CAPALLOC_RETURN_IF_ERROR(launch_split_k_gemm(rt, stream, problem, *buffers, impl_->tiling));
  // Enqueued: whatever happens to the event, the next launch on another
  // stream must come after this one.
  o.launched = true;
  o.last_stream = stream;
  if (absl::Status recorded = rt.record_event(o.event, stream); !recorded.ok()) {
    // The event still marks an earlier launch, if any: waiting for it would
    // not wait for this one. Wait for this one now; if that fails too, the
    // next launch on another stream synchronizes this stream first.
    o.unmarked = !rt.synchronize_stream(stream).ok();
    return recorded;
  }
  o.unmarked = false;
  return absl::OkStatus();
}

}  // namespace capalloc
