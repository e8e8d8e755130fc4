// tools/capalloc_cli.cpp: the `capalloc` command-line tool.
//
//   capalloc describe [--runtime host|cuda|hip|auto]
//       the allocator's self-description, after a small exercise
//       (allocate, free, cross-stream free, empty_cache) with stats
//
// Each sub-command lives in its own function; exit status 0 on success, 1 on
// a failure of the thing run, 2 on a usage error.
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "capalloc/allocator.hpp"
#include "capalloc/runtime.hpp"

namespace {

int usage(FILE* out) {
  std::fprintf(out,
               "usage: capalloc <command> [options]\n"
               "commands:\n"
               "  describe [--runtime host|cuda|hip|auto]   self-description and stats\n");
  return out == stderr ? 2 : 0;
}

int fail(const absl::Status& s) {
  std::fprintf(stderr, "capalloc: %s\n", s.ToString().c_str());
  return 1;
}

int describe(const std::vector<std::string>& args) {
  std::string runtime_name = "auto";
  for (std::size_t i = 0; i < args.size(); ++i) {
    if (args[i] == "--runtime" && i + 1 < args.size()) {
      runtime_name = args[++i];
    } else {
      return usage(stderr);
    }
  }
  auto runtime = capalloc::make_runtime(runtime_name);
  if (!runtime.ok()) return fail(runtime.status());
  auto allocator = capalloc::Allocator::create(*runtime);
  if (!allocator.ok()) return fail(allocator.status());
  capalloc::Allocator& a = **allocator;
  capalloc::DeviceRuntime& rt = **runtime;

  // A small exercise so the stats show every path: two streams, a block
  // used on both, a free that waits on the other stream's event.
  auto side = rt.create_stream(0);
  if (!side.ok()) return fail(side.status());
  std::vector<void*> blocks;
  for (std::size_t size : {std::size_t{512}, std::size_t{1} << 20, std::size_t{12} << 20}) {
    auto p = a.allocate(size, 0, capalloc::kDefaultStream, {.tag = "demo"});
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

int main(int argc, char** argv) {
  if (argc < 2) return usage(stderr);
  const std::string command = argv[1];
  const std::vector<std::string> args(argv + 2, argv + argc);
  if (command == "describe") return describe(args);
  if (command == "help" || command == "--help" || command == "-h") return usage(stdout);
  std::fprintf(stderr, "capalloc: unknown command '%s'\n", command.c_str());
  return usage(stderr);
}
