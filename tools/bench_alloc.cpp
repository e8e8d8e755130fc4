// tools/bench_alloc.cpp: ns per allocate+deallocate pair, capalloc against
// glibc malloc, on the same seeded traces, in one run. Prints ratios; makes
// no pass/fail judgement (timing belongs in benchmarks, not tests).
//
//   capalloc_bench_alloc [--ops N] [--seed S]
//
// Traces: "small" (tensor-like sizes up to 64 KiB, up to 256 live),
// "mixed" (as small, plus 1/16 of requests between 64 KiB and 8 MiB), and
// "lifo" (allocate then free at once, the steady-state of a training step).
// capalloc runs on the host runtime with one stream; device memory is host
// memory there, so both allocators hand out the same kind of pointer.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "capalloc/allocator.hpp"
#include "capalloc/runtime.hpp"

namespace {

struct Op {
  bool alloc;
  std::size_t size;  // for alloc
  std::size_t slot;  // which live slot to fill or free
};

std::vector<Op> make_trace(const std::string& kind, std::size_t ops, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<Op> trace;
  trace.reserve(ops);
  const std::size_t max_live = 256;
  std::vector<std::size_t> free_slots, used_slots;
  for (std::size_t i = 0; i < max_live; ++i) free_slots.push_back(max_live - 1 - i);
  auto size = [&] {
    if (kind == "mixed" && rng() % 16 == 0) return std::size_t{65536} + rng() % (8u << 20);
    return std::size_t{1} + rng() % 65536;
  };
  while (trace.size() < ops) {
    if (kind == "lifo") {
      trace.push_back({true, size(), 0});
      trace.push_back({false, 0, 0});
      continue;
    }
    const bool alloc = !free_slots.empty() && (used_slots.empty() || rng() % 2 == 0);
    if (alloc) {
      const std::size_t slot = free_slots.back();
      free_slots.pop_back();
      used_slots.push_back(slot);
      trace.push_back({true, size(), slot});
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

template <typename Alloc, typename Free>
double ns_per_pair(const std::vector<Op>& trace, Alloc&& alloc, Free&& release) {
  std::vector<void*> slots(256, nullptr);
  std::size_t pairs = 0;
  const auto t0 = std::chrono::steady_clock::now();
  for (const Op& op : trace) {
    if (op.alloc) {
      slots[op.slot] = alloc(op.size);
      ++pairs;
    } else {
      release(slots[op.slot]);
    }
  }
  const auto t1 = std::chrono::steady_clock::now();
  return std::chrono::duration<double, std::nano>(t1 - t0).count() / static_cast<double>(pairs);
}

}  // namespace

int main(int argc, char** argv) {
  std::size_t ops = 2'000'000;
  std::uint64_t seed = 42;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--ops" && i + 1 < argc) {
      ops = std::strtoull(argv[++i], nullptr, 10);
    } else if (arg == "--seed" && i + 1 < argc) {
      seed = std::strtoull(argv[++i], nullptr, 10);
    } else {
      std::fprintf(stderr, "usage: %s [--ops N] [--seed S]\n", argv[0]);
      return 2;
    }
  }
  auto runtime = capalloc::make_host_runtime();
  if (!runtime.ok()) {
    std::fprintf(stderr, "%s\n", runtime.status().ToString().c_str());
    return 1;
  }
  auto allocator = capalloc::Allocator::create(*runtime);
  if (!allocator.ok()) {
    std::fprintf(stderr, "%s\n", allocator.status().ToString().c_str());
    return 1;
  }
  capalloc::Allocator& a = **allocator;
  std::printf("%-7s %12s %14s %18s %8s\n", "trace", "ops", "capalloc ns", "glibc malloc ns",
              "ratio");
  for (const char* kind : {"small", "mixed", "lifo"}) {
    const auto trace = make_trace(kind, ops, seed);
    bool failed = false;
    auto capalloc_alloc = [&](std::size_t n) {
      auto p = a.allocate(n);
      if (!p.ok()) failed = true;
      return p.ok() ? *p : nullptr;
    };
    auto capalloc_free = [&](void* p) {
      if (!a.deallocate(p).ok()) failed = true;
    };
    // Warm both: the first pass grows pools and tables.
    ns_per_pair(trace, capalloc_alloc, capalloc_free);
    ns_per_pair(trace, [](std::size_t n) { return std::malloc(n); }, [](void* p) { std::free(p); });
    double best_capalloc = 1e30, best_malloc = 1e30;
    for (int rep = 0; rep < 3; ++rep) {
      best_capalloc = std::min(best_capalloc, ns_per_pair(trace, capalloc_alloc, capalloc_free));
      best_malloc = std::min(best_malloc, ns_per_pair(trace, [](std::size_t n) { return std::malloc(n); },
                                                      [](void* p) { std::free(p); }));
    }
    if (failed) {
      std::fprintf(stderr, "capalloc failed an operation on trace %s\n", kind);
      return 1;
    }
    std::printf("%-7s %12zu %14.1f %18.1f %8.2f\n", kind, trace.size(), best_capalloc, best_malloc,
                best_capalloc / best_malloc);
  }
  std::printf("ratio = capalloc / glibc malloc, best of 3 after a warm-up pass; lower is better\n");
  return 0;
}
