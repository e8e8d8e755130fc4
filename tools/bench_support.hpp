// tools/bench_support.hpp: what the benchmark programs share. Their
// measurements go through Google Benchmark (registered benchmarks, its
// console output, its --benchmark_* flags); their own arguments through
// CLI11; and the ratio tables they print after the run are computed from the
// runs Google Benchmark reported, which RunCollector keeps.
#ifndef CAPALLOC_TOOLS_BENCH_SUPPORT_HPP_
#define CAPALLOC_TOOLS_BENCH_SUPPORT_HPP_

#include <benchmark/benchmark.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <unistd.h>

#include "capalloc/allocator.hpp"
#include "capalloc/runtime.hpp"

namespace capalloc::bench {

// Parses the program's own flags with `app`, then hands every argument it
// did not know to Google Benchmark (--benchmark_filter=..., --benchmark_out=...,
// ...). Returns -1 to go on, or the exit status to return now: 0 after
// --help, 2 on a usage error (a missing or invalid value, an argument neither
// parser knows), with the message on stderr.
inline int parse_arguments(CLI::App& app, int argc, char** argv) {
  app.allow_extras();
  app.footer(
      "Google Benchmark's own flags (--benchmark_filter=REGEX, --benchmark_repetitions=N, "
      "--benchmark_min_time=SECONDS, --benchmark_out=FILE, --benchmark_out_format=json, ...) "
      "are accepted as well; --benchmark_list_tests=true lists the benchmarks. Exit status: "
      "0 done, 1 an operation failed, 2 a usage error.");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  // What CLI11 left, in order, for Google Benchmark (which keeps argv[0]).
  std::vector<std::string> extras = app.remaining();
  std::vector<char*> rest{argv[0]};
  for (std::string& s : extras) rest.push_back(s.data());
  int rest_count = static_cast<int>(rest.size());
  rest.push_back(nullptr);
  benchmark::Initialize(&rest_count, rest.data());
  if (benchmark::ReportUnrecognizedArguments(rest_count, rest.data())) {
    std::fprintf(stderr, "%s: run with --help for the accepted flags\n", app.get_name().c_str());
    return 2;
  }
  return -1;
}

// The console reporter, keeping a copy of each measured run (not the
// mean/median aggregates) by the benchmark's registered name. Coloured when
// stdout is a terminal (Google Benchmark applies --benchmark_color only to
// the reporter it makes itself).
class RunCollector : public benchmark::ConsoleReporter {
 public:
  RunCollector()
      : ConsoleReporter(isatty(STDOUT_FILENO) ? OO_ColorTabular : OO_Tabular) {}

  void ReportRuns(const std::vector<Run>& runs) override {
    for (const Run& run : runs) {
      if (run.run_type == Run::RT_Iteration) runs_[run.run_name.function_name].push_back(run);
      if (run.error_occurred) {
        failures_.push_back(run.benchmark_name() + ": " + run.error_message);
      }
    }
    ConsoleReporter::ReportRuns(runs);
  }

  bool has(const std::string& name) const { return runs_.count(name) > 0; }

  // Every repetition of `name` (empty when it did not run: filtered out).
  const std::vector<Run>& runs(const std::string& name) const {
    static const std::vector<Run> none;
    auto it = runs_.find(name);
    return it == runs_.end() ? none : it->second;
  }

  // The smallest wall time per iteration over the repetitions of `name`, in
  // nanoseconds (manual time for benchmarks timed by hand); NaN when it did
  // not run.
  double best_ns_per_iteration(const std::string& name) const {
    double best = std::numeric_limits<double>::quiet_NaN();
    for (const Run& run : runs(name)) {
      if (run.error_occurred || run.iterations == 0) continue;
      const double ns = run.real_accumulated_time * 1e9 / static_cast<double>(run.iterations);
      if (!(ns >= best)) best = ns;
    }
    return best;
  }

  // A user counter of the first repetition of `name` (NaN when absent).
  double counter(const std::string& name, const std::string& key) const {
    for (const Run& run : runs(name)) {
      auto it = run.counters.find(key);
      if (it != run.counters.end()) return it->second.value;
    }
    return std::numeric_limits<double>::quiet_NaN();
  }

  // "name: message" for each run that called SkipWithError.
  const std::vector<std::string>& failures() const { return failures_; }

 private:
  std::map<std::string, std::vector<Run>> runs_;
  std::vector<std::string> failures_;
};

// Runs the registered benchmarks into `collector`. Returns 1 (after saying
// which) when a benchmark reported an error, else 0.
inline int run_benchmarks(RunCollector& collector, const char* program) {
  benchmark::RunSpecifiedBenchmarks(&collector);
  benchmark::Shutdown();
  for (const std::string& failure : collector.failures()) {
    std::fprintf(stderr, "%s: %s\n", program, failure.c_str());
  }
  return collector.failures().empty() ? 0 : 1;
}

// A benchmark's host runtime and an allocator over it, or nullopt after
// printing why on stderr (the program then exits 1).
struct HostAllocator {
  std::shared_ptr<DeviceRuntime> runtime;
  std::unique_ptr<Allocator> allocator;
};
inline std::optional<HostAllocator> make_host_allocator() {
  auto runtime = make_host_runtime();
  if (!runtime.ok()) {
    std::fprintf(stderr, "%s\n", runtime.status().ToString().c_str());
    return std::nullopt;
  }
  auto allocator = Allocator::create(*runtime);
  if (!allocator.ok()) {
    std::fprintf(stderr, "%s\n", allocator.status().ToString().c_str());
    return std::nullopt;
  }
  return HostAllocator{*std::move(runtime), *std::move(allocator)};
}

}  // namespace capalloc::bench

#endif  // CAPALLOC_TOOLS_BENCH_SUPPORT_HPP_
