// tools/cli_stress.cpp: `capalloc stress`, the property driver
// (tools/stress/stress_driver.hpp) from the command line.
//
// Single-threaded, a failing seed is shrunk to a short program and printed.
// With --threads T, T executors share one allocator (each with its own
// streams and program) so that the allocator's lock is what is tested; a
// failure there prints the thread and operation, not a shrunk program (a
// concurrent interleaving does not replay from its seed).
#include <cstdio>
#include <string>

#include "absl/strings/str_format.h"
#include "capture/json_writer.hpp"
#include "tools/cli.hpp"
#include "tools/stress/stress_driver.hpp"

namespace capalloc::cli {

namespace {

struct StressFlags {
  std::size_t ops = 100000;
  std::uint64_t seed = 1;
  int threads = 1;
  std::size_t memory_limit_mib = 192;
  double shrink_seconds = 120;
  bool json = false;
  std::unique_ptr<SettingsFlags> settings;
};

std::string to_json(const StressFlags& flags, const stress::StressReport& report) {
  detail::JsonWriter j;
  j.begin_object();
  j.field("seed", flags.seed);
  j.field("threads", flags.threads);
  j.field("ops", report.counters.ops);
  j.field("seconds", report.seconds);
  j.field("ops_per_second", static_cast<double>(report.counters.ops) / std::max(report.seconds, 1e-9));
  j.field("invariant_checks", report.counters.invariant_checks);
  j.field("invalid_calls_checked", report.counters.invalid_calls_checked);
  j.field("ooms", report.counters.ooms);
  j.field("graphs", report.counters.graphs);
  j.field("replays", report.counters.replays);
  j.field("predicted_clobbers", report.counters.predicted_clobbers);
  j.key("per_kind").begin_object();
  for (std::size_t k = 0; k < stress::kOpKinds; ++k)
    j.field(stress::op_kind_name(static_cast<stress::OpKind>(k)), report.counters.per_kind[k]);
  j.end_object();
  j.field("passed", !report.failure.has_value());
  if (report.failure) j.field("failure", report.failure->message);
  j.end_object();
  return j.str();
}

void print_summary(const StressFlags& flags, const stress::StressReport& report) {
  const stress::Counters& c = report.counters;
  std::printf("capalloc stress: seed %llu, %d thread(s), %llu operations in %.1f s (%.0f ops/s)\n",
              static_cast<unsigned long long>(flags.seed), flags.threads,
              static_cast<unsigned long long>(c.ops), report.seconds,
              static_cast<double>(c.ops) / std::max(report.seconds, 1e-9));
  std::printf("  invariant checks %llu, invalid calls checked %llu, out-of-memory results %llu, "
              "graphs %llu, replays %llu, predicted clobbers %llu\n",
              static_cast<unsigned long long>(c.invariant_checks),
              static_cast<unsigned long long>(c.invalid_calls_checked),
              static_cast<unsigned long long>(c.ooms), static_cast<unsigned long long>(c.graphs),
              static_cast<unsigned long long>(c.replays),
              static_cast<unsigned long long>(c.predicted_clobbers));
  std::printf("  per kind:");
  for (std::size_t k = 0; k < stress::kOpKinds; ++k)
    std::printf(" %s %llu", stress::op_kind_name(static_cast<stress::OpKind>(k)),
                static_cast<unsigned long long>(c.per_kind[k]));
  std::printf("\n");
}

int stress_command(const StressFlags& flags) {
  auto settings = flags.settings->start();
  if (!settings.ok()) return usage_error(settings.status());
  stress::ExecOptions options;
  options.memory_limit_per_device = flags.memory_limit_mib << 20;
  const stress::StressReport report =
      flags.threads == 1 ? stress::run_single(flags.seed, flags.ops, options)
                         : stress::run_threads(flags.seed, flags.ops, flags.threads, options);
  if (flags.json) {
    std::printf("%s\n", to_json(flags, report).c_str());
  } else {
    print_summary(flags, report);
  }
  if (!report.failure) return 0;
  std::fprintf(stderr, "capalloc stress: FAILED (thread %d, operation %zu): %s\n",
               report.failing_thread, report.failure->op_index, report.failure->message.c_str());
  if (flags.threads == 1) {
    const stress::Program program = stress::generate(flags.seed, report.failure->op_index + 1);
    const stress::ShrinkResult shrunk =
        stress::shrink(program, options, *report.failure, flags.shrink_seconds);
    std::fprintf(stderr, "%s", stress::format_reproduction(shrunk).c_str());
  }
  return 1;
}

}  // namespace

void add_stress_command(CLI::App& app, Runner& run) {
  CLI::App* command = app.add_subcommand(
      "stress", "the property driver: seeded random operations on the host runtime, the "
                "allocator's properties checked after each one");
  auto flags = std::make_shared<StressFlags>();
  command->add_option("--ops", flags->ops, "operations in all")
      ->check(CLI::Range(std::size_t{1}, std::size_t{1} << 40))
      ->capture_default_str();
  command->add_option("--seed", flags->seed, "the generator's seed")->capture_default_str();
  command->add_option("--threads", flags->threads,
                      "executors sharing one allocator, each with its own streams")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  command->add_option("--memory-limit-mib", flags->memory_limit_mib,
                      "bytes each emulated device can reserve, in MiB (small: out-of-memory "
                      "happens)")
      ->check(CLI::Range(std::size_t{128}, std::size_t{1} << 20))
      ->capture_default_str();
  command->add_option("--shrink-seconds", flags->shrink_seconds,
                      "time the shrinker may take on a failure")
      ->check(CLI::Range(0.0, 86400.0))
      ->capture_default_str();
  command->add_flag("--json", flags->json, "one JSON summary object instead of text");
  flags->settings = std::make_unique<SettingsFlags>(*command, kLogLevelFlag);
  command->callback([flags, &run] { run = [flags] { return stress_command(*flags); }; });
}

}  // namespace capalloc::cli
