// tools/bench_threads.cpp: what a second thread adds. One and two threads,
// each replaying its own small-block churn (tensor-like sizes from 512 B to
// 64 KiB, short lives) on its own stream through one shared Allocator (host
// runtime), and the same traces through glibc malloc, measured in the same
// run through Google Benchmark (wall time, ->Threads(1) and ->Threads(2));
// beside them, glibc malloc with one shared atomic counter written per
// operation and under one shared lock: what state shared by the threads
// costs, whatever the allocator.
// The table after its output gives each allocator's total throughput with
// two threads over one: 2.0 is perfect scaling, 1.0 none. Makes no
// pass/fail judgement on time.
//
//   capalloc_bench_threads [--ops N] [--seed S] [--repetitions R]
//                          [--benchmark_...]
//
// What it shows about capalloc's design: one lock guards an Allocator
// (docs/design.md, "The lock"), so two threads on two streams take turns on
// it; their streams' segments, free indexes and quick caches are apart, so
// they do not contend for blocks, only for the lock. `capalloc-apart` gives
// each thread an Allocator of its own (over the one runtime): the most that
// splitting the allocator's state by stream could give.
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include "capalloc/allocator.hpp"
#include "capalloc/runtime.hpp"
#include "common/futex_mutex.hpp"
#include "tools/bench_support.hpp"

namespace {

struct Op {
  bool alloc;
  std::size_t size;  // for alloc
  std::size_t slot;  // which live slot to fill or free
};

constexpr int kMaxThreads = 2;

// Allocations of log-uniform sizes, each freed after a short random number
// of later operations (a few live at once, as activations and scratch are).
std::vector<Op> churn_trace(std::size_t ops, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> log_size(std::log(512.0), std::log(65536.0));
  const std::size_t max_live = 64;
  std::vector<Op> trace;
  trace.reserve(ops);
  std::vector<std::size_t> free_slots, used_slots;
  for (std::size_t s = 0; s < max_live; ++s) free_slots.push_back(max_live - 1 - s);
  while (trace.size() < ops) {
    const bool alloc = !free_slots.empty() && (used_slots.empty() || rng() % 2 == 0);
    if (alloc) {
      const std::size_t slot = free_slots.back();
      free_slots.pop_back();
      used_slots.push_back(slot);
      trace.push_back({true, static_cast<std::size_t>(std::exp(log_size(rng))), slot});
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

struct ThreadWork {
  std::vector<Op> trace;
  std::vector<void*> slots;
  capalloc::StreamHandle stream = capalloc::kDefaultStream;
};

template <typename Alloc, typename Free>
void replay(benchmark::State& state, ThreadWork& work, Alloc&& alloc, Free&& free) {
  for (auto _ : state) {
    for (const Op& op : work.trace) {
      if (op.alloc) {
        void* p = alloc(op.size, work.stream);
        if (p == nullptr) {
          state.SkipWithError("an allocation failed");
          return;
        }
        work.slots[op.slot] = p;
      } else {
        free(work.slots[op.slot]);
      }
    }
  }
  state.SetItemsProcessed(state.iterations() * static_cast<std::int64_t>(work.trace.size()));
}

}  // namespace

int main(int argc, char** argv) {
  std::size_t ops = 200'000;
  std::uint64_t seed = 42;
  int repetitions = 3;
  CLI::App app("capalloc_bench_threads: total allocate/free throughput of one and two threads on "
               "their own streams, capalloc (one shared host-runtime Allocator) against glibc "
               "malloc, measured in the same run",
               "capalloc_bench_threads");
  app.add_option("--ops", ops, "operations per thread's trace")
      ->check(CLI::Range(std::size_t{2}, std::size_t{1} << 32))
      ->capture_default_str();
  app.add_option("--seed", seed, "the traces' seed (thread i replays seed + i)")
      ->capture_default_str();
  app.add_option("--repetitions", repetitions, "measurements per benchmark; the table takes the best")
      ->check(CLI::Range(1, 1000))
      ->capture_default_str();
  if (int rc = capalloc::bench::parse_arguments(app, argc, argv); rc >= 0) return rc;

  auto host = capalloc::bench::make_host_allocator();
  if (!host) return 1;
  capalloc::Allocator& a = *host->allocator;
  ThreadWork work[kMaxThreads];
  for (int t = 0; t < kMaxThreads; ++t) {
    work[t].trace = churn_trace(ops, seed + static_cast<std::uint64_t>(t));
    work[t].slots.assign(64, nullptr);
    auto stream = host->runtime->create_stream(0);
    if (!stream.ok()) {
      std::fprintf(stderr, "%s\n", stream.status().ToString().c_str());
      return 1;
    }
    work[t].stream = *stream;
  }

  auto configure = [&](benchmark::internal::Benchmark* b) {
    b->Unit(benchmark::kMillisecond)->Repetitions(repetitions)->UseRealTime();
    b->Threads(1)->Threads(2);
  };
  configure(benchmark::RegisterBenchmark("threads/churn/capalloc", [&](benchmark::State& state) {
    replay(
        state, work[state.thread_index()],
        [&a](std::size_t n, capalloc::StreamHandle s) {
          auto p = a.allocate(n, 0, s);
          return p.ok() ? *p : nullptr;
        },
        [&a](void* p) { a.deallocate(p).IgnoreError(); });
  }));
  // Each thread with an Allocator of its own over the same runtime: nothing
  // of the allocator shared, what per-stream shards with no shared line on
  // the steady-state path could reach at best (docs/design.md "The lock").
  // The runtime stays shared, as it would be.
  std::vector<std::unique_ptr<capalloc::Allocator>> apart;
  for (int t = 0; t < kMaxThreads; ++t) {
    auto own = capalloc::Allocator::create(host->runtime);
    if (!own.ok()) {
      std::fprintf(stderr, "%s\n", own.status().ToString().c_str());
      return 1;
    }
    apart.push_back(*std::move(own));
  }
  configure(benchmark::RegisterBenchmark("threads/churn/capalloc-apart", [&](benchmark::State& state) {
    capalloc::Allocator& mine = *apart[static_cast<std::size_t>(state.thread_index())];
    replay(
        state, work[state.thread_index()],
        [&mine](std::size_t n, capalloc::StreamHandle s) {
          auto p = mine.allocate(n, 0, s);
          return p.ok() ? *p : nullptr;
        },
        [&mine](void* p) { mine.deallocate(p).IgnoreError(); });
  }));
  // One thread replaying both traces, an operation of each in turn, each on
  // its own stream: streams taking turns on one thread (a compute stream
  // and a copy stream), without a second core.
  benchmark::RegisterBenchmark("threads/turns/capalloc", [&](benchmark::State& state) {
    for (auto _ : state) {
      for (std::size_t i = 0; i < ops; ++i) {
        for (ThreadWork& w : work) {
          const Op& op = w.trace[i];
          if (!op.alloc) {
            a.deallocate(w.slots[op.slot]).IgnoreError();
            continue;
          }
          auto p = a.allocate(op.size, 0, w.stream);
          if (!p.ok()) {
            state.SkipWithError("an allocation failed");
            return;
          }
          w.slots[op.slot] = *p;
        }
      }
      for (ThreadWork& w : work) {  // the traces' tails (their last frees)
        for (std::size_t i = ops; i < w.trace.size(); ++i) {
          a.deallocate(w.slots[w.trace[i].slot]).IgnoreError();
        }
      }
    }
    std::int64_t per_pass = 0;
    for (const ThreadWork& w : work) per_pass += static_cast<std::int64_t>(w.trace.size());
    state.SetItemsProcessed(state.iterations() * per_pass);
  })->Unit(benchmark::kMillisecond)->Repetitions(repetitions)->UseRealTime();
  configure(benchmark::RegisterBenchmark("threads/churn/malloc", [&](benchmark::State& state) {
    replay(
        state, work[state.thread_index()],
        [](std::size_t n, capalloc::StreamHandle) { return std::malloc(n); },
        [](void* p) { std::free(p); });
  }));

  // What any state shared by the threads costs, whatever the allocator:
  // glibc malloc with one relaxed atomic add on one shared counter per
  // operation (an allocator-wide count kept current at every allocation
  // and free), and with one shared lock around each operation
  // (capalloc's scope today). Each takes the counter's or the lock's cache
  // line from the other core at every operation.
  alignas(64) static std::atomic<std::int64_t> shared_counter{0};
  configure(benchmark::RegisterBenchmark("threads/churn/malloc+counter", [&](benchmark::State& state) {
    replay(
        state, work[state.thread_index()],
        [](std::size_t n, capalloc::StreamHandle) {
          shared_counter.fetch_add(1, std::memory_order_relaxed);
          return std::malloc(n);
        },
        [](void* p) {
          shared_counter.fetch_add(1, std::memory_order_relaxed);
          std::free(p);
        });
  }));
  alignas(64) static capalloc::detail::FutexMutex shared_lock;
  configure(benchmark::RegisterBenchmark("threads/churn/malloc+lock", [&](benchmark::State& state) {
    replay(
        state, work[state.thread_index()],
        [](std::size_t n, capalloc::StreamHandle) {
          std::lock_guard lock(shared_lock);
          return std::malloc(n);
        },
        [](void* p) {
          std::lock_guard lock(shared_lock);
          std::free(p);
        });
  }));

  capalloc::bench::RunCollector collector;
  if (int rc = capalloc::bench::run_benchmarks(collector, "capalloc_bench_threads"); rc != 0) {
    return rc;
  }

  std::printf("\n%-16s %16s %16s %10s\n", "allocator", "1 thread Mops/s", "2 threads Mops/s",
              "scaling");
  for (const char* name :
       {"capalloc", "capalloc-apart", "malloc", "malloc+counter", "malloc+lock"}) {
    const std::string full = std::string("threads/churn/") + name;
    std::map<int, double> best;  // threads -> best total items per second
    for (const auto& run : collector.runs(full)) {
      auto it = run.counters.find("items_per_second");
      if (it == run.counters.end()) continue;
      best[static_cast<int>(run.threads)] = std::max(best[static_cast<int>(run.threads)],
                                                      static_cast<double>(it->second));
    }
    if (best.count(1) == 0 || best.count(2) == 0) continue;
    std::printf("%-16s %16.2f %16.2f %9.2fx\n", name, best[1] / 1e6, best[2] / 1e6,
                best[2] / best[1]);
  }
  {
    double turns = 0, one = 0;
    for (const auto& run : collector.runs("threads/turns/capalloc")) {
      if (auto it = run.counters.find("items_per_second"); it != run.counters.end()) {
        turns = std::max(turns, static_cast<double>(it->second));
      }
    }
    for (const auto& run : collector.runs("threads/churn/capalloc")) {
      auto it = run.counters.find("items_per_second");
      if (run.threads == 1 && it != run.counters.end()) {
        one = std::max(one, static_cast<double>(it->second));
      }
    }
    if (turns > 0 && one > 0) {
      std::printf("capalloc, one thread, two streams taking turns: %.2f Mops/s, %.2fx one stream\n",
                  turns / 1e6, turns / one);
    }
  }
  std::printf("scaling = total throughput of two threads / one thread, best of %d measurements; "
              "on a machine with fewer than 2 idle cores it measures the machine, not the "
              "allocator\n",
              repetitions);
  for (const ThreadWork& w : work) host->runtime->destroy_stream(w.stream).IgnoreError();
  return 0;
}
