// tools/bench_capture.cpp: what capture awareness costs, measured in one run.
//
//   capalloc_bench_capture [--pairs N] [--captures C] [--blocks B] [--keep-every K]
//
// 1. ns per allocate+free pair on a stream outside any capture, against the
//    same pair on a stream inside a capture (routed to a graph pool, seen by
//    the tracker). Goal: inside at most 2x outside.
// 2. The capture-end check: C captures of B blocks each into one shared pool
//    (each block written by a declared kernel; 9 in 10 freed during the
//    capture, the rest left live as outputs; --keep-every), the total time spent in
//    CaptureTracker::end_capture and, of that, in the runtime's own
//    end_capture. Goal: under 5 ms in all for 100 x 100.
// Prints figures only; no pass/fail (timing belongs here, not in tests).
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "capalloc/allocator.hpp"
#include "capalloc/capture.hpp"
#include "capalloc/runtime.hpp"

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

}  // namespace

int main(int argc, char** argv) {
  std::size_t pairs = 200000;
  int captures = 100;
  int blocks = 100;
  int keep_every = 10;  // one block in `keep_every` stays live as an output
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--pairs" && i + 1 < argc) {
      pairs = std::strtoull(argv[++i], nullptr, 10);
    } else if (arg == "--captures" && i + 1 < argc) {
      captures = std::atoi(argv[++i]);
    } else if (arg == "--blocks" && i + 1 < argc) {
      blocks = std::atoi(argv[++i]);
    } else if (arg == "--keep-every" && i + 1 < argc) {
      keep_every = std::atoi(argv[++i]);
    } else {
      std::fprintf(stderr, "usage: %s [--pairs N] [--captures C] [--blocks B] [--keep-every K]\n", argv[0]);
      return 2;
    }
  }
  capalloc::set_log_level("error").IgnoreError();
  auto runtime = must(capalloc::make_host_runtime());
  auto allocator = must(capalloc::Allocator::create(runtime));
  auto tracker = must(capalloc::CaptureTracker::create(*allocator));
  const capalloc::StreamHandle stream = must(runtime->create_stream(0));

  // --- 1. Allocation inside vs outside a capture ------------------------------
  pair_cost(*allocator, stream, pairs);  // warm the pools
  double outside = 1e30;
  double inside = 1e30;
  for (int rep = 0; rep < 3; ++rep) {
    outside = std::min(outside, pair_cost(*allocator, stream, pairs));
    must(tracker->begin_capture(0, stream).status());
    inside = std::min(inside, pair_cost(*allocator, stream, pairs));
    auto done = must(tracker->end_capture(stream));
    must(tracker->destroy_graph(done.graph));
  }
  std::printf("allocate+free pair, ns: outside a capture %.1f, inside a capture %.1f, ratio %.2f "
              "(goal <= 2)\n",
              outside, inside, inside / outside);

  // --- 2. Capture-end checks in one shared pool -------------------------------
  const capalloc::PoolHandle pool = must(allocator->create_graph_pool(0));
  std::mt19937_64 rng(5);
  std::vector<capalloc::GraphHandle> graphs;
  std::vector<void*> outputs;
  double end_total = 0;
  const capalloc::TrackerWork work_before = tracker->work();
  double runtime_end = 0;
  std::size_t findings = 0;
  for (int c = 0; c < captures; ++c) {
    must(tracker->begin_capture(0, stream, {.pool = pool}).status());
    std::vector<void*> mine;
    for (int b = 0; b < blocks; ++b) {
      const std::size_t bytes = 4096 + (rng() % 16) * 4096;
      void* p = must(allocator->allocate(bytes, 0, stream, {.tag = "act"}));
      capalloc::KernelLaunch k;
      k.name = "write";
      k.writes = {{p, bytes}};
      k.host_body = [] {};
      must(runtime->launch_kernel(stream, std::move(k)));
      mine.push_back(p);
      // Free all but one in `keep_every` during the capture, as activations are.
      if ((keep_every <= 0 || b % keep_every != keep_every - 1) && mine.size() >= 2) {
        must(allocator->deallocate(mine[mine.size() - 2]));
        mine.erase(mine.end() - 2);
      }
    }
    const auto t0 = Clock::now();
    auto done = must(tracker->end_capture(stream));
    end_total += ns_since(t0);
    findings += done.new_findings.size();
    graphs.push_back(done.graph);
    for (void* p : mine) outputs.push_back(p);
  }
  const capalloc::TrackerWork work_after = tracker->work();
  // The runtime's share, measured alone on the same shape of capture.
  for (int c = 0; c < captures; ++c) {
    must(runtime->begin_capture(stream, capalloc::CaptureMode::kGlobal).status());
    for (int b = 0; b < blocks; ++b) {
      capalloc::KernelLaunch k;
      k.name = "write";
      k.writes = {{outputs[0], 4096}};
      k.host_body = [] {};
      must(runtime->launch_kernel(stream, std::move(k)));
    }
    const auto t0 = Clock::now();
    auto g = must(runtime->end_capture(stream));
    runtime_end += ns_since(t0);
    must(runtime->destroy_graph(g));
  }
  const auto t_check = Clock::now();
  const std::size_t on_demand = tracker->check().size();
  const double check_ms = ns_since(t_check) / 1e6;
  std::printf("capture-end check, %d captures of %d blocks in one shared pool: %.2f ms in "
              "end_capture (of which the runtime's own end_capture %.2f ms), %.2f ms for the "
              "tracker (goal < 5 ms); %zu findings at capture ends; check() of all %d graphs: "
              "%.2f ms, %zu findings\n",
              captures, blocks, end_total / 1e6, runtime_end / 1e6, (end_total - runtime_end) / 1e6,
              findings, captures, check_ms, on_demand);
  const double victims = static_cast<double>(work_after.victims - work_before.victims);
  const double accesses = static_cast<double>(work_after.accesses - work_before.accesses);
  std::printf("capture-end work, %d captures of %d blocks: %.0f (record, victim) evaluations, "
              "%.0f accesses examined; per capture %.1f evaluations, %.1f accesses (flat when "
              "the work grows linearly with the captures)\n",
              captures, blocks, victims, accesses, victims / captures, accesses / captures);
  for (void* p : outputs) must(allocator->deallocate(p));
  for (auto g : graphs) must(tracker->destroy_graph(g));
  must(allocator->release_graph_pool(pool));
  must(runtime->destroy_stream(stream));
  return 0;
}
