// tools/bench_alloc.cpp: ns per allocate+deallocate pair, capalloc against
// glibc malloc, on the same seeded traces, in one run. Measured through
// Google Benchmark (one iteration replays a whole trace; a warm-up pass runs
// before the timed ones); the ratio table after its output is computed from
// those runs. Makes no pass/fail judgement on time (timing belongs in
// benchmarks, not tests).
//
//   capalloc_bench_alloc [--ops N] [--seed S] [--iterations N] [--repetitions R]
//                        [--benchmark_...]
//
// Traces: "small" (tensor-like sizes up to 64 KiB, up to 256 live),
// "mixed" (as small, plus 1/16 of requests between 64 KiB and 8 MiB), and
// "lifo" (allocate then free at once, the steady-state of a training step).
// capalloc runs on the host runtime with one stream; device memory is host
// memory there, so both allocators hand out the same kind of pointer.
#include <cstdio>
#include <cstdlib>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "capalloc/allocator.hpp"
#include "capalloc/runtime.hpp"
#include "tools/bench_support.hpp"

namespace {

struct Op {
  bool alloc;
  std::size_t size;  // for alloc
  std::size_t slot;  // which live slot to fill or free
};

std::vector<Op> make_trace(const std::string& kind, std::size_t ops, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<Op> trace;
  trace.reserve(ops);
  const std::size_t max_live = 256;
  std::vector<std::size_t> free_slots, used_slots;
  for (std::size_t i = 0; i < max_live; ++i) free_slots.push_back(max_live - 1 - i);
  auto size = [&] {
    if (kind == "mixed" && rng() % 16 == 0) return std::size_t{65536} + rng() % (8u << 20);
    return std::size_t{1} + rng() % 65536;
  };
  while (trace.size() < ops) {
    if (kind == "lifo") {
      trace.push_back({true, size(), 0});
      trace.push_back({false, 0, 0});
      continue;
    }
    const bool alloc = !free_slots.empty() && (used_slots.empty() || rng() % 2 == 0);
    if (alloc) {
      const std::size_t slot = free_slots.back();
      free_slots.pop_back();
      used_slots.push_back(slot);
      trace.push_back({true, size(), slot});
    } else {
      const std::size_t k = rng() % used_slots.size();
      const std::size_t slot = used_slots[k];
      used_slots[k] = used_slots.back();
      used_slots.pop_back();
      free_slots.push_back(slot);
      trace.push_back({false, 0, slot});
    }
  }
  for (std::size_t slot : used_slots) trace.push_back({false, 0, slot});
  return trace;
}

// Replays `trace` once; returns the number of allocations it made.
template <typename Alloc, typename Free>
std::size_t replay(const std::vector<Op>& trace, Alloc&& alloc, Free&& release) {
  std::vector<void*> slots(256, nullptr);
  std::size_t pairs = 0;
  for (const Op& op : trace) {
    if (op.alloc) {
      slots[op.slot] = alloc(op.size);
      // The const overload (an input to an empty asm): libbenchmark 1.7's
      // read-write overload has been seen to clobber the pointer with GCC 12.
      benchmark::DoNotOptimize(static_cast<void* const&>(slots[op.slot]));
      ++pairs;
    } else {
      release(slots[op.slot]);
    }
  }
  return pairs;
}

// One benchmark: every iteration replays `trace` through alloc/release.
template <typename Alloc, typename Free>
void replay_benchmark(benchmark::State& state, const std::vector<Op>& trace, Alloc alloc,
                      Free release, const bool& failed) {
  const std::size_t pairs = replay(trace, alloc, release);  // warm-up: grows pools and tables
  for (auto _ : state) replay(trace, alloc, release);
  if (failed) state.SkipWithError("capalloc failed an operation");
  state.counters["pairs"] = static_cast<double>(pairs);
  state.counters["per_pair"] = benchmark::Counter(
      static_cast<double>(pairs), benchmark::Counter::kIsIterationInvariantRate |
                                      benchmark::Counter::kInvert);
}

}  // namespace

int main(int argc, char** argv) {
  std::size_t ops = 2'000'000;
  std::uint64_t seed = 42;
  std::int64_t iterations = 0;  // 0: Google Benchmark picks (--benchmark_min_time)
  int repetitions = 3;
  CLI::App app("capalloc_bench_alloc: ns per allocate+free pair, capalloc (host runtime) against "
               "glibc malloc on seeded traces (small, mixed, lifo), measured in the same run",
               "capalloc_bench_alloc");
  app.add_option("--ops", ops, "operations per trace")
      ->check(CLI::Range(std::size_t{2}, std::size_t{1} << 32))
      ->capture_default_str();
  app.add_option("--seed", seed, "the traces' seed")->capture_default_str();
  app.add_option("--iterations", iterations,
                 "trace replays per measurement (0: as many as --benchmark_min_time takes)")
      ->check(CLI::Range(std::int64_t{0}, std::int64_t{1} << 40))
      ->capture_default_str();
  app.add_option("--repetitions", repetitions,
                 "measurements per benchmark; the table takes the best")
      ->check(CLI::Range(1, 1000))
      ->capture_default_str();
  if (int rc = capalloc::bench::parse_arguments(app, argc, argv); rc >= 0) return rc;

  auto host = capalloc::bench::make_host_allocator();
  if (!host) return 1;
  capalloc::Allocator& a = *host->allocator;
  bool failed = false;
  auto capalloc_alloc = [&a, &failed](std::size_t n) {
    auto p = a.allocate(n);
    if (!p.ok()) failed = true;
    return p.ok() ? *p : nullptr;
  };
  auto capalloc_free = [&a, &failed](void* p) {
    if (!a.deallocate(p).ok()) failed = true;
  };
  auto malloc_alloc = [](std::size_t n) { return std::malloc(n); };
  auto malloc_free = [](void* p) { std::free(p); };
  const bool malloc_never_fails = false;

  const char* kinds[] = {"small", "mixed", "lifo"};
  std::map<std::string, std::vector<Op>> traces;
  for (const char* kind : kinds) {
    traces[kind] = make_trace(kind, ops, seed);
    auto configure = [&](benchmark::internal::Benchmark* b) {
      b->Unit(benchmark::kMillisecond)->Repetitions(repetitions);
      if (iterations > 0) b->Iterations(iterations);
    };
    configure(benchmark::RegisterBenchmark(
        (std::string("alloc/") + kind + "/capalloc").c_str(), [&, kind](benchmark::State& state) {
          replay_benchmark(state, traces.at(kind), capalloc_alloc, capalloc_free, failed);
        }));
    configure(benchmark::RegisterBenchmark(
        (std::string("alloc/") + kind + "/malloc").c_str(), [&, kind](benchmark::State& state) {
          replay_benchmark(state, traces.at(kind), malloc_alloc, malloc_free, malloc_never_fails);
        }));
  }

  capalloc::bench::RunCollector collector;
  if (int rc = capalloc::bench::run_benchmarks(collector, "capalloc_bench_alloc"); rc != 0) return rc;

  std::printf("\n%-7s %12s %14s %18s %8s\n", "trace", "ops", "capalloc ns", "glibc malloc ns",
              "ratio");
  for (const char* kind : kinds) {
    const std::string base = std::string("alloc/") + kind;
    if (!collector.has(base + "/capalloc") || !collector.has(base + "/malloc")) continue;
    const double pairs = collector.counter(base + "/capalloc", "pairs");
    const double capalloc_ns = collector.best_ns_per_iteration(base + "/capalloc") / pairs;
    const double malloc_ns = collector.best_ns_per_iteration(base + "/malloc") / pairs;
    std::printf("%-7s %12zu %14.1f %18.1f %8.2f\n", kind, traces.at(kind).size(), capalloc_ns,
                malloc_ns, capalloc_ns / malloc_ns);
  }
  std::printf("ratio = capalloc / glibc malloc, best of %d measurements after a warm-up pass; "
              "lower is better\n",
              repetitions);
  return 0;
}
