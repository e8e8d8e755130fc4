// tests/fuzz/c_api_ops_kernels.cpp: the C ABI fuzzer's kernels, launched
// on the process-wide runtime directly (tests/fuzz/c_api_fuzzer.cpp).
#include <cstddef>
#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "c_api/global.hpp"
#include "c_api_fuzzer.hpp"
#include "capalloc/runtime.hpp"

namespace capalloc::fuzz {

// --- Kernels ---------------------------------------------------------------------
// The C ABI has no way to launch work, and a graph of allocations alone
// writes nothing: its write record is empty and the alias rule, findings
// and waivers have nothing to judge. So, as tests/c_api_internal_test.cpp
// does, kernels and memsets go to the process-wide runtime directly
// (c_api/global.hpp). Kernels declare spans (reads, writes, in-place
// updates, state) or carry pointers in their parameters, and have no body:
// they feed the tracker without changing memory. Memsets do write, and only
// into blocks allocated in the capture they are recorded in, so that their
// replays write graph memory only; a pattern that changes in a block outside
// captures then means a replay wrote memory the graph no longer owns.

capalloc::DeviceRuntime& device_runtime() {
  static capalloc::DeviceRuntime* rt = [] {
    auto global = capalloc::detail::global_capalloc();
    if (!global.ok() || global->allocator->device_runtime() == nullptr) {
      die("the process-wide allocator has no device runtime");
    }
    return global->allocator->device_runtime();
  }();
  return *rt;
}

namespace {

// A span inside a live block, or of a freed one (a stale access).
std::optional<capalloc::MemorySpan> pick_span(FuzzedDataProvider& in, const State& st) {
  std::uintptr_t base = 0;
  std::size_t size = 0;
  if (!st.freed.empty() && in.ConsumeIntegralInRange<int>(0, 3) == 0) {
    const auto& f = st.freed[in.ConsumeIntegralInRange<std::size_t>(0, st.freed.size() - 1)];
    base = f.first;
    size = f.second;
  } else {
    const Block* b = pick_block(in, st, true);
    if (b == nullptr) return std::nullopt;
    base = b->addr;
    size = b->size;
  }
  if (in.ConsumeBool()) return capalloc::MemorySpan{reinterpret_cast<const void*>(base), size};
  const std::size_t offset = in.ConsumeIntegralInRange<std::size_t>(0, size - 1);
  const std::size_t bytes = in.ConsumeIntegralInRange<std::size_t>(1, size - offset);
  return capalloc::MemorySpan{reinterpret_cast<const void*>(base + offset), bytes};
}

}  // namespace

void launch_bodiless_kernel(FuzzedDataProvider& in, const State& st, void* stream) {
  capalloc::KernelLaunch k;
  k.name = pick_key(in);
  k.host_body = [] {};
  if (in.ConsumeIntegralInRange<int>(0, 3) == 0) {
    // No declared access: the runtime inspects the parameters for pointers.
    const int words = in.ConsumeIntegralInRange<int>(1, 6);
    for (int i = 0; i < words; ++i) {
      std::uintptr_t word = in.ConsumeIntegral<std::uintptr_t>();
      if (in.ConsumeBool()) {
        if (const auto span = pick_span(in, st)) word = span->begin();
      }
      const auto* bytes = reinterpret_cast<const std::byte*>(&word);
      k.params.insert(k.params.end(), bytes, bytes + sizeof(word));
    }
  } else {
    const int spans = in.ConsumeIntegralInRange<int>(1, 4);
    for (int i = 0; i < spans; ++i) {
      const auto span = pick_span(in, st);
      if (!span) break;
      switch (in.ConsumeIntegralInRange<int>(0, 3)) {
        case 0: k.reads.push_back(*span); break;
        case 1: k.writes.push_back(*span); break;
        case 2: k.updates.push_back(*span); break;
        default: k.state.push_back(*span); break;
      }
    }
  }
  tracef("kernel \"%s\" on stream %p: %zu reads, %zu writes, %zu updates, %zu state, %zu "
         "parameter bytes",
         k.name.c_str(), stream, k.reads.size(), k.writes.size(), k.updates.size(),
         k.state.size(), k.params.size());
  device_runtime()
      .launch_kernel(reinterpret_cast<capalloc::StreamHandle>(stream), std::move(k))
      .IgnoreError();
}

void op_kernel(FuzzedDataProvider& in, State& st) {
  void* stream = nullptr;
  std::vector<void*> capturing(st.capturing.begin(), st.capturing.end());
  capturing.insert(capturing.end(), st.native.begin(), st.native.end());
  if (!capturing.empty() && in.ConsumeIntegralInRange<int>(0, 3) != 0) {
    stream = capturing[in.ConsumeIntegralInRange<std::size_t>(0, capturing.size() - 1)];
  } else {
    stream = pick_live_stream(in, st);
  }
  launch_bodiless_kernel(in, st, stream);
}

}  // namespace capalloc::fuzz
