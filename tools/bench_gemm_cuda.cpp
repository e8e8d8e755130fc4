// tools/bench_gemm_cuda.cpp: capalloc's split-K GEMM against cuBLAS on the
// cuda runtime, on seed 003's shapes, timed with CUDA events in one run.
// Prints microseconds per GEMM for both and the ratio (capalloc / cuBLAS),
// and exits 1 if the two results differ by more than 0.1 anywhere. A
// program, not a test: it needs a GPU and makes no judgement on time.
//
//   capalloc_bench_gemm_cuda [--iters N]
//
// Both sides use bf16 inputs and output with fp32 accumulation (cuBLAS's
// cublasGemmEx, CUBLAS_COMPUTE_32F); capalloc runs split_k = 4.
//
// cuBLAS is loaded with dlopen, not linked: the GPU bundle
// (tools/gpu-bundle.sh) cannot carry its hundreds of MiB, and the GPU
// machine has it in the CUDA toolkit or in PyTorch's nvidia wheels. The
// library is $CAPALLOC_CUBLAS_LIBRARY if set, else libcublas.so.13 from the
// loader's search path. Without it the program exits 77 (skipped).
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <dlfcn.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "capalloc/allocator.hpp"
#include "capalloc/gemm.hpp"
#include "capalloc/persistent_cache.hpp"
#include "capalloc/runtime.hpp"
#include "common/config.hpp"
#include "gemm/numeric.hpp"
#include "tools/bench_support.hpp"

namespace {

[[noreturn]] void die(const std::string& what) {
  std::fprintf(stderr, "capalloc_bench_gemm_cuda: %s\n", what.c_str());
  std::exit(1);
}

void check(const absl::Status& s) {
  if (!s.ok()) die(s.ToString());
}

void check_cuda(cudaError_t e, const char* call) {
  if (e != cudaSuccess) die(std::string(call) + ": " + cudaGetErrorName(e));
}

void check_cublas(cublasStatus_t s, const char* call) {
  if (s != CUBLAS_STATUS_SUCCESS) die(std::string(call) + ": cuBLAS status " + std::to_string(s));
}

// The four cuBLAS entry points the comparison needs, resolved at run time.
struct Cublas {
  decltype(&cublasCreate_v2) create = nullptr;
  decltype(&cublasSetStream_v2) set_stream = nullptr;
  // cublasGemmEx is overloaded in C++ (a cublasComputeType_t and a legacy
  // cudaDataType form): name the C entry point's type.
  cublasStatus_t (*gemm_ex)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int,
                            const void*, const void*, cudaDataType, int, const void*, cudaDataType,
                            int, const void*, void*, cudaDataType, int, cublasComputeType_t,
                            cublasGemmAlgo_t) = nullptr;
  decltype(&cublasDestroy_v2) destroy = nullptr;
};

template <typename Fn>
void resolve(void* library, const char* name, Fn& out) {
  out = reinterpret_cast<Fn>(dlsym(library, name));
  if (out == nullptr) die(std::string("cuBLAS has no symbol ") + name);
}

Cublas load_cublas() {
  // CAPALLOC_CUBLAS_LIBRARY, read through common/config.hpp (README, configuration).
  const std::string path = capalloc::config::get_text(capalloc::config::Var::kCublasLibrary);
  void* library = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (library == nullptr) {
    std::fprintf(stderr,
                 "set CAPALLOC_CUBLAS_LIBRARY, or put the CUDA toolkit's lib64 on "
                 "LD_LIBRARY_PATH\n"
                 "result: skipped: cannot load cuBLAS (%s): %s\n",
                 path.c_str(), dlerror());
    std::exit(77);
  }
  Cublas api;
  resolve(library, "cublasCreate_v2", api.create);
  resolve(library, "cublasSetStream_v2", api.set_stream);
  resolve(library, "cublasGemmEx", api.gemm_ex);
  resolve(library, "cublasDestroy_v2", api.destroy);
  return api;
}

// One shape's buffers, shared by its two benchmarks and the comparison.
struct Shape {
  int m = 0, n = 0, k = 0;
  void* a = nullptr;
  void* b = nullptr;
  void* c_capalloc = nullptr;
  void* c_cublas = nullptr;
  std::string name() const {
    return "gemm/" + std::to_string(m) + "x" + std::to_string(n) + "x" + std::to_string(k);
  }
};

// Times `launches` back-to-back calls of `launch` on `stream` per iteration.
template <typename Launch>
void batch_benchmark(benchmark::State& state, cudaStream_t stream, int launches, Launch launch,
                     cudaEvent_t start, cudaEvent_t stop) {
  launch();  // warm
  check_cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  for (auto _ : state) {
    float ms = 0;
    check_cuda(cudaEventRecord(start, stream), "cudaEventRecord");
    for (int i = 0; i < launches; ++i) launch();
    check_cuda(cudaEventRecord(stop, stream), "cudaEventRecord");
    check_cuda(cudaEventSynchronize(stop), "cudaEventSynchronize");
    check_cuda(cudaEventElapsedTime(&ms, start, stop), "cudaEventElapsedTime");
    state.SetIterationTime(static_cast<double>(ms) / 1e3);
  }
  state.counters["launches"] = launches;
}

}  // namespace

int main(int argc, char** argv) {
  int iters = 50;
  int batches = 3;
  CLI::App app("capalloc_bench_gemm_cuda: capalloc's split-K GEMM against cuBLAS on the cuda "
               "runtime (needs a GPU; exit 77 when cuBLAS cannot be loaded)",
               "capalloc_bench_gemm_cuda");
  app.add_option("--iters", iters, "back-to-back launches per timed batch")
      ->check(CLI::Range(1, 1'000'000))
      ->capture_default_str();
  app.add_option("--batches", batches, "timed batches per benchmark (its iterations)")
      ->check(CLI::Range(1, 1'000'000))
      ->capture_default_str();
  if (int rc = capalloc::bench::parse_arguments(app, argc, argv); rc >= 0) return rc;
  capalloc::set_log_level("error").IgnoreError();
  // The device first: without one this is a failure, whether or not cuBLAS
  // is there; with one and no cuBLAS, the comparison is skipped.
  auto runtime = capalloc::make_runtime("cuda");
  if (!runtime.ok()) die(runtime.status().ToString());
  const Cublas cublas = load_cublas();
  auto allocator = capalloc::Allocator::create(*runtime);
  if (!allocator.ok()) die(allocator.status().ToString());
  capalloc::PersistentCache cache(**allocator);
  capalloc::SplitKGemm gemm(**allocator, cache);
  check(gemm.preallocate_split_k(0));
  capalloc::Allocator& a = **allocator;

  cudaStream_t stream;
  check_cuda(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
  const auto handle = reinterpret_cast<capalloc::StreamHandle>(stream);
  cublasHandle_t blas;
  check_cublas(cublas.create(&blas), "cublasCreate");
  check_cublas(cublas.set_stream(blas, stream), "cublasSetStream");
  cudaEvent_t start, stop;
  check_cuda(cudaEventCreate(&start), "cudaEventCreate");
  check_cuda(cudaEventCreate(&stop), "cudaEventCreate");

  std::vector<Shape> shapes;
  std::mt19937 rng(1);
  std::normal_distribution<float> normal(0.0f, 0.125f);
  for (int m : {1, 16, 64}) {
    for (auto [n, k] : {std::pair{2048, 2048}, std::pair{3584, 7168}}) {
      Shape s{.m = m, .n = n, .k = k};
      std::vector<std::uint16_t> ha(static_cast<std::size_t>(m) * k), hb(static_cast<std::size_t>(n) * k);
      for (auto& v : ha) v = capalloc::detail::float_to_bf16(normal(rng));
      for (auto& v : hb) v = capalloc::detail::float_to_bf16(normal(rng));
      auto da = a.allocate(ha.size() * 2, 0, handle);
      auto db = a.allocate(hb.size() * 2, 0, handle);
      auto dc1 = a.allocate(static_cast<std::size_t>(m) * n * 2, 0, handle);
      auto dc2 = a.allocate(static_cast<std::size_t>(m) * n * 2, 0, handle);
      if (!da.ok() || !db.ok() || !dc1.ok() || !dc2.ok()) die("allocation failed");
      check_cuda(cudaMemcpy(*da, ha.data(), ha.size() * 2, cudaMemcpyHostToDevice), "cudaMemcpy");
      check_cuda(cudaMemcpy(*db, hb.data(), hb.size() * 2, cudaMemcpyHostToDevice), "cudaMemcpy");
      s.a = *da;
      s.b = *db;
      s.c_capalloc = *dc1;
      s.c_cublas = *dc2;
      shapes.push_back(s);
    }
  }
  auto run_capalloc = [&](const Shape& s) {
    capalloc::GemmProblem p{.m = s.m, .n = s.n, .k = s.k, .a = s.a, .a_type = capalloc::DType::kBF16,
                            .b = s.b, .b_type = capalloc::DType::kBF16, .c = s.c_capalloc,
                            .c_type = capalloc::DType::kBF16, .split_k = 4};
    check(gemm.run(0, handle, p));
  };
  auto run_cublas = [&](const Shape& s) {
    const float alpha = 1.0f, beta = 0.0f;
    // Row-major C = A B^T is column-major C^T = B A^T.
    check_cublas(cublas.gemm_ex(blas, CUBLAS_OP_T, CUBLAS_OP_N, s.n, s.m, s.k, &alpha, s.b,
                                CUDA_R_16BF, s.k, s.a, CUDA_R_16BF, s.k, &beta, s.c_cublas,
                                CUDA_R_16BF, s.n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                 "cublasGemmEx");
  };
  for (const Shape& s : shapes) {
    benchmark::RegisterBenchmark((s.name() + "/capalloc").c_str(), [&, s](benchmark::State& st) {
      batch_benchmark(st, stream, iters, [&] { run_capalloc(s); }, start, stop);
    })->UseManualTime()->Unit(benchmark::kMicrosecond)->Iterations(batches);
    benchmark::RegisterBenchmark((s.name() + "/cublas").c_str(), [&, s](benchmark::State& st) {
      batch_benchmark(st, stream, iters, [&] { run_cublas(s); }, start, stop);
    })->UseManualTime()->Unit(benchmark::kMicrosecond)->Iterations(batches);
  }
  capalloc::bench::RunCollector collector;
  if (int rc = capalloc::bench::run_benchmarks(collector, "capalloc_bench_gemm_cuda"); rc != 0) {
    return rc;
  }

  std::printf("\n%4s %5s %5s %14s %12s %8s %12s\n", "M", "N", "K", "capalloc us", "cuBLAS us",
              "ratio", "max |diff|");
  bool mismatch = false;
  for (const Shape& s : shapes) {
    // Both once more, then compare (whatever the filter ran).
    run_capalloc(s);
    run_cublas(s);
    std::vector<std::uint16_t> c1(static_cast<std::size_t>(s.m) * s.n), c2(c1.size());
    check_cuda(cudaMemcpyAsync(c1.data(), s.c_capalloc, c1.size() * 2, cudaMemcpyDeviceToHost, stream),
               "cudaMemcpyAsync");
    check_cuda(cudaMemcpyAsync(c2.data(), s.c_cublas, c2.size() * 2, cudaMemcpyDeviceToHost, stream),
               "cudaMemcpyAsync");
    check_cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
    double max_diff = 0;
    for (std::size_t i = 0; i < c1.size(); ++i) {
      max_diff = std::max(max_diff, static_cast<double>(std::fabs(
                                        capalloc::detail::bf16_to_float(c1[i]) -
                                        capalloc::detail::bf16_to_float(c2[i]))));
    }
    // Both accumulate in fp32 and round to bf16; only summation order
    // differs. A gap beyond a few bf16 ulps of these magnitudes is a bug.
    if (max_diff > 0.1) mismatch = true;
    const double us_capalloc = collector.best_ns_per_iteration(s.name() + "/capalloc") / 1e3 / iters;
    const double us_cublas = collector.best_ns_per_iteration(s.name() + "/cublas") / 1e3 / iters;
    std::printf("%4d %5d %5d %14.1f %12.1f %8.2f %12.4g\n", s.m, s.n, s.k, us_capalloc, us_cublas,
                us_capalloc / us_cublas, max_diff);
    for (void* ptr : {s.a, s.b, s.c_capalloc, s.c_cublas}) check(a.deallocate(ptr));
  }
  std::printf("ratio = capalloc split-K / cuBLAS, time per GEMM, mean of %d batches of %d launches; "
              "lower is better\n",
              batches, iters);
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  cublas.destroy(blas);
  cudaStreamDestroy(stream);
  if (mismatch) {
    std::fprintf(stderr, "capalloc_bench_gemm_cuda: results differ from cuBLAS by more than 0.1\n");
    return 1;
  }
  return 0;
}
