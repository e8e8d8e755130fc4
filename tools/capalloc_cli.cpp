// tools/capalloc_cli.cpp: the `capalloc` command-line tool.
//
//   capalloc arms [--arm A|B|C|D|all] [--json] [--report DIR] [settings]
//       seed 003's four aliasing arms with capalloc as the allocator, and the fix
//   capalloc gemm-scenario [--json] [--report DIR] [settings]
//       seed 003's wrong-GEMM scenario, status quo against capalloc
//   capalloc report SNAPSHOT_OR_TRACE [SNAPSHOT_OR_TRACE] [-o report.html]
//       one self-contained HTML page drawing the pools over time (docs/report.md)
//   capalloc describe [settings]
//       the allocator's self-description, after a small exercise
//   capalloc stress [--ops N] [--seed S] [--threads T] [--json]
//       the property driver: random operations, properties checked after each
//   capalloc bench TRACE... [--json] [--repetitions N] [--allocators LIST] [--callgrind]
//       trace replays through capalloc, a naive baseline and the host mallocs
//       (docs/performance.md)
//   capalloc audit [--json] [--no-stacks] | --trace FILE [--since ID] [--json]
//       the retention audit: seed 000's retained buffers named, or what a
//       trace leaves live (tools/cli_audit.cpp)
//
// Settings (tools/cli.hpp): --runtime, --round-granularity,
// --capture-guard-scope, --strict[=0|1|possible], --log-level; each
// overrides its CAPALLOC_* variable (README, configuration). `capalloc
// <command> --help` lists a command's flags.
//
// Exit status: 0 on success (for scenarios: every observation matched the
// seed), 1 on a failure or a mismatch, 2 on a usage error (an unknown command
// or flag, a missing or invalid value, an invalid CAPALLOC_* variable).
#include <cstdio>
#include <string>
#include <vector>

#include "capalloc/allocator.hpp"
#include "capalloc/runtime.hpp"
#include "tools/cli.hpp"

namespace capalloc::cli {

namespace {

int describe_command(const Settings& settings) {
  auto runtime = make_runtime(settings.runtime);
  if (!runtime.ok()) return fail(runtime.status());
  auto allocator = Allocator::create(*runtime, settings.allocator);
  if (!allocator.ok()) return fail(allocator.status());
  Allocator& a = **allocator;
  DeviceRuntime& rt = **runtime;

  // A small exercise so the stats show every path: two streams, a block
  // used on both, a free that waits on the other stream's event.
  auto side = rt.create_stream(0);
  if (!side.ok()) return fail(side.status());
  std::vector<void*> blocks;
  for (std::size_t size : {std::size_t{512}, std::size_t{1} << 20, std::size_t{12} << 20}) {
    auto p = a.allocate(size, 0, kDefaultStream, {.tag = "demo"});
    if (!p.ok()) return fail(p.status());
    blocks.push_back(*p);
  }
  if (auto s = a.record_stream(blocks[1], *side); !s.ok()) return fail(s);
  std::printf("%s", a.describe().c_str());
  for (void* p : blocks)
    if (auto s = a.deallocate(p); !s.ok()) return fail(s);
  if (auto s = rt.synchronize_stream(*side); !s.ok()) return fail(s);
  if (auto s = a.empty_cache(); !s.ok()) return fail(s);
  if (auto s = a.CheckInvariants(); !s.ok()) return fail(s);
  std::printf("after freeing and empty_cache:\n%s", a.describe().c_str());
  if (auto s = rt.destroy_stream(*side); !s.ok()) return fail(s);
  return 0;
}

}  // namespace

void add_describe_command(CLI::App& app, Runner& run) {
  CLI::App* command = app.add_subcommand(
      "describe", "the allocator's self-description and stats after a small exercise");
  auto flags = std::make_shared<SettingsFlags>(
      *command, kRuntimeFlag | kGranularityFlag | kLogLevelFlag);
  command->callback([flags, &run] {
    run = [flags] {
      auto settings = flags->start();
      if (!settings.ok()) return usage_error(settings.status());
      return describe_command(*settings);
    };
  });
}

}  // namespace capalloc::cli

int main(int argc, char** argv) {
  using namespace capalloc::cli;
  CLI::App app("capalloc: a graph-capture-aware device memory allocator; seed 003's scenarios "
               "and the allocator's self-description",
               "capalloc");
  // At most one command; none is refused after parsing, so that an unknown
  // word is reported as such rather than as a missing command.
  app.require_subcommand(0, 1);
  Runner run;
  add_arms_command(app, run);
  add_gemm_scenario_command(app, run);
  add_describe_command(app, run);
  add_stress_command(app, run);
  add_report_command(app, run);
  add_bench_command(app, run);
  add_audit_command(app, run);
  try {
    app.parse(argc, argv);
    if (!run) throw CLI::RequiredError("A command (arms, gemm-scenario, describe, stress, report, bench or audit)");
  } catch (const CLI::ParseError& e) {
    // --help prints and exits 0; every other parse error is a usage error.
    return app.exit(e) == 0 ? 0 : 2;
  }
  return run();
}
