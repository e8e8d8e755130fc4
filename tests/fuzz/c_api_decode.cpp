// tests/fuzz/c_api_decode.cpp: the C ABI fuzzer's decoding helpers
// (tests/fuzz/c_api_fuzzer.cpp): devices, sizes, keys, streams, blocks,
// pools and graphs picked from the input, valid or bad.
#include <climits>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "c_api_fuzzer.hpp"

namespace capalloc::fuzz {

// Device 0 most of the time; else one the host runtime (one device) lacks.
int pick_device(FuzzedDataProvider& in, bool* valid) {
  static constexpr int kBad[] = {1, 2, -1, -2, 7, INT_MAX, INT_MIN};
  if (in.ConsumeIntegralInRange<int>(0, 7) != 0) {
    *valid = true;
    return 0;
  }
  const int d = in.PickValueInArray(kBad);
  *valid = false;
  return d;
}

// Sizes skewed small, up to tens of MiB.
std::size_t pick_size(FuzzedDataProvider& in) {
  switch (in.ConsumeIntegralInRange<int>(0, 9)) {
    case 0:
    case 1:
    case 2:
    case 3:
      return in.ConsumeIntegralInRange<std::size_t>(1, 1024);
    case 4:
    case 5:
      return in.ConsumeIntegralInRange<std::size_t>(1, 64 << 10);
    case 6:
      return in.ConsumeIntegralInRange<std::size_t>(1, 1 << 20);
    case 7:
      return in.ConsumeIntegralInRange<std::size_t>((1 << 20) - 600, (1 << 20) + 600);
    case 8:
      return in.ConsumeIntegralInRange<std::size_t>(1, 12 << 20);
    default:
      return in.ConsumeIntegralInRange<std::size_t>(1, 40 << 20);
  }
}

// Sizes no allocation may satisfy: more than the host runtime's 16 GiB per
// device, or overflowing any rounding.
std::size_t pick_huge_size(FuzzedDataProvider& in) {
  static constexpr std::size_t kHuge[] = {
      SIZE_MAX,           SIZE_MAX - 1,          SIZE_MAX - 511,         SIZE_MAX / 2,
      SIZE_MAX / 2 + 1,   std::size_t{1} << 50,  (std::size_t{16} << 30) + 1,
      std::size_t{1} << 40, (SIZE_MAX / 2) - ((std::size_t{2} << 20) - 1)};
  return in.PickValueInArray(kHuge);
}

// Keys and tags: a few common ones (so that keys collide), or odd bytes.
std::string pick_key(FuzzedDataProvider& in) {
  static const char* const kKeys[] = {"ws", "sem", "splitk.workspace", "a", "kv"};
  if (in.ConsumeIntegralInRange<int>(0, 3) != 0) return in.PickValueInArray(kKeys);
  std::string key = in.ConsumeRandomLengthString(24);
  // A C string ends at its first NUL; keep the bytes after it meaningful.
  for (char& c : key) {
    if (c == '\0') c = '\x01';
  }
  return key;
}

void* pick_live_stream(FuzzedDataProvider& in, const State& st) {
  if (st.streams.empty() || in.ConsumeIntegralInRange<int>(0, 4) == 0) return nullptr;
  return st.streams[in.ConsumeIntegralInRange<std::size_t>(0, st.streams.size() - 1)];
}

bool is_live_stream(const State& st, void* s) {
  return s == nullptr || std::find(st.streams.begin(), st.streams.end(), s) != st.streams.end();
}

// A stream handle the runtime does not know: destroyed, or made up.
std::optional<void*> pick_bad_stream(FuzzedDataProvider& in, const State& st) {
  void* s = nullptr;
  switch (in.ConsumeIntegralInRange<int>(0, 3)) {
    case 0:
      if (!st.dead_streams.empty()) {
        s = st.dead_streams[in.ConsumeIntegralInRange<std::size_t>(0, st.dead_streams.size() - 1)];
        break;
      }
      [[fallthrough]];
    case 1:
      s = reinterpret_cast<void*>(in.ConsumeIntegral<std::uintptr_t>());
      break;
    case 2:
      s = reinterpret_cast<void*>(~std::uintptr_t{0});
      break;
    default:
      s = reinterpret_cast<void*>(std::uintptr_t{1} << 40);
      break;
  }
  if (is_live_stream(st, s)) return std::nullopt;
  return s;
}

const Block* pick_block(FuzzedDataProvider& in, const State& st, bool include_owned) {
  std::vector<const Block*> candidates;
  for (const auto& [addr, b] : st.live) {
    if (include_owned || !b.owned) candidates.push_back(&b);
  }
  if (candidates.empty()) return nullptr;
  return candidates[in.ConsumeIntegralInRange<std::size_t>(0, candidates.size() - 1)];
}

// A pointer that starts no live block: garbage, an interior pointer, a
// pointer just past a block, or a stack address.
void* pick_bad_pointer(FuzzedDataProvider& in, const State& st) {
  static int on_stack = 0;
  std::uintptr_t p = 0;
  const Block* b = pick_block(in, st, true);
  switch (in.ConsumeIntegralInRange<int>(0, 5)) {
    case 0:
      p = b ? b->addr + 1024 : 1024;
      break;
    case 1:
      p = b ? b->addr + in.ConsumeIntegralInRange<std::size_t>(1, b->size) : 8;
      break;
    case 2:
      p = b ? b->addr - in.ConsumeIntegralInRange<std::uintptr_t>(1, 4096) : 4096;
      break;
    case 3:
      p = reinterpret_cast<std::uintptr_t>(&on_stack);
      break;
    case 4:
      p = ~std::uintptr_t{0} - in.ConsumeIntegralInRange<std::uintptr_t>(0, 4096);
      break;
    default:
      p = in.ConsumeIntegral<std::uintptr_t>();
      break;
  }
  if (p == 0 || st.live.count(p) != 0) return nullptr;
  return reinterpret_cast<void*>(p);
}

std::uint64_t pick_bad_pool(FuzzedDataProvider& in, const State& st) {
  if (!st.released_pools.empty() && in.ConsumeBool()) {
    return st.released_pools[in.ConsumeIntegralInRange<std::size_t>(0, st.released_pools.size() - 1)];
  }
  return in.ConsumeBool() ? ~std::uint64_t{0} - in.ConsumeIntegral<std::uint8_t>()
                          : (std::uint64_t{1} << 48) + in.ConsumeIntegral<std::uint16_t>();
}

std::uint64_t pick_bad_graph(FuzzedDataProvider& in, const State& st) {
  if (!st.dead_graphs.empty() && in.ConsumeBool()) {
    return st.dead_graphs[in.ConsumeIntegralInRange<std::size_t>(0, st.dead_graphs.size() - 1)];
  }
  return in.ConsumeBool() ? 0 : (std::uint64_t{1} << 50) + in.ConsumeIntegral<std::uint16_t>();
}

// PyTorch's pool filters.
int accept_all(void*, void*) { return 1; }
int reject_all(void*, void*) { return 0; }
int accept_if_context(void* context, void* stream) { return context == stream ? 1 : 0; }

std::pair<std::uint64_t, std::uint64_t> pick_torch_pool(FuzzedDataProvider& in) {
  static constexpr std::pair<std::uint64_t, std::uint64_t> kIds[] = {
      {0, 1}, {1, 0}, {0, 77}, {3, 4}, {0, 0}, {~std::uint64_t{0}, 0}};
  return in.PickValueInArray(kIds);
}

}  // namespace capalloc::fuzz
