// tools/bench_observer_cost.cpp: the hot-path cost of the retention audit's
// attribution and of the event trace, as instructions per allocate+free
// pair, measured with callgrind (not a timer):
//
//   valgrind --tool=callgrind --callgrind-out-file=/tmp/cg.%p
//     --toggle-collect='capalloc_measured_pairs*'
//     build/tools/capalloc_bench_observer_cost MODE 100000   (one command line)
//   callgrind_annotate /tmp/cg.<pid> | head   # total Ir / 100000 = instructions per pair
//
// MODE: off (no observer: the default), scopes (a tag scope open, stacks
// off), stacks (stacks recorded), trace (the event trace to /tmp), all
// (stacks and trace). The pairs are warmed up first, so the measured ones
// are the steady state (no segment reserved, no heap growth). Prints the
// pairs run; callgrind gives the instructions.
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

#include "capalloc/allocator.hpp"
#include "capalloc/audit.hpp"

namespace {

// Not inlined: callgrind's --toggle-collect counts exactly this function
// and what it calls.
extern "C" [[gnu::noinline]] void capalloc_measured_pairs(capalloc::Allocator& a, int pairs) {
  for (int i = 0; i < pairs; ++i) {
    auto p = a.allocate(4096 + 512 * (i & 7));
    if (!p.ok() || !a.deallocate(*p).ok()) std::abort();
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s off|scopes|stacks|trace|all PAIRS\n", argv[0]);
    return 2;
  }
  const std::string mode = argv[1];
  const int pairs = std::atoi(argv[2]);
  auto runtime = capalloc::make_runtime("host");
  if (!runtime.ok()) return 1;
  auto allocator = capalloc::Allocator::create(*runtime);
  if (!allocator.ok()) return 1;
  capalloc::Allocator& a = **allocator;
  if (mode == "stacks" || mode == "all") a.set_record_stacks(true);
  if (mode == "trace" || mode == "all") {
    if (!a.start_trace("/tmp/capalloc_bench_observer_cost.jsonl").ok()) return 1;
  }
  std::vector<void*> keep;  // a few live blocks, as in a real working set
  for (int i = 0; i < 16; ++i) keep.push_back(a.allocate(1 << 16).value());
  {
    std::optional<capalloc::AllocationTagScope> scope;
    if (mode == "scopes") scope.emplace(a, "bench", "bench.py:1 in step");
    capalloc_measured_pairs(a, 1000);  // warm-up
    capalloc_measured_pairs(a, pairs);
  }
  for (void* p : keep) a.deallocate(p).IgnoreError();
  if (mode == "trace" || mode == "all") {
    if (!a.stop_trace().ok()) return 1;
  }
  std::printf("%s: %d pairs\n", mode.c_str(), pairs);
  return 0;
}
