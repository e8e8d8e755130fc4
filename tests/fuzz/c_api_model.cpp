// tests/fuzz/c_api_model.cpp: the C ABI fuzzer's model of what an input
// made (tests/fuzz/c_api_fuzzer.cpp): live blocks and their byte patterns,
// and the checks of the allocator's invariants and stats against it.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <iterator>

#include "c_api_fuzzer.hpp"
#include "capalloc/capalloc.h"

namespace capalloc::fuzz {
namespace {

// The byte at offset i of a block's pattern.
std::uint8_t pattern_byte(std::uint8_t seed, std::size_t i) {
  return static_cast<std::uint8_t>(seed + 31 * i + (i >> 8));
}

template <typename F>
void for_pattern_bytes(const Block& b, F&& f) {
  const std::size_t head = std::min(b.size, kPatternBytes);
  for (std::size_t i = 0; i < head; ++i) f(i);
  const std::size_t tail_start = b.size > kPatternBytes ? b.size - kPatternBytes : b.size;
  for (std::size_t i = std::max(tail_start, head); i < b.size; ++i) f(i);
}

}  // namespace

void write_pattern(Block& b, std::uint8_t seed) {
  b.seed = seed;
  b.patterned = true;
  auto* p = reinterpret_cast<std::uint8_t*>(b.addr);
  for_pattern_bytes(b, [&](std::size_t i) { p[i] = pattern_byte(seed, i); });
}

void verify_pattern(const Block& b, const char* when) {
  if (!b.patterned) return;
  const auto* p = reinterpret_cast<const std::uint8_t*>(b.addr);
  for_pattern_bytes(b, [&](std::size_t i) {
    if (p[i] != pattern_byte(b.seed, i)) {
      die("%s: block %p (%zu bytes): byte %zu is 0x%02x, the pattern wrote 0x%02x", when,
          reinterpret_cast<void*>(b.addr), b.size, i, p[i], pattern_byte(b.seed, i));
    }
  });
}

// The live block containing `addr`, if any.
const Block* block_containing(const State& st, std::uintptr_t addr) {
  auto it = st.live.upper_bound(addr);
  if (it == st.live.begin()) return nullptr;
  --it;
  if (addr >= it->second.addr && addr < it->second.addr + it->second.size) return &it->second;
  return nullptr;
}

// Adds a block capalloc just handed out; it must overlap no live block.
Block& add_block(State& st, void* ptr, std::size_t size, const char* what) {
  const auto addr = reinterpret_cast<std::uintptr_t>(ptr);
  if (ptr == nullptr) die("%s succeeded with a NULL block", what);
  if (addr % 256 != 0) die("%s returned %p, not 256-byte aligned", what, ptr);
  if (addr + size < addr) die("%s returned %p + %zu bytes, which wraps around", what, ptr, size);
  auto next = st.live.lower_bound(addr);
  if (next != st.live.end() && next->first < addr + size) {
    die("%s returned %p (%zu bytes), overlapping live block %p (%zu bytes)%s", what, ptr, size,
        reinterpret_cast<void*>(next->first), next->second.size,
        next->first == addr ? ": a live block handed out again" : "");
  }
  if (next != st.live.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second.size > addr) {
      die("%s returned %p (%zu bytes), inside live block %p (%zu bytes)", what, ptr, size,
          reinterpret_cast<void*>(prev->first), prev->second.size);
    }
  }
  Block b;
  b.addr = addr;
  b.size = size;
  st.live_bytes += size;
  st.freed.erase(std::remove_if(st.freed.begin(), st.freed.end(),
                                [&](const auto& f) { return f.first == addr; }),
                 st.freed.end());
  return st.live.emplace(addr, b).first->second;
}

void remove_block(State& st, std::uintptr_t addr) {
  auto it = st.live.find(addr);
  if (it == st.live.end()) die("model: removing unknown block %p", reinterpret_cast<void*>(addr));
  st.live_bytes -= it->second.size;
  const std::size_t size = it->second.size;
  st.live.erase(it);
  if (st.freed.size() >= 32) st.freed.erase(st.freed.begin());
  st.freed.emplace_back(addr, size);
}

capalloc_stats stats_now(const char* when) {
  capalloc_stats s{};
  if (capalloc_get_stats(0, &s) != CAPALLOC_OK) {
    die("%s: capalloc_get_stats(0) failed", when);
  }
  return s;
}

// After every call: the allocator's invariants, and its stats against the
// model (every block of the process-wide allocator is one of ours).
void check_all(const State& st, const char* when) {
  if (capalloc_check_invariants() != CAPALLOC_OK) {
    die("after %s: capalloc_check_invariants failed", when);
  }
  const capalloc_stats s = stats_now(when);
  std::int64_t requested = 0;
  for (const auto& [addr, b] : st.live) requested += static_cast<std::int64_t>(b.size);
  if (s.allocated_blocks != static_cast<std::int64_t>(st.live.size()) ||
      s.requested_bytes != requested) {
    die("after %s: stats say %lld live blocks of %lld requested bytes, the model %zu of %lld",
        when, static_cast<long long>(s.allocated_blocks),
        static_cast<long long>(s.requested_bytes), st.live.size(),
        static_cast<long long>(requested));
  }
  if (s.allocated_bytes < s.requested_bytes || s.reserved_bytes < s.allocated_bytes) {
    die("after %s: stats out of order: requested %lld, allocated %lld, reserved %lld", when,
        static_cast<long long>(s.requested_bytes), static_cast<long long>(s.allocated_bytes),
        static_cast<long long>(s.reserved_bytes));
  }
}

// A graph capalloc_capture_end just returned: new, and not 0.
void add_graph(State& st, std::uint64_t graph) {
  if (graph == 0) die("capalloc_capture_end returned graph 0");
  if (std::find(st.graphs.begin(), st.graphs.end(), graph) != st.graphs.end() ||
      std::find(st.dead_graphs.begin(), st.dead_graphs.end(), graph) != st.dead_graphs.end()) {
    die("capalloc_capture_end returned graph %llu, already used",
        static_cast<unsigned long long>(graph));
  }
  st.graphs.push_back(graph);
}

bool any_capture(const State& st) { return !st.capturing.empty() || !st.native.empty(); }
bool is_capturing(const State& st, void* s) {
  return st.capturing.count(s) != 0 || st.native.count(s) != 0;
}

}  // namespace capalloc::fuzz
