// tests/fuzz/c_api_fuzzer.cpp: libFuzzer target for the C ABI
// (include/capalloc/capalloc.h) over the host runtime.
//
// Each input is decoded into a sequence of C ABI calls on the process-wide
// allocator: malloc/free (plain, tagged, persistent, PyTorch's entry points),
// record_stream, streams, graph pools, captures, graph replay and destroy,
// persistent buffers by key, PyTorch's pool hooks, strict mode, waivers,
// stats, checks and snapshots. Malformed calls are mixed in: garbage and
// interior pointers, double frees, garbage and destroyed streams, NULL
// out-parameters, unknown devices, zero and huge sizes, released pools and
// graphs, unknown keys and keys with odd bytes. What the C ABI cannot do goes
// to the process-wide runtime directly (see "Kernels" below): kernels and
// memsets, so that graphs write something and the alias rule has work, and
// native captures with PyTorch's entry points, as PyTorch makes them.
//
// A call may fail; what must never happen (and aborts the run, so that
// libFuzzer records the input):
//   - a crash or a sanitizer report;
//   - capalloc_check_invariants failing after any call;
//   - a call the ABI documents as an error succeeding (freeing a pointer
//     that starts no live block, using a destroyed stream, ...);
//   - a failure without a last error, or a success that leaves one;
//   - two live blocks overlapping, or a live block handed out again;
//   - the stats disagreeing with this file's model of the live blocks;
//   - a byte pattern written into a live block changing before its free;
//   - JSON answers (findings, snapshots) that do not parse;
//   - anything left behind once the input's teardown released everything
//     it created (live blocks, reserved memory, streams, captures, pools).
//
// The process-wide allocator cannot be destroyed through the ABI, so every
// input ends by releasing all it created: inputs are independent, and
// LeakSanitizer sees leaks of the library's own bookkeeping.
#include <fuzzer/FuzzedDataProvider.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "c_api_fuzzer.hpp"
#include "capalloc/capalloc.h"
#include "capalloc/runtime.hpp"

// The checks, the model, the decoding helpers and the operations:
// c_api_fuzzer.hpp and the c_api_*.cpp files beside this one.
namespace capalloc::fuzz {

// --- Teardown --------------------------------------------------------------------

// Releases everything the input created; afterwards the allocator must hold
// nothing.
void teardown(State& st) {
  if (g_trace) std::fprintf(stderr, "teardown\n");
  std::uint64_t graph = 0;
  // Captures first: their streams cannot be destroyed, nor their blocks'
  // frees completed, while they run.
  for (void* s : st.capturing) {
    if (capalloc_capture_end(s, &graph, nullptr) == CAPALLOC_OK) add_graph(st, graph);
  }
  st.capturing.clear();
  capalloc::DeviceRuntime& rt = device_runtime();
  for (void* s : st.native) {
    auto ended = rt.end_capture(reinterpret_cast<capalloc::StreamHandle>(s));
    if (ended.ok()) st.native_graphs.push_back(*ended);
  }
  st.native.clear();
  checked(capalloc_set_strict(0), Expect::kOk, "teardown: capalloc_set_strict(0)");
  // PyTorch's pools: end every begin, then give up every use.
  for (auto& [id, model] : st.torch) {
    if (id.first == 0 && id.second == 0) continue;
    for (int i = 0; i <= model.begins; ++i) {
      if (capalloc_torch_end_allocate_to_pool(0, id.first, id.second, nullptr) != CAPALLOC_OK) break;
    }
    for (int i = 0; i <= model.begins; ++i) {
      if (capalloc_torch_release_pool(0, id.first, id.second) != CAPALLOC_OK) break;
    }
    std::uint64_t pool = 0;
    if (capalloc_torch_pool(0, id.first, id.second, &pool, nullptr) != CAPALLOC_ERROR_NOT_FOUND) {
      die("teardown: PyTorch pool (%llu, %llu) survives every end and release (graph pool %llu)",
          static_cast<unsigned long long>(id.first), static_cast<unsigned long long>(id.second),
          static_cast<unsigned long long>(pool));
    }
  }
  for (std::uint64_t g : st.graphs) {
    checked(capalloc_graph_destroy(g), Expect::kOk, "teardown: capalloc_graph_destroy");
  }
  for (std::uint64_t g : st.native_graphs) {
    if (!rt.destroy_graph(g).ok()) die("teardown: the runtime refused to destroy graph %llu",
                                       static_cast<unsigned long long>(g));
  }
  st.native_graphs.clear();
  st.graphs.clear();
  for (const auto& [key, addr] : st.persistent) {
    verify_pattern(st.live.at(addr), "teardown: before release_persistent");
    checked(capalloc_release_persistent(0, key.c_str()), Expect::kOk,
            "teardown: capalloc_release_persistent");
    remove_block(st, addr);
  }
  st.persistent.clear();
  while (!st.live.empty()) {
    const Block b = st.live.begin()->second;
    verify_pattern(b, "teardown: before free");
    checked(capalloc_free(reinterpret_cast<void*>(b.addr)), Expect::kOk, "teardown: capalloc_free");
    remove_block(st, b.addr);
  }
  for (std::uint64_t p : st.pools) {
    checked(capalloc_pool_release(p), Expect::kOk, "teardown: capalloc_pool_release");
  }
  st.pools.clear();
  for (void* s : st.streams) {
    checked(capalloc_stream_destroy(s), Expect::kOk, "teardown: capalloc_stream_destroy");
  }
  st.streams.clear();
  // Frees used on the default stream (record_stream) wait for its work to
  // run; empty_cache waits for nothing, so run it first. Destroyed streams
  // ran their work when destroyed. A free deferred during a capture gets its
  // event only in the first empty_cache (the capture's route is over by
  // then): the second finds it passed.
  for (int round = 0; round < 2; ++round) {
    checked(capalloc_stream_synchronize(nullptr), Expect::kOk,
            "teardown: capalloc_stream_synchronize(default stream)");
    checked(capalloc_empty_cache(-1), Expect::kOk, "teardown: capalloc_empty_cache(-1)");
  }
  check_all(st, "teardown");
  const capalloc_stats s = stats_now("teardown");
  if (s.allocated_bytes != 0 || s.reserved_bytes != 0 || s.segments != 0 ||
      s.pending_free_blocks != 0 || s.free_blocks != 0) {
    const char* json = "";
    capalloc_snapshot(&json);
    die("teardown: the allocator still holds %lld allocated, %lld reserved bytes in %lld "
        "segments, %lld free and %lld pending-free blocks after everything was released\n%s",
        static_cast<long long>(s.allocated_bytes), static_cast<long long>(s.reserved_bytes),
        static_cast<long long>(s.segments), static_cast<long long>(s.free_blocks),
        static_cast<long long>(s.pending_free_blocks), json);
  }
}

}  // namespace capalloc::fuzz

using namespace capalloc::fuzz;

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  // The process-wide allocator reads these once, on first use.
  ::setenv("CAPALLOC_RUNTIME", "host", 1);
  ::setenv("CAPALLOC_LOG_LEVEL", "off", /*overwrite=*/0);  // unless the caller set one
  ::unsetenv("CAPALLOC_STRICT");
  g_trace = std::getenv("FUZZ_TRACE") != nullptr;
  if (const char* name = capalloc_runtime_name(); name == nullptr || std::strcmp(name, "host") != 0) {
    std::fprintf(stderr, "c_api_fuzzer: the host runtime did not start: %s\n", capalloc_last_error());
    std::abort();
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  FuzzedDataProvider in(data, size);
  State st;
  static const char* const kOpNames[] = {
      "malloc",        "free",        "free(bad)",    "malloc(bad)",    "record_stream",
      "stream",        "pool",        "capture_begin", "capture_end",   "graph",
      "persistent",    "torch_pool",  "misc",         "capture_scenario", "kernel", "native_capture"};
  constexpr int kOps = static_cast<int>(sizeof(kOpNames) / sizeof(kOpNames[0]));
  for (int n = 0; n < kMaxOps && in.remaining_bytes() > 0; ++n) {
    const int op = in.ConsumeIntegralInRange<int>(0, kOps - 1);
    if (g_trace) {
      std::fprintf(stderr, "op %d: %s (live blocks %zu, streams %zu, capturing %zu + %zu native)\n",
                   n, kOpNames[op], st.live.size(), st.streams.size(), st.capturing.size(),
                   st.native.size());
    }
    switch (op) {
      case 0: op_malloc(in, st); break;
      case 1: op_free(in, st); break;
      case 2: op_free_bad(in, st); break;
      case 3: op_malloc_bad(in, st); break;
      case 4: op_record_stream(in, st); break;
      case 5: op_stream(in, st); break;
      case 6: op_pool(in, st); break;
      case 7: op_capture_begin(in, st); break;
      case 8: op_capture_end(in, st); break;
      case 9: op_graph(in, st); break;
      case 10: op_persistent(in, st); break;
      case 11: op_torch_pool(in, st); break;
      case 12: op_misc(in, st); break;
      case 13: op_capture_scenario(in, st); break;
      case 14: op_kernel(in, st); break;
      default: op_native_capture(in, st); break;
    }
    check_all(st, kOpNames[op]);
  }
  teardown(st);
  return 0;
}
