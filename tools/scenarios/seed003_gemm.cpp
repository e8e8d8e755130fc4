// tools/scenarios/seed003_gemm.cpp: see seed003_gemm.hpp. The flow mirrors
// the seed's aiter script (build, warmup, decoy, g1, g2, trial); comments
// quote it where it helps.
#include "tools/scenarios/seed003_gemm.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_format.h"
#include "common/status_macros.hpp"
#include "capalloc/allocator.hpp"
#include "capalloc/gemm.hpp"
#include "gemm/numeric.hpp"
#include "tools/scenarios/kernels.hpp"
#include "tools/scenarios/scenario_world.hpp"

namespace capalloc::scenarios {

namespace {

constexpr int M = kGemmM;
constexpr int N = kGemmN;
constexpr int K = kGemmK;
// WS_ELEMS of the seed: the decoy's src and T are as big as the workspace.
constexpr std::size_t kDecoyElements = kSplitKWorkspaceBytes / sizeof(float);
constexpr float kPoison = -777.0f;
constexpr double kWrongThreshold = 0.05;

// torch.randn / torch.rand stand-ins: seeded, the same on every platform.
class Rng {
 public:
  explicit Rng(std::uint64_t seed) : gen_(seed) {}
  double uniform() { return static_cast<double>(gen_() >> 11) * 0x1.0p-53; }
  double normal() {  // Box-Muller
    const double u1 = std::max(uniform(), 1e-300);
    const double u2 = uniform();
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * 3.14159265358979323846 * u2);
  }

 private:
  std::mt19937_64 gen_;
};

// build(): a, b in fp8 from randn / 8; per-row and per-column scales from
// rand + 0.5; the reference in double, rounded to bf16. The same for every
// arm (seeded), so built once per process: it costs more than an arm's
// GEMMs on the host runtime, and the fault-injection sweep runs hundreds of
// arms.
struct GemmInputs {
  std::vector<std::uint8_t> a, b;
  std::vector<float> xs, wsc, ref;
};

const GemmInputs& gemm_inputs() {
  static const GemmInputs inputs = [] {
    Rng rng(0);
    GemmInputs in;
    auto& [a, b, xs, wsc, ref] = in;
    a.resize(static_cast<std::size_t>(M) * K);
    b.resize(static_cast<std::size_t>(N) * K);
    for (auto& v : a) v = detail::float_to_fp8_e4m3(static_cast<float>(rng.normal() / 8));
    for (auto& v : b) v = detail::float_to_fp8_e4m3(static_cast<float>(rng.normal() / 8));
    xs.resize(M);
    wsc.resize(N);
    for (auto& v : xs) v = static_cast<float>(rng.uniform() + 0.5);
    for (auto& v : wsc) v = static_cast<float>(rng.uniform() + 0.5);
    ref.resize(static_cast<std::size_t>(M) * N);
    for (int i = 0; i < M; ++i) {
      for (int j = 0; j < N; ++j) {
        double sum = 0;
        for (int k = 0; k < K; ++k) {
          const std::uint8_t av = a[static_cast<std::size_t>(i) * K + k];
          const std::uint8_t bv = b[static_cast<std::size_t>(j) * K + k];
          sum += static_cast<double>(detail::fp8_e4m3_to_float(av)) * detail::fp8_e4m3_to_float(bv);
        }
        const float value = static_cast<float>(sum * xs[i] * wsc[j]);
        ref[static_cast<std::size_t>(i) * N + j] =
            detail::bf16_to_float(detail::float_to_bf16(value));
      }
    }
    return in;
  }();
  return inputs;
}

// One arm's world (scenario_world.hpp), its GEMM and its one graph pool.
class GemmWorld : public ScenarioWorld {
 public:
  static absl::StatusOr<std::unique_ptr<GemmWorld>> create(std::shared_ptr<DeviceRuntime> rt,
                                                           const GemmScenarioOptions& options) {
    auto w = std::unique_ptr<GemmWorld>(new GemmWorld());
    CAPALLOC_RETURN_IF_ERROR(w->open(std::move(rt), options));
    w->gemm_ = std::make_unique<SplitKGemm>(w->allocator(), w->cache());
    CAPALLOC_ASSIGN_OR_RETURN(w->pool_, w->pool());
    return w;
  }
  // The GEMM goes after the work and before the cache that holds its buffers.
  ~GemmWorld() { release_work(); }

  SplitKGemm& gemm() { return *gemm_; }

  // Host data into device memory, on the default stream.
  template <typename T>
  absl::StatusOr<T*> upload(const std::vector<T>& host, std::string_view tag) {
    CAPALLOC_ASSIGN_OR_RETURN(void* p, alloc(host.size() * sizeof(T), kDefaultStream, tag));
    CAPALLOC_RETURN_IF_ERROR(rt_->memcpy_async(p, host.data(), host.size() * sizeof(T), kDefaultStream));
    CAPALLOC_RETURN_IF_ERROR(rt_->synchronize_stream(kDefaultStream));
    return static_cast<T*>(p);
  }
  template <typename T>
  absl::StatusOr<std::vector<T>> download(const T* p, std::size_t count) {
    std::vector<T> host(count);
    CAPALLOC_RETURN_IF_ERROR(rt_->memcpy_async(host.data(), p, count * sizeof(T), kDefaultStream));
    CAPALLOC_RETURN_IF_ERROR(rt_->synchronize_stream(kDefaultStream));
    return host;
  }

  // Every capture of the scenario goes into its one pool.
  absl::StatusOr<CaptureResult> capture(std::string label,
                                        const std::function<absl::Status()>& body) {
    return ScenarioWorld::capture(pool_, std::move(label), body);
  }
  absl::Status replay(GraphHandle g) {
    bool refused = false;
    CAPALLOC_RETURN_IF_ERROR(replay_once(g, refused));
    return rt_->synchronize_stream(kDefaultStream);
  }

 private:
  GemmWorld() = default;
  std::unique_ptr<SplitKGemm> gemm_;
  PoolHandle pool_ = kDefaultPool;
};

// The status quo: _get_preshuffle_split_buffers, an lru_cache keyed on
// (device, stream). A miss allocates both buffers as ordinary transient
// blocks on the calling stream and zeroes the semaphore there: inside a
// capture, both the allocation and the zeroing land in the graph.
class StreamKeyedBuffers {
 public:
  explicit StreamKeyedBuffers(GemmWorld& w) : w_(w) {}
  absl::StatusOr<SplitKBuffers> get(StreamHandle stream) {
    if (auto it = cache_.find(stream); it != cache_.end()) return it->second;
    CAPALLOC_ASSIGN_OR_RETURN(void* ws, w_.alloc(kSplitKWorkspaceBytes, stream, "splitk.workspace"));
    CAPALLOC_ASSIGN_OR_RETURN(void* sem, w_.alloc(kSplitKSemaphoreBytes, stream, "splitk.semaphore"));
    // semaphore = torch.zeros(...): a memset on the stream, captured if capturing.
    CAPALLOC_RETURN_IF_ERROR(w_.rt().memset_async(sem, 0, kSplitKSemaphoreBytes, stream));
    SplitKBuffers b{static_cast<float*>(ws), static_cast<std::int32_t*>(sem)};
    cache_.emplace(stream, b);
    return b;
  }

 private:
  GemmWorld& w_;
  absl::flat_hash_map<StreamHandle, SplitKBuffers> cache_;
};

}  // namespace

absl::StatusOr<GemmArmResult> run_gemm_arm(bool status_quo, std::shared_ptr<DeviceRuntime> runtime,
                                           GemmScenarioOptions options) {
  GemmArmResult result;
  result.arm = status_quo ? "status_quo" : "capalloc";
  result.strict = options.strict;
  CAPALLOC_ASSIGN_OR_RETURN(auto world, GemmWorld::create(std::move(runtime), options));
  GemmWorld& w = *world;

  const GemmInputs& inputs = gemm_inputs();
  const std::vector<std::uint8_t>& a = inputs.a;
  const std::vector<std::uint8_t>& b = inputs.b;
  const std::vector<float>& xs = inputs.xs;
  const std::vector<float>& wsc = inputs.wsc;
  const std::vector<float>& ref = inputs.ref;
  CAPALLOC_ASSIGN_OR_RETURN(std::uint8_t * a_dev, w.upload(a, "a"));
  CAPALLOC_ASSIGN_OR_RETURN(std::uint8_t * b_dev, w.upload(b, "b"));
  CAPALLOC_ASSIGN_OR_RETURN(float* xs_dev, w.upload(xs, "xs"));
  CAPALLOC_ASSIGN_OR_RETURN(float* wsc_dev, w.upload(wsc, "wsc"));

  StreamKeyedBuffers stream_keyed(w);
  auto run = [&](void* out, StreamHandle stream) -> absl::Status {
    GemmProblem p{.m = M, .n = N, .k = K, .a = a_dev, .a_type = DType::kFP8E4M3, .b = b_dev,
                  .b_type = DType::kFP8E4M3, .a_scale = xs_dev, .b_scale = wsc_dev, .c = out,
                  .c_type = DType::kBF16, .split_k = kGemmSplitK};
    if (status_quo) {
      CAPALLOC_ASSIGN_OR_RETURN(SplitKBuffers buffers, stream_keyed.get(stream));
      return launch_split_k_gemm(w.rt(), stream, p, buffers);
    }
    absl::Status s = w.gemm().run(0, stream, p);
    w.record_step();
    return s;
  };
  const std::size_t out_bytes = static_cast<std::size_t>(M) * N * sizeof(std::uint16_t);

  // Warm up on the compute stream; the fixed arm preallocates first.
  if (!status_quo) CAPALLOC_RETURN_IF_ERROR(w.gemm().preallocate_split_k(0));
  w.record_step();
  CAPALLOC_ASSIGN_OR_RETURN(void* warm_out, w.alloc(out_bytes, kDefaultStream, "warmup.out"));
  CAPALLOC_RETURN_IF_ERROR(run(warm_out, kDefaultStream));
  CAPALLOC_RETURN_IF_ERROR(w.rt().synchronize_stream(kDefaultStream));

  // src = torch.full((WS_ELEMS,), 3.0); the decoy graph: T = src * 2.0;
  // t_ptr; total = T.sum(); del T, total.
  CAPALLOC_ASSIGN_OR_RETURN(void* src, w.alloc(kDecoyElements * sizeof(float), kDefaultStream, "src"));
  CAPALLOC_RETURN_IF_ERROR(
      w.rt().launch_kernel(kDefaultStream, fill_kernel(static_cast<float*>(src), kDecoyElements, 3.0f)));
  CAPALLOC_RETURN_IF_ERROR(w.rt().synchronize_stream(kDefaultStream));
  void* t_ptr = nullptr;
  CAPALLOC_ASSIGN_OR_RETURN(CaptureResult decoy, w.capture("decoy", [&]() -> absl::Status {
    CAPALLOC_ASSIGN_OR_RETURN(void* t, w.alloc(kDecoyElements * sizeof(float), w.side(), "T"));
    t_ptr = t;
    CAPALLOC_RETURN_IF_ERROR(w.rt().launch_kernel(
        w.side(), scale_kernel(static_cast<float*>(t), static_cast<float*>(src), kDecoyElements, 2.0f)));
    CAPALLOC_ASSIGN_OR_RETURN(void* total, w.alloc(sizeof(float), w.side(), "total"));
    CAPALLOC_RETURN_IF_ERROR(w.rt().launch_kernel(
        w.side(), sum_kernel(static_cast<float*>(total), static_cast<float*>(t), kDecoyElements)));
    CAPALLOC_RETURN_IF_ERROR(w.del(t));
    return w.del(total);
  }));
  CAPALLOC_ASSIGN_OR_RETURN(void* out1, w.alloc(out_bytes, kDefaultStream, "out1"));
  CAPALLOC_ASSIGN_OR_RETURN(CaptureResult g1, w.capture("g1", [&] { return run(out1, w.side()); }));
  CAPALLOC_ASSIGN_OR_RETURN(void* out2, w.alloc(out_bytes, kDefaultStream, "out2"));
  CAPALLOC_ASSIGN_OR_RETURN(CaptureResult g2, w.capture("g2", [&] { return run(out2, w.side()); }));
  // The verdict before any replay: every graph against the live blocks, once
  // all three exist (g2 reading the semaphore first is what makes the
  // decoy's clobber of it a hazard).
  result.findings_before_replay = w.tracker().check();

  SplitKBuffers buffers;
  if (status_quo) {
    CAPALLOC_ASSIGN_OR_RETURN(buffers, stream_keyed.get(w.side()));
  } else {
    CAPALLOC_ASSIGN_OR_RETURN(buffers, w.gemm().buffers(0));
  }
  const bool aliases = static_cast<void*>(buffers.workspace) == t_ptr;

  // trial(): sem.fill_(0); decoy replay; count dirty slots; out.fill_(POISON);
  // g.replay(); count wrong outputs.
  auto trial = [&](const std::string& name, GraphHandle g, void* out) -> absl::StatusOr<GemmGraphOutcome> {
    GemmGraphOutcome o;
    o.graph = name;
    o.workspace_aliases_decoy = aliases;
    o.total_outputs = M * N;
    CAPALLOC_RETURN_IF_ERROR(w.rt().memset_async(buffers.semaphore, 0, kSplitKSemaphoreBytes, kDefaultStream));
    CAPALLOC_RETURN_IF_ERROR(w.rt().synchronize_stream(kDefaultStream));
    if (absl::Status s = w.replay(decoy.graph); !s.ok()) {
      // Strict mode refuses a replay with hazards; anything else is a failure.
      if (!options.strict || s.code() != absl::StatusCode::kFailedPrecondition) return s;
      o.decoy_replay_refused = true;
    }
    CAPALLOC_ASSIGN_OR_RETURN(std::vector<std::int32_t> sem, w.download(buffers.semaphore, kSplitKMaxTiles));
    for (int i = 0; i < kSplitKMaxTiles; ++i) {
      if (sem[i] != 0) {
        ++o.sem_slots_dirtied;
        if (i < kGemmTilesInUse) ++o.sem_slots_dirtied_in_use;
      }
    }
    if (name == "g1") result.dirty_slot_value = static_cast<std::uint32_t>(sem[0]);
    std::vector<std::uint16_t> poison(static_cast<std::size_t>(M) * N, detail::float_to_bf16(kPoison));
    CAPALLOC_RETURN_IF_ERROR(w.rt().memcpy_async(out, poison.data(), out_bytes, kDefaultStream));
    CAPALLOC_RETURN_IF_ERROR(w.rt().synchronize_stream(kDefaultStream));
    CAPALLOC_RETURN_IF_ERROR(w.replay(g));
    CAPALLOC_ASSIGN_OR_RETURN(std::vector<std::uint16_t> got,
                              w.download(static_cast<std::uint16_t*>(out), static_cast<std::size_t>(M) * N));
    for (std::size_t i = 0; i < got.size(); ++i) {
      const double err = std::fabs(static_cast<double>(detail::bf16_to_float(got[i])) - ref[i]);
      if (err > kWrongThreshold) ++o.wrong_outputs;
      o.max_abs_err = std::max(o.max_abs_err, err);
    }
    return o;
  };
  CAPALLOC_ASSIGN_OR_RETURN(GemmGraphOutcome o1, trial("g1", g1.graph, out1));
  CAPALLOC_ASSIGN_OR_RETURN(GemmGraphOutcome o2, trial("g2", g2.graph, out2));
  result.graphs = {o1, o2};

  // The seed's expectations.
  auto expect = [&](bool ok, std::string what) {
    if (!ok) result.mismatches.push_back(std::move(what));
  };
  // The findings the seed's failure must produce: the decoy's clobber of
  // the semaphore is a hazard (the GEMM graphs read it first: state), that
  // of the workspace the lower severity (the GEMM graphs write it first:
  // scratch).
  auto finding_on = [&](std::string_view tag) -> const Finding* {
    for (const Finding& f : result.findings_before_replay) {
      if (f.graph_label == "decoy" && f.victim.tag == tag) return &f;
    }
    return nullptr;
  };
  if (status_quo) {
    const Finding* sem = finding_on("splitk.semaphore");
    const Finding* ws = finding_on("splitk.workspace");
    expect(sem != nullptr && sem->severity == Severity::kHazard,
           "the decoy's clobber of splitk.semaphore should be a hazard (read first: state)");
    expect(ws != nullptr && ws->severity == Severity::kCrossGraphOutput,
           "the decoy's clobber of splitk.workspace should be cross_graph_output (scratch)");
    expect(aliases, "the workspace should alias the decoy's freed transient");
    if (options.strict) {
      for (const GemmGraphOutcome& o : result.graphs) {
        expect(o.decoy_replay_refused, o.graph + ": strict mode should refuse the decoy's replay");
        expect(o.sem_slots_dirtied == 0, o.graph + ": no semaphore slot should be dirtied");
        expect(o.wrong_outputs == 0, o.graph + ": no output should be wrong");
      }
    } else {
      expect(o1.wrong_outputs == 0,
             absl::StrFormat("g1 (self-zeroing) should be right, %d wrong", o1.wrong_outputs));
      expect(o2.sem_slots_dirtied_in_use >= 1, "the decoy replay should dirty a semaphore slot in use");
      expect(o2.wrong_outputs == 64 * o2.sem_slots_dirtied_in_use,
             absl::StrFormat("g2 should have 64 x %d dirty slots = %d wrong outputs, saw %d",
                             o2.sem_slots_dirtied_in_use, 64 * o2.sem_slots_dirtied_in_use,
                             o2.wrong_outputs));
    }
  } else {
    expect(!aliases, "preallocated buffers should not alias the decoy");
    for (const GemmGraphOutcome& o : result.graphs) {
      expect(!o.decoy_replay_refused, o.graph + ": nothing should be refused");
      expect(o.sem_slots_dirtied == 0, o.graph + ": no semaphore slot should be dirtied");
      expect(o.wrong_outputs == 0, o.graph + ": no output should be wrong");
    }
    expect(result.findings_before_replay.empty(), "capalloc's arm should have no finding");
  }
  result.expected_match = result.mismatches.empty();
  return result;
}

}  // namespace capalloc::scenarios
