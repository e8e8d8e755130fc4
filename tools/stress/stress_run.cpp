// tools/stress/stress_run.cpp: the single- and multi-threaded drivers and the
// shrinker (see stress_driver.hpp).
#include <chrono>
#include <string>
#include <thread>

#include "absl/strings/str_format.h"
#include "capalloc/runtime.hpp"
#include "tools/stress/stress_driver.hpp"
#include "tools/stress/stress_world.hpp"

namespace capalloc::stress {

void Counters::add(const Counters& other) {
  ops += other.ops;
  for (std::size_t i = 0; i < kOpKinds; ++i) per_kind[i] += other.per_kind[i];
  invalid_calls_checked += other.invalid_calls_checked;
  invariant_checks += other.invariant_checks;
  ooms += other.ooms;
  graphs += other.graphs;
  replays += other.replays;
  predicted_clobbers += other.predicted_clobbers;
}

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

}  // namespace

std::optional<Failure> run_program(const Program& program, const ExecOptions& options,
                                   Counters* counters) {
  Executor executor(options);
  std::optional<Failure> failure;
  for (std::size_t i = 0; i < program.size() && !failure; ++i)
    if (auto message = executor.apply(program[i])) failure = Failure{i, *message};
  if (!failure)
    if (auto message = executor.finish()) failure = Failure{program.size(), *message};
  if (counters != nullptr) counters->add(executor.counters());
  return failure;
}

ShrinkResult shrink(const Program& failing, const ExecOptions& options, Failure failure,
                    double budget_seconds) {
  const Clock::time_point start = Clock::now();
  ShrinkResult best{failing, failure, 0};
  // Nothing after the failing operation matters.
  if (best.failure.op_index + 1 < best.program.size())
    best.program.resize(best.failure.op_index + 1);
  // ddmin-style: remove chunks, halving their size whenever a whole pass
  // removes nothing, until single operations do not go either.
  std::size_t chunk = std::max<std::size_t>(1, best.program.size() / 2);
  while (seconds_since(start) < budget_seconds) {
    bool removed = false;
    for (std::size_t begin = 0; begin < best.program.size() && seconds_since(start) < budget_seconds;) {
      Program candidate;
      candidate.reserve(best.program.size());
      candidate.insert(candidate.end(), best.program.begin(),
                       best.program.begin() + static_cast<std::ptrdiff_t>(begin));
      const std::size_t end = std::min(best.program.size(), begin + chunk);
      candidate.insert(candidate.end(), best.program.begin() + static_cast<std::ptrdiff_t>(end),
                       best.program.end());
      ++best.runs;
      if (auto f = run_program(candidate, options)) {
        if (f->op_index + 1 < candidate.size()) candidate.resize(f->op_index + 1);
        best.program = std::move(candidate);
        best.failure = *f;
        removed = true;  // the same `begin` now names the ops after the removed chunk
      } else {
        begin += chunk;
      }
    }
    if (!removed) {
      if (chunk == 1) break;
      chunk = std::max<std::size_t>(1, chunk / 2);
    }
  }
  return best;
}

std::string format_reproduction(const ShrinkResult& shrunk) {
  std::string out = absl::StrFormat(
      "shrunk reproduction (%d operations, found in %d runs), failing at operation %d:\n  %s\n",
      shrunk.program.size(), shrunk.runs, shrunk.failure.op_index, shrunk.failure.message);
  // A program the shrinker could not make short is the seed's own prefix:
  // its last operations are printed, the rest is `--ops <n> --seed <s>`.
  constexpr std::size_t kMaxLines = 400;
  std::size_t first = 0;
  if (shrunk.program.size() > kMaxLines) {
    first = shrunk.program.size() - kMaxLines;
    out += absl::StrFormat("  (operations 0 to %d left out: too many to print)\n", first - 1);
  }
  for (std::size_t i = first; i < shrunk.program.size(); ++i)
    out += absl::StrFormat("  %4d  %s\n", i, describe(shrunk.program[i]));
  return out;
}

StressReport run_single(std::uint64_t seed, std::size_t ops, const ExecOptions& options) {
  StressReport report;
  const Clock::time_point start = Clock::now();
  {
    Executor executor(options);
    Generator generator(seed);
    for (std::size_t i = 0; i < ops && !report.failure; ++i)
      if (auto message = executor.apply(generator.next())) report.failure = Failure{i, *message};
    if (!report.failure)
      if (auto message = executor.finish()) report.failure = Failure{ops, *message};
    report.counters = executor.counters();
  }
  report.seconds = seconds_since(start);
  if (report.failure) report.failing_thread = 0;
  return report;
}

struct ThreadedRun {
  static StressReport run(std::uint64_t seed, std::size_t ops, int threads,
                          const ExecOptions& options) {
    StressReport report;
    const Clock::time_point start = Clock::now();
    auto world = World::create(options.memory_limit_per_device, true);
    std::vector<std::unique_ptr<Executor>> executors;
    for (int t = 0; t < threads; ++t)
      executors.push_back(std::unique_ptr<Executor>(new Executor(world, t, options)));
    std::vector<std::optional<Failure>> failures(static_cast<std::size_t>(threads));
    std::atomic<bool> stop{false};
    std::vector<std::thread> workers;
    const std::size_t per_thread = ops / static_cast<std::size_t>(threads);
    for (int t = 0; t < threads; ++t) {
      workers.emplace_back([&, t] {
        Executor& executor = *executors[static_cast<std::size_t>(t)];
        Generator generator(seed + static_cast<std::uint64_t>(t) * 0x1000193ull);
        auto& failure = failures[static_cast<std::size_t>(t)];
        for (std::size_t i = 0; i < per_thread && !stop.load(std::memory_order_relaxed); ++i) {
          if (auto message = executor.apply(generator.next())) {
            failure = Failure{i, *message};
            stop = true;
          }
        }
        if (!failure)
          if (auto message = executor.finish()) failure = Failure{per_thread, *message};
      });
    }
    for (std::thread& w : workers) w.join();
    for (int t = 0; t < threads && !report.failure; ++t) {
      if (failures[static_cast<std::size_t>(t)]) {
        report.failure = failures[static_cast<std::size_t>(t)];
        report.failing_thread = t;
      }
    }
    if (!report.failure)
      if (auto message = world->check_global()) report.failure = Failure{per_thread, *message};
    for (auto& e : executors) report.counters.add(e->counters());
    executors.clear();
    world.reset();
    report.seconds = seconds_since(start);
    return report;
  }
};

StressReport run_threads(std::uint64_t seed, std::size_t ops, int threads,
                         const ExecOptions& options) {
  return ThreadedRun::run(seed, ops, threads, options);
}

}  // namespace capalloc::stress
