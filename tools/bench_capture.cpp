// tools/bench_capture.cpp: what capture awareness costs, measured in one run.
//
//   capalloc_bench_capture [--pairs N] [--captures C] [--blocks B] [--keep-every K]
//
// 1. ns per allocate+free pair on a stream outside any capture, against the
//    same pair on a stream inside a capture (routed to a graph pool, seen by
//    the tracker). Goal: inside at most 2x outside.
// 2. The capture-end check: C captures of B blocks each into one shared pool
//    (each block written by a declared kernel; 9 in 10 freed during the
//    capture, the rest left live as outputs; --keep-every), the total time spent in
//    CaptureTracker::end_capture and, of that, in the runtime's own
//    end_capture. Goal: under 5 ms in all for 100 x 100.
// Prints figures only; no pass/fail (timing belongs here, not in tests).
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "capalloc/allocator.hpp"
#include "capalloc/capture.hpp"
#include "capalloc/runtime.hpp"
#include "tools/bench_support.hpp"

namespace {

using Clock = std::chrono::steady_clock;

double ns_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::nano>(Clock::now() - t0).count();
}

[[noreturn]] void die(const absl::Status& s) {
  std::fprintf(stderr, "capalloc_bench_capture: %s\n", s.ToString().c_str());
  std::exit(1);
}

template <typename T>
T must(absl::StatusOr<T> v) {
  if (!v.ok()) die(v.status());
  return *std::move(v);
}

void must(const absl::Status& s) {
  if (!s.ok()) die(s);
}

// ns per allocate+free pair of a fixed size mix on `stream`.
double pair_cost(capalloc::Allocator& a, capalloc::StreamHandle stream, std::size_t pairs) {
  static const std::size_t sizes[] = {512, 4096, 65536, 1 << 20, 3000, 100000};
  std::vector<void*> held(8);
  const auto t0 = Clock::now();
  for (std::size_t i = 0; i < pairs; ++i) {
    void*& slot = held[i % held.size()];
    if (slot != nullptr) must(a.deallocate(slot));
    slot = must(a.allocate(sizes[i % 6], 0, stream));
  }
  for (void*& p : held) {
    if (p != nullptr) must(a.deallocate(p));
    p = nullptr;
  }
  return ns_since(t0) / static_cast<double>(pairs);
}

struct Scenario {
  int captures = 100;
  int blocks = 100;
  int keep_every = 10;  // one block in `keep_every` stays live as an output
};

// Part 2 once: C captures of B blocks into one shared pool. Manual time: the
// total spent in CaptureTracker::end_capture. Counters: the runtime's own
// share, the check() of all graphs, findings and the tracker's work.
void capture_end_check(benchmark::State& state, capalloc::DeviceRuntime& runtime,
                       capalloc::Allocator& allocator, capalloc::CaptureTracker& tracker,
                       capalloc::StreamHandle stream, const Scenario& sc) {
  double runtime_end = 0, check_ns = 0, findings = 0, on_demand = 0, victims = 0, accesses = 0;
  for (auto _ : state) {
    const capalloc::PoolHandle pool = must(allocator.create_graph_pool(0));
    std::mt19937_64 rng(5);
    std::vector<capalloc::GraphHandle> graphs;
    std::vector<void*> outputs;
    double end_total = 0;
    const capalloc::TrackerWork work_before = tracker.work();
    for (int c = 0; c < sc.captures; ++c) {
      must(tracker.begin_capture(0, stream, {.pool = pool}).status());
      std::vector<void*> mine;
      for (int b = 0; b < sc.blocks; ++b) {
        const std::size_t bytes = 4096 + (rng() % 16) * 4096;
        void* p = must(allocator.allocate(bytes, 0, stream, {.tag = "act"}));
        capalloc::KernelLaunch k;
        k.name = "write";
        k.writes = {{p, bytes}};
        k.host_body = [] {};
        must(runtime.launch_kernel(stream, std::move(k)));
        mine.push_back(p);
        // Free all but one in `keep_every` during the capture, as activations are.
        if ((sc.keep_every <= 0 || b % sc.keep_every != sc.keep_every - 1) && mine.size() >= 2) {
          must(allocator.deallocate(mine[mine.size() - 2]));
          mine.erase(mine.end() - 2);
        }
      }
      const auto t0 = Clock::now();
      auto done = must(tracker.end_capture(stream));
      end_total += ns_since(t0);
      findings += static_cast<double>(done.new_findings.size());
      graphs.push_back(done.graph);
      for (void* p : mine) outputs.push_back(p);
    }
    const capalloc::TrackerWork work_after = tracker.work();
    victims += static_cast<double>(work_after.victims - work_before.victims);
    accesses += static_cast<double>(work_after.accesses - work_before.accesses);
    // The runtime's share, measured alone on the same shape of capture.
    for (int c = 0; c < sc.captures; ++c) {
      must(runtime.begin_capture(stream, capalloc::CaptureMode::kGlobal).status());
      for (int b = 0; b < sc.blocks; ++b) {
        capalloc::KernelLaunch k;
        k.name = "write";
        k.writes = {{outputs[0], 4096}};
        k.host_body = [] {};
        must(runtime.launch_kernel(stream, std::move(k)));
      }
      const auto t0 = Clock::now();
      auto g = must(runtime.end_capture(stream));
      runtime_end += ns_since(t0);
      must(runtime.destroy_graph(g));
    }
    const auto t_check = Clock::now();
    on_demand += static_cast<double>(tracker.check().size());
    check_ns += ns_since(t_check);
    for (void* p : outputs) must(allocator.deallocate(p));
    for (auto g : graphs) must(tracker.destroy_graph(g));
    must(allocator.release_graph_pool(pool));
    state.SetIterationTime(end_total / 1e9);
  }
  // Per scenario run (iteration).
  const double runs = static_cast<double>(state.iterations());
  state.counters["runtime_end_ms"] = runtime_end / 1e6 / runs;
  state.counters["check_ms"] = check_ns / 1e6 / runs;
  state.counters["findings"] = findings / runs;
  state.counters["check_findings"] = on_demand / runs;
  state.counters["victims"] = victims / runs;
  state.counters["accesses"] = accesses / runs;
}

}  // namespace

int main(int argc, char** argv) {
  std::size_t pairs = 200000;
  Scenario sc;
  std::int64_t iterations = 0;  // 0: Google Benchmark picks (--benchmark_min_time)
  int repetitions = 3;
  CLI::App app("capalloc_bench_capture: what capture awareness costs (allocation inside against "
               "outside a capture; the capture-end check of many captures in one shared pool)",
               "capalloc_bench_capture");
  app.add_option("--pairs", pairs, "allocate+free pairs per measurement of part 1")
      ->check(CLI::Range(std::size_t{1}, std::size_t{1} << 40))
      ->capture_default_str();
  app.add_option("--captures", sc.captures, "captures in part 2")
      ->check(CLI::Range(1, 1'000'000))
      ->capture_default_str();
  app.add_option("--blocks", sc.blocks, "blocks allocated per capture in part 2")
      ->check(CLI::Range(1, 1'000'000))
      ->capture_default_str();
  app.add_option("--keep-every", sc.keep_every,
                 "one block in K stays live as a capture output (0: every block)")
      ->check(CLI::Range(0, 1'000'000))
      ->capture_default_str();
  app.add_option("--iterations", iterations,
                 "part 1: measurements of --pairs pairs per repetition (0: as many as "
                 "--benchmark_min_time takes); part 2 runs once per repetition")
      ->check(CLI::Range(std::int64_t{0}, std::int64_t{1} << 40))
      ->capture_default_str();
  app.add_option("--repetitions", repetitions, "part 1's repetitions; the summary takes the best")
      ->check(CLI::Range(1, 1000))
      ->capture_default_str();
  if (int rc = capalloc::bench::parse_arguments(app, argc, argv); rc >= 0) return rc;

  const double pair_count = static_cast<double>(pairs);
  capalloc::set_log_level("error").IgnoreError();
  auto runtime = must(capalloc::make_host_runtime());
  auto allocator = must(capalloc::Allocator::create(runtime));
  auto tracker = must(capalloc::CaptureTracker::create(*allocator));
  const capalloc::StreamHandle stream = must(runtime->create_stream(0));
  capalloc::Allocator& a = *allocator;
  capalloc::CaptureTracker& t = *tracker;

  // --- 1. Allocation inside vs outside a capture ------------------------------
  auto configure = [&](benchmark::internal::Benchmark* b) {
    b->UseManualTime()->Unit(benchmark::kMillisecond)->Repetitions(repetitions);
    if (iterations > 0) b->Iterations(iterations);
  };
  configure(benchmark::RegisterBenchmark("capture/pairs/outside", [&](benchmark::State& state) {
    pair_cost(a, stream, pairs);  // warm the pools
    for (auto _ : state) state.SetIterationTime(pair_cost(a, stream, pairs) * pair_count / 1e9);
    state.counters["pairs"] = pair_count;
  }));
  configure(benchmark::RegisterBenchmark("capture/pairs/inside", [&](benchmark::State& state) {
    for (auto _ : state) {
      must(t.begin_capture(0, stream).status());
      state.SetIterationTime(pair_cost(a, stream, pairs) * pair_count / 1e9);
      auto done = must(t.end_capture(stream));
      must(t.destroy_graph(done.graph));
    }
    state.counters["pairs"] = pair_count;
  }));
  // --- 2. Capture-end checks in one shared pool -------------------------------
  benchmark::RegisterBenchmark("capture/end_check", [&](benchmark::State& state) {
    capture_end_check(state, *runtime, a, t, stream, sc);
  })->UseManualTime()->Unit(benchmark::kMillisecond)->Iterations(1);

  capalloc::bench::RunCollector collector;
  if (int rc = capalloc::bench::run_benchmarks(collector, "capalloc_bench_capture"); rc != 0) {
    return rc;
  }
  std::printf("\n");
  if (collector.has("capture/pairs/outside") && collector.has("capture/pairs/inside")) {
    const double outside = collector.best_ns_per_iteration("capture/pairs/outside") / pair_count;
    const double inside = collector.best_ns_per_iteration("capture/pairs/inside") / pair_count;
    std::printf("allocate+free pair, ns: outside a capture %.1f, inside a capture %.1f, ratio "
                "%.2f (goal <= 2)\n",
                outside, inside, inside / outside);
  }
  if (collector.has("capture/end_check")) {
    const std::string n = "capture/end_check";
    const double end_ms = collector.best_ns_per_iteration(n) / 1e6;
    const double runtime_ms = collector.counter(n, "runtime_end_ms");
    std::printf("capture-end check, %d captures of %d blocks in one shared pool: %.2f ms in "
                "end_capture (of which the runtime's own end_capture %.2f ms), %.2f ms for the "
                "tracker (goal < 5 ms); %.0f findings at capture ends; check() of all %d graphs: "
                "%.2f ms, %.0f findings\n",
                sc.captures, sc.blocks, end_ms, runtime_ms, end_ms - runtime_ms,
                collector.counter(n, "findings"), sc.captures, collector.counter(n, "check_ms"),
                collector.counter(n, "check_findings"));
    const double victims = collector.counter(n, "victims");
    const double accesses = collector.counter(n, "accesses");
    std::printf("capture-end work, %d captures of %d blocks: %.0f (record, victim) evaluations, "
                "%.0f accesses examined; per capture %.1f evaluations, %.1f accesses (flat when "
                "the work grows linearly with the captures)\n",
                sc.captures, sc.blocks, victims, accesses, victims / sc.captures,
                accesses / sc.captures);
  }
  must(runtime->destroy_stream(stream));
  return 0;
}
