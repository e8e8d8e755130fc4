// tools/bench_capture.cpp: what capture awareness costs, measured in one run.
//
//   capalloc_bench_capture [--pairs N] [--captures C] [--blocks B] [--keep-every K]
//                          [--layers L] [--repetitions R]
//
// 1. ns per allocate+free pair on a stream outside any capture, against the
//    same pair on a stream inside a capture (routed to a graph pool, seen by
//    the tracker). Goal: inside at most 2x outside.
// 2. The capture-end check: C captures of B blocks each into one shared pool
//    (each block written by a declared kernel; 9 in 10 freed during the
//    capture, the rest left live as outputs; --keep-every), the total time spent in
//    CaptureTracker::end_capture and, of that, in the runtime's own
//    end_capture. Goal: under 5 ms in all for 100 x 100.
// 3. A graph-capture start-up as vLLM does it: 67 batch sizes (1, 2, 4, then
//    8 to 512 by 8), largest first, each captured into one shared pool: L
//    layers, each allocating q/k/v, attention and MLP activations sized by
//    the batch (read and written by declared kernels, freed during the
//    capture) and handing its hidden state to the next; the last one is the
//    graph's output. Then every graph is replayed once through the tracker's
//    replay guard. Goal: the capture-end checks under 5 ms in all.
// The summary gives medians over R repetitions (and the best), with each
// figure's ratio to its goal; the tracker's work counters (TrackerWork) come
// with part 2. Prints figures only; no pass/fail (timing belongs here, not in
// tests).
#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
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
  int layers = 32;      // part 3's layers per graph
};

// The median of `values` (NaN when empty).
double median(std::vector<double> values) {
  if (values.empty()) return std::nan("");
  std::sort(values.begin(), values.end());
  const std::size_t n = values.size();
  return n % 2 == 1 ? values[n / 2] : (values[n / 2 - 1] + values[n / 2]) / 2;
}

// Per-repetition wall time per iteration of `name`, in ns.
std::vector<double> ns_per_iteration(const capalloc::bench::RunCollector& c,
                                     const std::string& name) {
  std::vector<double> out;
  for (const auto& run : c.runs(name)) {
    if (run.error_occurred || run.iterations == 0) continue;
    out.push_back(run.real_accumulated_time * 1e9 / static_cast<double>(run.iterations));
  }
  return out;
}

// Per-repetition values of a user counter of `name`.
std::vector<double> counter_values(const capalloc::bench::RunCollector& c,
                                   const std::string& name, const std::string& key) {
  std::vector<double> out;
  for (const auto& run : c.runs(name)) {
    auto it = run.counters.find(key);
    if (it != run.counters.end()) out.push_back(it->second.value);
  }
  return out;
}

double best(std::vector<double> values) {
  return values.empty() ? std::nan("") : *std::min_element(values.begin(), values.end());
}

// Part 2 once: C captures of B blocks into one shared pool. Manual time: the
// total spent in CaptureTracker::end_capture. Counters: the runtime's own
// share, the check() of all graphs, findings and the tracker's work.
void capture_end_check(benchmark::State& state, capalloc::DeviceRuntime& runtime,
                       capalloc::Allocator& allocator, capalloc::CaptureTracker& tracker,
                       capalloc::StreamHandle stream, const Scenario& sc) {
  double runtime_end = 0, check_ns = 0, findings = 0, on_demand = 0, victims = 0, accesses = 0,
         nodes = 0, blocks = 0, weighed = 0;
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
    nodes += static_cast<double>(work_after.nodes - work_before.nodes);
    blocks += static_cast<double>(work_after.blocks - work_before.blocks);
    weighed += static_cast<double>(work_after.findings - work_before.findings);
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
  state.counters["nodes"] = nodes / runs;
  state.counters["blocks"] = blocks / runs;
  state.counters["weighed"] = weighed / runs;
}

// Part 3 once: the start-up captures of 67 batch sizes into one shared pool,
// then one replay of each graph through the replay guard. Manual time: the
// total spent in CaptureTracker::end_capture.
void startup(benchmark::State& state, capalloc::DeviceRuntime& runtime,
             capalloc::Allocator& allocator, capalloc::CaptureTracker& tracker,
             capalloc::StreamHandle stream, const Scenario& sc) {
  std::vector<std::size_t> batch_sizes = {1, 2, 4};
  for (std::size_t b = 8; b <= 512; b += 8) batch_sizes.push_back(b);
  std::reverse(batch_sizes.begin(), batch_sizes.end());  // largest first, as vLLM
  constexpr std::size_t kHidden = 4096 * 2;               // bytes per token of a bf16 row
  double replay_ns = 0, findings = 0, reserved = 0, blocks_per_graph = 0;
  auto write = [&](std::vector<capalloc::MemorySpan> reads, capalloc::MemorySpan out) {
    capalloc::KernelLaunch k;
    k.name = "layer";
    k.reads = std::move(reads);
    k.writes = {out};
    k.host_body = [] {};
    must(runtime.launch_kernel(stream, std::move(k)));
  };
  for (auto _ : state) {
    const capalloc::PoolHandle pool = must(allocator.create_graph_pool(0));
    std::vector<capalloc::GraphHandle> graphs;
    std::vector<void*> outputs;
    double end_total = 0, blocks = 0;
    for (std::size_t bs : batch_sizes) {
      must(tracker.begin_capture(0, stream, {.pool = pool}).status());
      const std::size_t row = bs * kHidden;
      void* hidden = must(allocator.allocate(row, 0, stream, {.tag = "hidden"}));
      write({}, {hidden, row});
      blocks += 1;
      for (int layer = 0; layer < sc.layers; ++layer) {
        void* qkv = must(allocator.allocate(3 * row, 0, stream, {.tag = "qkv"}));
        write({{hidden, row}}, {qkv, 3 * row});
        void* attn = must(allocator.allocate(row, 0, stream, {.tag = "attn"}));
        write({{qkv, 3 * row}}, {attn, row});
        must(allocator.deallocate(qkv));
        void* mlp = must(allocator.allocate(7 * row / 2, 0, stream, {.tag = "mlp"}));
        write({{attn, row}}, {mlp, 7 * row / 2});
        must(allocator.deallocate(attn));
        void* next = must(allocator.allocate(row, 0, stream, {.tag = "hidden"}));
        write({{mlp, 7 * row / 2}, {hidden, row}}, {next, row});
        must(allocator.deallocate(mlp));
        must(allocator.deallocate(hidden));
        hidden = next;
        blocks += 4;
      }
      const auto t0 = Clock::now();
      auto done = must(tracker.end_capture(stream));
      end_total += ns_since(t0);
      findings += static_cast<double>(done.new_findings.size());
      graphs.push_back(done.graph);
      outputs.push_back(hidden);
    }
    reserved += static_cast<double>(must(allocator.pool_stats(pool)).reserved_bytes.current);
    const auto t_replay = Clock::now();
    for (auto g : graphs) must(tracker.replay(g, stream));
    must(runtime.synchronize_stream(stream));
    replay_ns += ns_since(t_replay);
    blocks_per_graph += blocks / static_cast<double>(batch_sizes.size());
    for (void* p : outputs) must(allocator.deallocate(p));
    for (auto g : graphs) must(tracker.destroy_graph(g));
    must(allocator.release_graph_pool(pool));
    state.SetIterationTime(end_total / 1e9);
  }
  const double runs = static_cast<double>(state.iterations());
  state.counters["graphs"] = static_cast<double>(batch_sizes.size());
  state.counters["blocks_per_graph"] = blocks_per_graph / runs;
  state.counters["findings"] = findings / runs;
  state.counters["replay_ms"] = replay_ns / 1e6 / runs;
  state.counters["reserved_MiB"] = reserved / runs / (1 << 20);
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
  app.add_option("--layers", sc.layers, "part 3: layers per captured graph")
      ->check(CLI::Range(1, 10'000))
      ->capture_default_str();
  app.add_option("--iterations", iterations,
                 "part 1: measurements of --pairs pairs per repetition (0: as many as "
                 "--benchmark_min_time takes); part 2 runs once per repetition")
      ->check(CLI::Range(std::int64_t{0}, std::int64_t{1} << 40))
      ->capture_default_str();
  app.add_option("--repetitions", repetitions,
                 "repetitions of each part; the summary gives their median (and the best)")
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
  })->UseManualTime()->Unit(benchmark::kMillisecond)->Iterations(1)->Repetitions(repetitions);
  // --- 3. A graph-capture start-up: 67 batch sizes, one shared pool ----------
  benchmark::RegisterBenchmark("capture/startup", [&](benchmark::State& state) {
    startup(state, *runtime, a, t, stream, sc);
  })->UseManualTime()->Unit(benchmark::kMillisecond)->Iterations(1)->Repetitions(repetitions);

  capalloc::bench::RunCollector collector;
  if (int rc = capalloc::bench::run_benchmarks(collector, "capalloc_bench_capture"); rc != 0) {
    return rc;
  }
  std::printf("\n");
  const capalloc::bench::RunCollector& c = collector;
  if (c.has("capture/pairs/outside") && c.has("capture/pairs/inside")) {
    const std::vector<double> outside = ns_per_iteration(c, "capture/pairs/outside");
    const std::vector<double> inside = ns_per_iteration(c, "capture/pairs/inside");
    const double out_med = median(outside) / pair_count, in_med = median(inside) / pair_count;
    const double out_best = best(outside) / pair_count, in_best = best(inside) / pair_count;
    std::printf("1. allocate+free pair, ns (median of %zu; best): outside a capture %.1f (%.1f), "
                "inside a capture %.1f (%.1f); inside/outside %.2f (best/best %.2f), goal <= 2: "
                "%.2f of the goal\n",
                inside.size(), out_med, out_best, in_med, in_best, in_med / out_med,
                in_best / out_best, in_med / out_med / 2);
  }
  if (c.has("capture/end_check")) {
    const std::string n = "capture/end_check";
    const std::vector<double> end_ns = ns_per_iteration(c, n);
    const double end_ms = median(end_ns) / 1e6;
    const double runtime_ms = median(counter_values(c, n, "runtime_end_ms"));
    std::printf("2. capture-end checks, %d captures of %d blocks in one shared pool (median of "
                "%zu; best): %.2f ms (%.2f) in end_capture, of which the runtime's own "
                "end_capture %.2f ms; goal < 5 ms: %.2f of the goal; %.0f findings at capture "
                "ends; check() of all %d graphs: %.2f ms, %.0f findings\n",
                sc.captures, sc.blocks, end_ns.size(), end_ms, best(end_ns) / 1e6, runtime_ms,
                end_ms / 5, c.counter(n, "findings"), sc.captures,
                median(counter_values(c, n, "check_ms")), c.counter(n, "check_findings"));
    const double per = static_cast<double>(sc.captures);
    std::printf("   capture-end work (TrackerWork), %d captures: %.0f (record, victim) "
                "evaluations, %.0f accesses, %.0f nodes, %.0f blocks, %.0f findings weighed; "
                "per capture %.1f, %.1f, %.1f, %.1f, %.1f (flat when the work grows linearly "
                "with the captures)\n",
                sc.captures, c.counter(n, "victims"), c.counter(n, "accesses"),
                c.counter(n, "nodes"), c.counter(n, "blocks"), c.counter(n, "weighed"),
                c.counter(n, "victims") / per, c.counter(n, "accesses") / per,
                c.counter(n, "nodes") / per, c.counter(n, "blocks") / per,
                c.counter(n, "weighed") / per);
  }
  if (c.has("capture/startup")) {
    const std::string n = "capture/startup";
    const std::vector<double> end_ns = ns_per_iteration(c, n);
    const double end_ms = median(end_ns) / 1e6;
    std::printf("3. graph-capture start-up, %.0f batch sizes x %d layers (%.0f blocks per "
                "graph) into one shared pool (median of %zu; best): %.2f ms (%.2f) in "
                "end_capture; goal < 5 ms: %.2f of the goal; %.0f findings; one replay of each "
                "graph through the replay guard: %.2f ms; graph pool reserved %.1f MiB\n",
                c.counter(n, "graphs"), sc.layers, c.counter(n, "blocks_per_graph"),
                end_ns.size(), end_ms, best(end_ns) / 1e6, end_ms / 5, c.counter(n, "findings"),
                median(counter_values(c, n, "replay_ms")), c.counter(n, "reserved_MiB"));
  }
  must(runtime->destroy_stream(stream));
  return 0;
}
