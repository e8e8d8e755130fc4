// tools/capalloc_cli.cpp: the `capalloc` command-line tool.
//
//   capalloc arms [--arm A|B|C|D|all] [--runtime host|cuda|hip|auto] [--strict] [--json]
//       seed 003's four aliasing arms with capalloc as the allocator, and the fix
//   capalloc gemm-scenario [--runtime host|cuda|hip|auto] [--strict] [--json]
//       seed 003's wrong-GEMM scenario, status quo against capalloc
//   capalloc describe [--runtime host|cuda|hip|auto]
//       the allocator's self-description, after a small exercise
//
// Exit status: 0 on success (for scenarios: every observation matched the
// seed), 1 on a failure or a mismatch, 2 on a usage error.
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "capalloc/allocator.hpp"
#include "capalloc/runtime.hpp"
#include "tools/cli.hpp"

namespace capalloc::cli {

namespace {

const char* const kUsage =
    "usage: capalloc <command> [options]\n"
    "commands:\n"
    "  arms [--arm A|B|C|D|all] [--runtime host|cuda|hip|auto] [--strict] [--json]\n"
    "      replay seed 003's four aliasing arms with capalloc as the allocator, then the fix\n"
    "  gemm-scenario [--runtime host|cuda|hip|auto] [--strict] [--json]\n"
    "      seed 003's wrong-GEMM scenario: a stream-keyed split-K cache against capalloc's\n"
    "  describe [--runtime host|cuda|hip|auto]\n"
    "      the allocator's self-description and stats after a small exercise\n";

}  // namespace

int fail(const absl::Status& s) {
  std::fprintf(stderr, "capalloc: %s\n", s.ToString().c_str());
  return 1;
}

int usage_error(const std::string& message) {
  std::fprintf(stderr, "capalloc: %s\n%s", message.c_str(), kUsage);
  return 2;
}

int describe_command(const Args& args) {
  std::string runtime_name = "auto";
  for (std::size_t i = 0; i < args.size(); ++i) {
    if (args[i] == "--runtime" && i + 1 < args.size()) {
      runtime_name = args[++i];
    } else {
      return usage_error("describe: unknown argument '" + args[i] + "'");
    }
  }
  auto runtime = make_runtime(runtime_name);
  if (!runtime.ok()) return fail(runtime.status());
  auto allocator = Allocator::create(*runtime);
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

}  // namespace capalloc::cli

int main(int argc, char** argv) {
  using namespace capalloc::cli;
  // The CLI prints findings itself; the log repeats them only when asked.
  if (std::getenv("CAPALLOC_LOG_LEVEL") == nullptr) capalloc::set_log_level("error").IgnoreError();
  if (argc < 2) return usage_error("no command given");
  const std::string command = argv[1];
  const Args args(argv + 2, argv + argc);
  if (command == "arms") return arms_command(args);
  if (command == "gemm-scenario") return gemm_scenario_command(args);
  if (command == "describe") return describe_command(args);
  if (command == "help" || command == "--help" || command == "-h") {
    std::printf("%s", kUsage);
    return 0;
  }
  return usage_error("unknown command '" + command + "'");
}
