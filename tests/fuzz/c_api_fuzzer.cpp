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

#include <algorithm>
#include <climits>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "c_api/global.hpp"
#include "capalloc/capalloc.h"
#include "capalloc/runtime.hpp"
#include "nlohmann/json.hpp"

namespace {

[[noreturn]] __attribute__((format(printf, 1, 2))) void die(const char* fmt, ...) {
  std::fprintf(stderr, "\nc_api_fuzzer: INVARIANT VIOLATED: ");
  va_list args;
  va_start(args, fmt);
  std::vfprintf(stderr, fmt, args);
  va_end(args);
  std::fprintf(stderr, "\n  (last error: \"%s\")\n", capalloc_last_error());
  std::fflush(stderr);
  __builtin_trap();
}

// What a status call must return.
enum class Expect { kAny, kOk, kError };

const char* status_name(capalloc_status s) {
  switch (s) {
    case CAPALLOC_OK:
      return "OK";
    case CAPALLOC_ERROR_INVALID_ARGUMENT:
      return "INVALID_ARGUMENT";
    case CAPALLOC_ERROR_OUT_OF_MEMORY:
      return "OUT_OF_MEMORY";
    case CAPALLOC_ERROR_NOT_FOUND:
      return "NOT_FOUND";
    case CAPALLOC_ERROR_FAILED_PRECONDITION:
      return "FAILED_PRECONDITION";
    case CAPALLOC_ERROR_UNAVAILABLE:
      return "UNAVAILABLE";
    case CAPALLOC_ERROR_INTERNAL:
      return "INTERNAL";
  }
  return "(not a capalloc_status)";
}

// FUZZ_TRACE=1 prints every call and its status: for reading a
// crashing input (run the fuzzer binary on the file alone).
bool g_trace = false;

__attribute__((format(printf, 1, 2))) void tracef(const char* fmt, ...) {
  if (!g_trace) return;
  va_list args;
  va_start(args, fmt);
  std::fprintf(stderr, "    ");
  std::vfprintf(stderr, fmt, args);
  std::fprintf(stderr, "\n");
  va_end(args);
}

// Checks what every status-returning call promises: a known code, an empty
// last error on success and a message on failure; then `expect`.
capalloc_status checked(capalloc_status s, Expect expect, const char* what) {
  const char* err = capalloc_last_error();
  if (g_trace) {
    std::fprintf(stderr, "  %s -> %s%s%s\n", what, status_name(s), s == CAPALLOC_OK ? "" : ": ",
                 err == nullptr ? "(null)" : err);
  }
  if (err == nullptr) die("%s: capalloc_last_error() returned NULL", what);
  const std::size_t len = std::strlen(err);
  switch (s) {
    case CAPALLOC_OK:
      if (len != 0) die("%s succeeded but left last error \"%s\"", what, err);
      break;
    case CAPALLOC_ERROR_INVALID_ARGUMENT:
    case CAPALLOC_ERROR_OUT_OF_MEMORY:
    case CAPALLOC_ERROR_NOT_FOUND:
    case CAPALLOC_ERROR_FAILED_PRECONDITION:
    case CAPALLOC_ERROR_UNAVAILABLE:
      if (len == 0) die("%s failed (%s) with an empty last error", what, status_name(s));
      break;
    case CAPALLOC_ERROR_INTERNAL:
      // An internal error is a bug in capalloc by definition (an exception,
      // an impossible state).
      die("%s: CAPALLOC_ERROR_INTERNAL", what);
    default:
      die("%s returned %d, not a capalloc_status", what, static_cast<int>(s));
  }
  if (expect == Expect::kOk && s != CAPALLOC_OK) {
    die("%s failed (%s) where it must succeed", what, status_name(s));
  }
  if (expect == Expect::kError && s == CAPALLOC_OK) {
    die("%s succeeded where the ABI documents an error", what);
  }
  return s;
}

#define CALL(expect, call) checked((call), (expect), #call)

void require_json(const char* json, const char* what, bool array) {
  if (json == nullptr) die("%s: JSON pointer left NULL", what);
  tracef("%s JSON: %.300s", what, json);
  const auto parsed = nlohmann::json::parse(json, nullptr, /*allow_exceptions=*/false);
  if (parsed.is_discarded()) die("%s returned text that is not JSON: %.400s", what, json);
  if (array && !parsed.is_array()) die("%s returned JSON that is not an array: %.400s", what, json);
  if (!array && !parsed.is_object()) die("%s returned JSON that is not an object", what);
}

// --- The model ---------------------------------------------------------------

constexpr std::size_t kPatternBytes = 128;   // written at each end of a block
constexpr std::size_t kLiveBytesCap = std::size_t{192} << 20;  // keeps memory bounded
constexpr int kMaxOps = 192;
constexpr int kMaxStreams = 6;
constexpr std::size_t kMaxBlocks = 96;

struct Block {
  std::uintptr_t addr = 0;
  std::size_t size = 0;      // requested
  bool patterned = false;    // a byte pattern lives at both ends
  std::uint8_t seed = 0;
  bool owned = false;        // a persistent buffer (capalloc_preallocate): only
                             // capalloc_release_persistent frees it
  std::string key;           // its key, when owned
};

struct TorchPoolModel {
  int begins = 0;  // begins seen (an upper bound of uses and underway begins)
};

struct State {
  std::map<std::uintptr_t, Block> live;  // every block of the allocator: all are ours
  std::size_t live_bytes = 0;
  std::vector<std::pair<std::uintptr_t, std::size_t>> freed;  // recently freed blocks
  std::vector<void*> streams;            // created, not destroyed
  std::vector<void*> dead_streams;       // destroyed (never reused: handles count up)
  std::set<void*> capturing;             // streams with a capture we began, not ended
  std::set<void*> native;                // streams in a capture begun on the runtime
                                         // directly (as PyTorch captures)
  std::vector<std::uint64_t> native_graphs;  // the runtime's graphs of those
  std::vector<std::uint64_t> pools;      // one entry per handle reference we hold
  std::vector<std::uint64_t> released_pools;
  std::vector<std::uint64_t> graphs;     // captured, not destroyed
  std::vector<std::uint64_t> dead_graphs;
  std::map<std::string, std::uintptr_t> persistent;  // key (device 0) -> block
  std::map<std::pair<std::uint64_t, std::uint64_t>, TorchPoolModel> torch;  // device 0
  std::uint8_t next_seed = 1;
  bool strict_set = false;
};

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

// --- Decoding helpers ----------------------------------------------------------

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

// --- Operations ----------------------------------------------------------------

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

// Allocations through capalloc_malloc, capalloc_malloc_tagged and
// capalloc_torch_malloc with valid arguments.
void op_malloc(FuzzedDataProvider& in, State& st) {
  const std::size_t size = pick_size(in);
  void* stream = pick_live_stream(in, st);
  const int how = in.ConsumeIntegralInRange<int>(0, 3);
  if (st.live.size() >= kMaxBlocks || st.live_bytes + size > kLiveBytesCap) return;
  const bool stream_capturing = is_capturing(st, stream);
  void* p = nullptr;
  capalloc_status s = CAPALLOC_OK;
  const char* what = "capalloc_malloc";
  if (how == 0 || how == 1) {
    s = CALL(Expect::kAny, capalloc_malloc(&p, size, 0, stream));
  } else if (how == 2) {
    const std::string tag = pick_key(in);
    const bool persistent = in.ConsumeIntegralInRange<int>(0, 3) == 0;
    const bool null_tag = in.ConsumeIntegralInRange<int>(0, 5) == 0;
    what = "capalloc_malloc_tagged";
    s = CALL(Expect::kAny, capalloc_malloc_tagged(&p, size, 0, stream,
                                                   null_tag ? nullptr : tag.c_str(), persistent));
    // Refused while a capture capalloc knows of is active on the device (the
    // default CaptureGuardScope): one begun through capalloc_capture_begin
    // is known from its begin. (A native capture is known only once it
    // allocates through capalloc: CUDA cannot list a device's captures.)
    if (persistent && !st.capturing.empty() && s == CAPALLOC_OK) {
      die("capalloc_malloc_tagged(persistent) succeeded while a capture is active");
    }
  } else {
    what = "capalloc_torch_malloc";
    p = capalloc_torch_malloc(size, 0, stream);
    s = p == nullptr ? CAPALLOC_ERROR_OUT_OF_MEMORY : CAPALLOC_OK;
  }
  tracef("%s(%zu, stream %p) = %p", what, size, stream, p);
  if (s != CAPALLOC_OK) return;
  Block& b = add_block(st, p, size, what);
  // Blocks of captures belong to their graphs: left alone.
  if (!stream_capturing) write_pattern(b, st.next_seed++);
}

void op_free(FuzzedDataProvider& in, State& st) {
  const Block* b = pick_block(in, st, true);
  if (b == nullptr) return;
  verify_pattern(*b, "before free");
  const std::uintptr_t addr = b->addr;
  const bool owned = b->owned;
  const int how = in.ConsumeIntegralInRange<int>(0, 3);
  tracef("free %p (%zu bytes)%s", reinterpret_cast<void*>(addr), b->size, how == 3 ? " by torch_free" : "");
  if (how == 3) {
    // PyTorch's free: void; the stats say whether it happened.
    const capalloc_stats before = stats_now("torch_free");
    const std::size_t size = b->size;
    bool valid_device = true;
    const int device = in.ConsumeBool() ? 0 : pick_device(in, &valid_device);
    if (device == -1) valid_device = true;  // Allocator::kAnyDevice: any device
    capalloc_torch_free(reinterpret_cast<void*>(addr), size, device, pick_live_stream(in, st));
    const capalloc_stats after = stats_now("torch_free");
    const bool freed = after.allocated_blocks == before.allocated_blocks - 1;
    if (!freed && after.allocated_blocks != before.allocated_blocks) {
      die("capalloc_torch_free changed the live blocks by %lld",
          static_cast<long long>(after.allocated_blocks - before.allocated_blocks));
    }
    if (freed && (owned || !valid_device)) {
      die("capalloc_torch_free freed %s block %p", owned ? "a persistent (owned)" : "a wrong-device",
          reinterpret_cast<void*>(addr));
    }
    if (freed) remove_block(st, addr);
    return;
  }
  const capalloc_status s =
      CALL(owned ? Expect::kError : Expect::kAny, capalloc_free(reinterpret_cast<void*>(addr)));
  if (s == CAPALLOC_OK) remove_block(st, addr);
}

void op_free_bad(FuzzedDataProvider& in, State& st) {
  switch (in.ConsumeIntegralInRange<int>(0, 3)) {
    case 0:
      CALL(Expect::kError, capalloc_free(nullptr));
      return;
    case 1: {  // double free
      if (st.freed.empty()) return;
      const std::uintptr_t addr =
          st.freed[in.ConsumeIntegralInRange<std::size_t>(0, st.freed.size() - 1)].first;
      if (block_containing(st, addr) != nullptr) return;  // handed out again since
      CALL(Expect::kError, capalloc_free(reinterpret_cast<void*>(addr)));
      return;
    }
    case 2: {
      void* p = pick_bad_pointer(in, st);
      if (p == nullptr) return;
      const capalloc_stats before = stats_now("torch_free(bad)");
      capalloc_torch_free(p, 64, 0, nullptr);
      if (stats_now("torch_free(bad)").allocated_blocks != before.allocated_blocks) {
        die("capalloc_torch_free(%p), a pointer that starts no live block, freed a block", p);
      }
      return;
    }
    default: {
      void* p = pick_bad_pointer(in, st);
      if (p == nullptr) return;
      CALL(Expect::kError, capalloc_free(p));
      return;
    }
  }
}

void op_malloc_bad(FuzzedDataProvider& in, State& st) {
  void* p = nullptr;
  switch (in.ConsumeIntegralInRange<int>(0, 6)) {
    case 0:
      CALL(Expect::kError, capalloc_malloc(nullptr, 64, 0, nullptr));
      return;
    case 1:
      CALL(Expect::kError, capalloc_malloc(&p, 0, 0, pick_live_stream(in, st)));
      return;
    case 2:
      CALL(Expect::kError, capalloc_malloc(&p, pick_huge_size(in), 0, pick_live_stream(in, st)));
      return;
    case 3: {
      bool valid = true;
      const int device = pick_device(in, &valid);
      if (valid) return;
      CALL(Expect::kError, capalloc_malloc(&p, 64, device, nullptr));
      return;
    }
    case 4: {
      const auto s = pick_bad_stream(in, st);
      if (!s) return;
      CALL(Expect::kError, capalloc_malloc(&p, 256, 0, *s));
      return;
    }
    case 5: {
      const std::size_t size = in.ConsumeBool() ? 0 : pick_huge_size(in);
      if (capalloc_torch_malloc(size, 0, pick_live_stream(in, st)) != nullptr) {
        die("capalloc_torch_malloc(%zu) returned a block", size);
      }
      return;
    }
    default: {
      const std::string tag = pick_key(in);
      CALL(Expect::kError, capalloc_malloc_tagged(nullptr, 64, 0, nullptr, tag.c_str(), 1));
      CALL(Expect::kError, capalloc_malloc_tagged(&p, 0, 0, nullptr, tag.c_str(), 0));
      return;
    }
  }
}

void op_record_stream(FuzzedDataProvider& in, State& st) {
  const bool bad = in.ConsumeIntegralInRange<int>(0, 3) == 0;
  if (!bad) {
    const Block* b = pick_block(in, st, true);
    if (b == nullptr) return;
    void* s = pick_live_stream(in, st);
    tracef("record_stream %p on stream %p", reinterpret_cast<void*>(b->addr), s);
    CALL(Expect::kAny, capalloc_record_stream(reinterpret_cast<void*>(b->addr), s));
    return;
  }
  if (in.ConsumeBool()) {
    const Block* b = pick_block(in, st, true);
    const auto s = pick_bad_stream(in, st);
    if (b == nullptr || !s) return;
    tracef("record_stream %p on bad stream %p", reinterpret_cast<void*>(b->addr), *s);
    CALL(Expect::kError, capalloc_record_stream(reinterpret_cast<void*>(b->addr), *s));
  } else {
    void* p = in.ConsumeBool() ? pick_bad_pointer(in, st) : nullptr;
    if (p == nullptr && in.ConsumeBool()) return;
    CALL(Expect::kError, capalloc_record_stream(p, pick_live_stream(in, st)));
  }
}

void op_stream(FuzzedDataProvider& in, State& st) {
  switch (in.ConsumeIntegralInRange<int>(0, 6)) {
    case 0:
    case 1: {
      if (st.streams.size() >= kMaxStreams) return;
      void* s = nullptr;
      if (CALL(Expect::kAny, capalloc_stream_create(0, &s)) == CAPALLOC_OK) {
        if (s == nullptr) die("capalloc_stream_create returned the default stream");
        if (is_live_stream(st, s) ||
            std::find(st.dead_streams.begin(), st.dead_streams.end(), s) != st.dead_streams.end()) {
          die("capalloc_stream_create returned %p, a handle in use or destroyed", s);
        }
        st.streams.push_back(s);
        tracef("stream %p created", s);
      }
      return;
    }
    case 2: {  // destroy a live stream
      if (st.streams.empty()) return;
      const std::size_t i = in.ConsumeIntegralInRange<std::size_t>(0, st.streams.size() - 1);
      void* s = st.streams[i];
      tracef("destroy stream %p", s);
      const bool capturing = is_capturing(st, s);
      const capalloc_status r =
          CALL(capturing ? Expect::kError : Expect::kAny, capalloc_stream_destroy(s));
      if (r == CAPALLOC_OK) {
        st.streams.erase(st.streams.begin() + static_cast<std::ptrdiff_t>(i));
        st.dead_streams.push_back(s);
      }
      return;
    }
    case 3: {
      void* s = pick_live_stream(in, st);
      CALL(is_capturing(st, s) ? Expect::kError : Expect::kAny, capalloc_stream_synchronize(s));
      return;
    }
    case 4: {  // bad destroys and synchronizes
      const auto s = pick_bad_stream(in, st);
      if (!s) return;
      CALL(Expect::kError, in.ConsumeBool() ? capalloc_stream_destroy(*s)
                                            : capalloc_stream_synchronize(*s));
      return;
    }
    case 5:
      CALL(Expect::kError, capalloc_stream_destroy(nullptr));  // the default stream
      return;
    default: {
      bool valid = true;
      const int device = pick_device(in, &valid);
      void* s = nullptr;
      if (valid) {
        CALL(Expect::kError, capalloc_stream_create(0, nullptr));
      } else {
        CALL(Expect::kError, capalloc_stream_create(device, &s));
      }
      return;
    }
  }
}

void op_pool(FuzzedDataProvider& in, State& st) {
  switch (in.ConsumeIntegralInRange<int>(0, 4)) {
    case 0:
    case 1: {
      if (st.pools.size() >= 8) return;
      std::uint64_t h = 0;
      if (CALL(Expect::kAny, capalloc_pool_create(0, &h)) == CAPALLOC_OK) {
        if (h == 0) die("capalloc_pool_create returned pool 0");
        if (std::find(st.pools.begin(), st.pools.end(), h) != st.pools.end()) {
          die("capalloc_pool_create returned pool %llu, which we hold",
              static_cast<unsigned long long>(h));
        }
        st.pools.push_back(h);
      }
      return;
    }
    case 2: {
      if (st.pools.empty()) return;
      const std::size_t i = in.ConsumeIntegralInRange<std::size_t>(0, st.pools.size() - 1);
      const std::uint64_t h = st.pools[i];
      if (CALL(Expect::kAny, capalloc_pool_release(h)) == CAPALLOC_OK) {
        st.pools.erase(st.pools.begin() + static_cast<std::ptrdiff_t>(i));
        if (std::find(st.pools.begin(), st.pools.end(), h) == st.pools.end()) {
          st.released_pools.push_back(h);
        }
      }
      return;
    }
    case 3: {  // a pool we hold no handle to
      const std::uint64_t h = pick_bad_pool(in, st);
      if (std::find(st.pools.begin(), st.pools.end(), h) != st.pools.end()) return;
      CALL(Expect::kError, capalloc_pool_release(h));
      return;
    }
    default: {
      bool valid = true;
      const int device = pick_device(in, &valid);
      std::uint64_t h = 0;
      CALL(Expect::kError, valid ? capalloc_pool_create(0, nullptr) : capalloc_pool_create(device, &h));
      return;
    }
  }
}

void op_capture_begin(FuzzedDataProvider& in, State& st) {
  const int kind = in.ConsumeIntegralInRange<int>(0, 5);
  const std::string label = pick_key(in);
  const char* label_arg = in.ConsumeIntegralInRange<int>(0, 4) == 0 ? nullptr : label.c_str();
  if (kind <= 2) {  // a valid capture
    if (st.streams.empty()) return;
    void* s = st.streams[in.ConsumeIntegralInRange<std::size_t>(0, st.streams.size() - 1)];
    std::uint64_t pool = 0;
    if (kind >= 1 && !st.pools.empty()) {
      pool = st.pools[in.ConsumeIntegralInRange<std::size_t>(0, st.pools.size() - 1)];
    }
    const bool already = is_capturing(st, s);
    tracef("capture on stream %p into pool %llu", s, static_cast<unsigned long long>(pool));
    if (CALL(already ? Expect::kError : Expect::kAny, capalloc_capture_begin(0, s, pool, label_arg)) ==
        CAPALLOC_OK) {
      st.capturing.insert(s);
    }
    return;
  }
  if (kind == 3) {  // the default stream, or a bad one
    const auto bad = in.ConsumeBool() ? std::optional<void*>(nullptr) : pick_bad_stream(in, st);
    if (!bad) return;
    CALL(Expect::kError, capalloc_capture_begin(0, *bad, 0, label_arg));
    return;
  }
  if (st.streams.empty()) return;
  void* s = st.streams[in.ConsumeIntegralInRange<std::size_t>(0, st.streams.size() - 1)];
  if (kind == 4) {  // a pool we do not hold
    const std::uint64_t pool = pick_bad_pool(in, st);
    if (std::find(st.pools.begin(), st.pools.end(), pool) != st.pools.end()) return;
    if (CALL(Expect::kError, capalloc_capture_begin(0, s, pool, label_arg)) == CAPALLOC_OK) {
      st.capturing.insert(s);
    }
    return;
  }
  bool valid = true;
  const int device = pick_device(in, &valid);
  if (valid) return;
  CALL(Expect::kError, capalloc_capture_begin(device, s, 0, label_arg));
}

void op_capture_end(FuzzedDataProvider& in, State& st) {
  const int kind = in.ConsumeIntegralInRange<int>(0, 4);
  const char* json = nullptr;
  const bool want_json = in.ConsumeBool();
  if (kind <= 2) {
    if (st.capturing.empty()) return;
    auto it = st.capturing.begin();
    std::advance(it, in.ConsumeIntegralInRange<std::size_t>(0, st.capturing.size() - 1));
    void* s = *it;
    tracef("end capture on stream %p", s);
    std::uint64_t graph = 0;
    const capalloc_status r =
        CALL(Expect::kAny, capalloc_capture_end(s, &graph, want_json ? &json : nullptr));
    // The runtime ends the capture whatever the outcome; the next end (in
    // the teardown) says if it did not.
    st.capturing.erase(it);
    if (r == CAPALLOC_OK) {
      add_graph(st, graph);
      if (want_json) require_json(json, "capalloc_capture_end", true);
    }
    return;
  }
  if (kind == 3) {  // a stream not capturing, or a bad one
    void* s = pick_live_stream(in, st);
    if (st.capturing.count(s)) return;
    std::uint64_t graph = 0;
    CALL(Expect::kError, capalloc_capture_end(s, &graph, nullptr));
    const auto bad = pick_bad_stream(in, st);
    if (bad) CALL(Expect::kError, capalloc_capture_end(*bad, &graph, nullptr));
    return;
  }
  if (st.capturing.empty()) return;
  CALL(Expect::kError, capalloc_capture_end(*st.capturing.begin(), nullptr, &json));
}

void op_graph(FuzzedDataProvider& in, State& st) {
  switch (in.ConsumeIntegralInRange<int>(0, 4)) {
    case 0:
    case 1: {
      if (st.graphs.empty()) return;
      const std::uint64_t g = st.graphs[in.ConsumeIntegralInRange<std::size_t>(0, st.graphs.size() - 1)];
      void* s = pick_live_stream(in, st);
      CALL(Expect::kAny, capalloc_graph_replay(g, s));
      return;
    }
    case 2: {
      if (st.graphs.empty()) return;
      const std::size_t i = in.ConsumeIntegralInRange<std::size_t>(0, st.graphs.size() - 1);
      const std::uint64_t g = st.graphs[i];
      if (CALL(Expect::kAny, capalloc_graph_destroy(g)) == CAPALLOC_OK) {
        st.graphs.erase(st.graphs.begin() + static_cast<std::ptrdiff_t>(i));
        st.dead_graphs.push_back(g);
      }
      return;
    }
    case 3: {
      const std::uint64_t g = pick_bad_graph(in, st);
      if (std::find(st.graphs.begin(), st.graphs.end(), g) != st.graphs.end()) return;
      if (in.ConsumeBool()) {
        CALL(Expect::kError, capalloc_graph_replay(g, pick_live_stream(in, st)));
      } else {
        CALL(Expect::kError, capalloc_graph_destroy(g));
      }
      return;
    }
    default: {  // a replay on a bad stream
      if (st.graphs.empty()) return;
      const auto bad = pick_bad_stream(in, st);
      if (!bad) return;
      CALL(Expect::kError, capalloc_graph_replay(st.graphs.front(), *bad));
      return;
    }
  }
}

void op_persistent(FuzzedDataProvider& in, State& st) {
  const std::string key = pick_key(in);
  const auto known = st.persistent.find(key);
  switch (in.ConsumeIntegralInRange<int>(0, 6)) {
    case 0:
    case 1: {
      const std::size_t bytes = in.ConsumeBool() ? pick_size(in) % (1 << 20) + 1 : pick_size(in);
      const bool null_out = in.ConsumeIntegralInRange<int>(0, 4) == 0;
      if (known == st.persistent.end() &&
          (st.live.size() >= kMaxBlocks || st.live_bytes + bytes > kLiveBytesCap)) {
        return;
      }
      void* p = nullptr;
      const capalloc_status r = CALL(
          Expect::kAny, capalloc_preallocate(0, key.c_str(), bytes, null_out ? nullptr : &p));
      if (key.empty() && r == CAPALLOC_OK) die("capalloc_preallocate accepted an empty key");
      if (r != CAPALLOC_OK) return;
      if (known != st.persistent.end()) {
        const Block& b = st.live.at(known->second);
        if (bytes > b.size) die("capalloc_preallocate grew key \"%s\"", key.c_str());
        if (!null_out && p != reinterpret_cast<void*>(b.addr)) {
          die("capalloc_preallocate(\"%s\") returned %p, the key holds %p", key.c_str(), p,
              reinterpret_cast<void*>(b.addr));
        }
        return;
      }
      if (null_out) {
        // The block is live; learn its address through capalloc_get.
        if (CALL(Expect::kOk, capalloc_get(0, key.c_str(), &p)) != CAPALLOC_OK) return;
      }
      Block& b = add_block(st, p, bytes, "capalloc_preallocate");
      b.owned = true;
      b.key = key;
      if (!any_capture(st)) write_pattern(b, st.next_seed++);
      st.persistent.emplace(key, b.addr);
      return;
    }
    case 2: {
      void* p = nullptr;
      const capalloc_status r = CALL(known == st.persistent.end() ? Expect::kError : Expect::kOk,
                                     capalloc_get(0, key.c_str(), &p));
      if (r == CAPALLOC_OK && p != reinterpret_cast<void*>(known->second)) {
        die("capalloc_get(\"%s\") returned %p, the key holds %p", key.c_str(), p,
            reinterpret_cast<void*>(known->second));
      }
      return;
    }
    case 3: {
      if (known == st.persistent.end()) {
        CALL(Expect::kError, capalloc_release_persistent(0, key.c_str()));
        return;
      }
      verify_pattern(st.live.at(known->second), "before release_persistent");
      if (CALL(Expect::kAny, capalloc_release_persistent(0, key.c_str())) == CAPALLOC_OK) {
        remove_block(st, known->second);
        st.persistent.erase(known);
      }
      return;
    }
    case 4: {  // unknown devices: nothing is found, nothing is made
      bool valid = true;
      const int device = pick_device(in, &valid);
      if (valid) return;
      void* p = nullptr;
      CALL(Expect::kError, capalloc_preallocate(device, key.c_str(), 64, &p));
      CALL(Expect::kError, capalloc_get(device, key.c_str(), &p));
      CALL(Expect::kError, capalloc_release_persistent(device, key.c_str()));
      return;
    }
    case 5: {  // NULL arguments, zero and huge sizes
      void* p = nullptr;
      CALL(Expect::kError, capalloc_preallocate(0, nullptr, 64, &p));
      CALL(Expect::kError, capalloc_get(0, nullptr, &p));
      CALL(Expect::kError, capalloc_get(0, key.c_str(), nullptr));
      CALL(Expect::kError, capalloc_release_persistent(0, nullptr));
      if (known == st.persistent.end()) {
        CALL(Expect::kError, capalloc_preallocate(0, key.c_str(), 0, &p));
        CALL(Expect::kError, capalloc_preallocate(0, key.c_str(), pick_huge_size(in), &p));
      }
      return;
    }
    default: {  // a plain free of an owned buffer is refused
      if (known == st.persistent.end()) return;
      CALL(Expect::kError, capalloc_free(reinterpret_cast<void*>(known->second)));
      return;
    }
  }
}

void op_torch_pool(FuzzedDataProvider& in, State& st) {
  const auto id = pick_torch_pool(in);
  const bool zero = id.first == 0 && id.second == 0;
  bool valid_device = true;
  const int device = in.ConsumeIntegralInRange<int>(0, 5) == 0 ? pick_device(in, &valid_device) : 0;
  switch (in.ConsumeIntegralInRange<int>(0, 4)) {
    case 0:
    case 1: {
      if (valid_device && !zero && st.torch[id].begins >= 6) return;
      capalloc_stream_filter filter = nullptr;
      void* context = nullptr;
      switch (in.ConsumeIntegralInRange<int>(0, 3)) {
        case 0:
          filter = accept_all;
          break;
        case 1:
          filter = reject_all;
          break;
        case 2:
          filter = accept_if_context;
          context = pick_live_stream(in, st);
          break;
        default:
          break;
      }
      const capalloc_status r =
          CALL(zero || !valid_device ? Expect::kError : Expect::kAny,
               capalloc_torch_begin_allocate_to_pool(device, id.first, id.second, filter, context));
      if (r == CAPALLOC_OK) ++st.torch[id].begins;
      return;
    }
    case 2: {
      const char* json = nullptr;
      const bool want = in.ConsumeBool();
      const capalloc_status r =
          CALL(zero || !valid_device || st.torch.count(id) == 0 ? Expect::kError : Expect::kAny,
               capalloc_torch_end_allocate_to_pool(device, id.first, id.second,
                                                   want ? &json : nullptr));
      if (r == CAPALLOC_OK && want) require_json(json, "capalloc_torch_end_allocate_to_pool", true);
      return;
    }
    case 3:
      CALL(zero || !valid_device || st.torch.count(id) == 0 ? Expect::kError : Expect::kAny,
           capalloc_torch_release_pool(device, id.first, id.second));
      return;
    default: {
      std::uint64_t pool = 0;
      int uses = 0;
      const bool null_uses = in.ConsumeBool();
      const capalloc_status r =
          CALL(!valid_device || st.torch.count(id) == 0 ? Expect::kError : Expect::kAny,
               capalloc_torch_pool(device, id.first, id.second, &pool,
                                   null_uses ? nullptr : &uses));
      if (r == CAPALLOC_OK && (pool == 0 || (!null_uses && uses < 1))) {
        die("capalloc_torch_pool: pool %llu with %d uses", static_cast<unsigned long long>(pool),
            uses);
      }
      CALL(Expect::kError, capalloc_torch_pool(device, id.first, id.second, nullptr, &uses));
      return;
    }
  }
}

void op_misc(FuzzedDataProvider& in, State& st) {
  switch (in.ConsumeIntegralInRange<int>(0, 9)) {
    case 0: {
      bool valid = true;
      const int device = in.ConsumeBool() ? -1 : pick_device(in, &valid);
      if (device == -1) valid = true;  // every device
      CALL(valid ? Expect::kAny : Expect::kError, capalloc_empty_cache(device));
      return;
    }
    case 1: {
      bool valid = true;
      const int device = pick_device(in, &valid);
      capalloc_stats s{};
      CALL(valid ? Expect::kOk : Expect::kError, capalloc_get_stats(device, &s));
      CALL(Expect::kError, capalloc_get_stats(0, nullptr));
      return;
    }
    case 2: {
      const char* json = nullptr;
      CALL(Expect::kOk, capalloc_check(&json));
      require_json(json, "capalloc_check", true);
      CALL(Expect::kError, capalloc_check(nullptr));
      return;
    }
    case 3: {
      const char* json = nullptr;
      CALL(Expect::kOk, capalloc_snapshot(&json));
      require_json(json, "capalloc_snapshot", false);
      CALL(Expect::kError, capalloc_snapshot(nullptr));
      return;
    }
    case 4: {
      const int strict = in.ConsumeIntegralInRange<int>(-1, 3);
      const bool valid = strict >= 0 && strict <= 2;
      if (CALL(valid ? Expect::kOk : Expect::kError, capalloc_set_strict(strict)) == CAPALLOC_OK) {
        st.strict_set = true;
        int now = -1;
        CALL(Expect::kOk, capalloc_get_strict(&now));
        if (now != strict) die("capalloc_get_strict says %d after capalloc_set_strict(%d)", now, strict);
      }
      CALL(Expect::kError, capalloc_get_strict(nullptr));
      return;
    }
    case 5: {  // waivers
      const std::string tag = pick_key(in);
      const std::string reason = pick_key(in);
      const bool live_graph = !st.graphs.empty() && in.ConsumeBool();
      const std::uint64_t g =
          live_graph ? st.graphs[in.ConsumeIntegralInRange<std::size_t>(0, st.graphs.size() - 1)]
                     : pick_bad_graph(in, st);
      const void* victim = nullptr;
      if (in.ConsumeBool()) {
        const Block* b = pick_block(in, st, true);
        victim = b ? reinterpret_cast<const void*>(b->addr + in.ConsumeIntegralInRange<std::size_t>(0, b->size - 1))
                   : pick_bad_pointer(in, st);
      }
      const bool null_tag = in.ConsumeBool();
      const bool null_reason = in.ConsumeIntegralInRange<int>(0, 4) == 0;
      const bool known_graph =
          std::find(st.graphs.begin(), st.graphs.end(), g) != st.graphs.end();
      const bool must_fail = null_reason || reason.empty() || !known_graph ||
                             (victim == nullptr && (null_tag || tag.empty())) ||
                             (victim != nullptr && block_containing(st, reinterpret_cast<std::uintptr_t>(victim)) == nullptr);
      CALL(must_fail ? Expect::kError : Expect::kAny,
           capalloc_waive(g, victim, null_tag ? nullptr : tag.c_str(),
                          null_reason ? nullptr : reason.c_str()));
      return;
    }
    case 6: {
      const char* name = capalloc_runtime_name();
      if (name == nullptr || std::strcmp(name, "host") != 0) die("runtime is not host");
      return;
    }
    case 7: {  // check every pattern
      for (const auto& [addr, b] : st.live) verify_pattern(b, "pattern sweep");
      return;
    }
    default: {
      // Re-writes one block's pattern (a kernel would), so that stale
      // patterns of reused memory cannot pass by luck.
      if (st.live.empty()) return;
      auto it = st.live.begin();
      std::advance(it, in.ConsumeIntegralInRange<std::size_t>(0, st.live.size() - 1));
      if (it->second.patterned) write_pattern(it->second, st.next_seed++);
      return;
    }
  }
}

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

// A whole capture at once (the separate begin and end operations rarely
// line up with allocations in between): begin on a stream, a few
// allocations, frees and replays on it, then usually the end. Captures into
// a shared pool reuse each other's memory, which is what findings are made
// of.
void op_capture_scenario(FuzzedDataProvider& in, State& st) {
  if (st.streams.size() < kMaxStreams && (st.streams.empty() || in.ConsumeBool())) {
    void* s = nullptr;
    if (CALL(Expect::kAny, capalloc_stream_create(0, &s)) == CAPALLOC_OK) st.streams.push_back(s);
  }
  std::vector<void*> idle;
  for (void* s : st.streams) {
    if (!is_capturing(st, s)) idle.push_back(s);
  }
  if (idle.empty()) return;
  void* s = idle[in.ConsumeIntegralInRange<std::size_t>(0, idle.size() - 1)];
  std::uint64_t pool = 0;
  switch (in.ConsumeIntegralInRange<int>(0, 2)) {
    case 0:
      break;
    case 1:
      if (!st.pools.empty()) {
        pool = st.pools[in.ConsumeIntegralInRange<std::size_t>(0, st.pools.size() - 1)];
        break;
      }
      [[fallthrough]];
    default:
      if (st.pools.size() < 8 && CALL(Expect::kAny, capalloc_pool_create(0, &pool)) == CAPALLOC_OK) {
        st.pools.push_back(pool);
      } else {
        pool = 0;
      }
      break;
  }
  tracef("capture scenario on stream %p into pool %llu", s, static_cast<unsigned long long>(pool));
  if (CALL(Expect::kAny, capalloc_capture_begin(0, s, pool, "scenario")) != CAPALLOC_OK) return;
  st.capturing.insert(s);
  std::vector<std::uintptr_t> mine;  // allocated in this capture, still live
  const int steps = in.ConsumeIntegralInRange<int>(1, 10);
  for (int i = 0; i < steps; ++i) {
    switch (in.ConsumeIntegralInRange<int>(0, 6)) {
      case 0:
      case 1:
      case 2: {
        const std::size_t size = in.ConsumeBool() ? in.ConsumeIntegralInRange<std::size_t>(1, 8192)
                                                  : pick_size(in);
        if (st.live.size() >= kMaxBlocks || st.live_bytes + size > kLiveBytesCap) break;
        void* p = nullptr;
        if (in.ConsumeBool()) {
          const std::string tag = pick_key(in);
          if (CALL(Expect::kAny, capalloc_malloc_tagged(&p, size, 0, s, tag.c_str(), 0)) !=
              CAPALLOC_OK) {
            break;
          }
        } else if (CALL(Expect::kAny, capalloc_malloc(&p, size, 0, s)) != CAPALLOC_OK) {
          break;
        }
        tracef("  capture malloc(%zu) = %p", size, p);
        add_block(st, p, size, "capalloc_malloc (capturing)");
        mine.push_back(reinterpret_cast<std::uintptr_t>(p));
        break;
      }
      case 3: {  // free one of this capture's blocks
        if (mine.empty()) break;
        const std::size_t j = in.ConsumeIntegralInRange<std::size_t>(0, mine.size() - 1);
        tracef("  capture free %p", reinterpret_cast<void*>(mine[j]));
        if (CALL(Expect::kAny, capalloc_free(reinterpret_cast<void*>(mine[j]))) == CAPALLOC_OK) {
          remove_block(st, mine[j]);
        }
        mine.erase(mine.begin() + static_cast<std::ptrdiff_t>(j));
        break;
      }
      case 4: {  // free (or use) a block from outside the capture
        const Block* b = pick_block(in, st, false);
        if (b == nullptr) break;
        const std::uintptr_t addr = b->addr;
        if (in.ConsumeBool()) {
          CALL(Expect::kAny, capalloc_record_stream(reinterpret_cast<void*>(addr), s));
          break;
        }
        verify_pattern(*b, "before free (during a capture)");
        if (CALL(Expect::kAny, capalloc_free(reinterpret_cast<void*>(addr))) == CAPALLOC_OK) {
          remove_block(st, addr);
          mine.erase(std::remove(mine.begin(), mine.end(), addr), mine.end());
        }
        break;
      }
      case 5: {  // work: a memset of this capture's blocks, or a kernel
        if (!mine.empty() && in.ConsumeBool()) {
          const Block& b =
              st.live.at(mine[in.ConsumeIntegralInRange<std::size_t>(0, mine.size() - 1)]);
          const std::size_t offset = in.ConsumeIntegralInRange<std::size_t>(0, b.size - 1);
          const std::size_t bytes = in.ConsumeIntegralInRange<std::size_t>(1, b.size - offset);
          tracef("  memset %p + %zu, %zu bytes", reinterpret_cast<void*>(b.addr), offset, bytes);
          device_runtime()
              .memset_async(reinterpret_cast<void*>(b.addr + offset), in.ConsumeIntegral<std::uint8_t>(),
                            bytes, reinterpret_cast<capalloc::StreamHandle>(s))
              .IgnoreError();
        } else {
          launch_bodiless_kernel(in, st, s);
        }
        break;
      }
      default: {  // a graph launched into the capture
        if (st.graphs.empty()) break;
        const std::uint64_t g =
            st.graphs[in.ConsumeIntegralInRange<std::size_t>(0, st.graphs.size() - 1)];
        CALL(Expect::kAny, capalloc_graph_replay(g, s));
        break;
      }
    }
    check_all(st, "a capture scenario's step");
  }
  if (in.ConsumeIntegralInRange<int>(0, 7) == 0) return;  // left open
  std::uint64_t graph = 0;
  const char* json = nullptr;
  const capalloc_status r = CALL(Expect::kAny, capalloc_capture_end(s, &graph, &json));
  st.capturing.erase(s);
  if (r != CAPALLOC_OK) return;
  add_graph(st, graph);
  require_json(json, "capalloc_capture_end", true);
  if (in.ConsumeBool()) CALL(Expect::kAny, capalloc_graph_replay(graph, pick_live_stream(in, st)));
}

// A capture begun on the runtime directly, as PyTorch captures, with its
// allocations through PyTorch's entry points: the pool hooks route them to
// a PyTorch pool (capalloc_torch_begin_allocate_to_pool before the capture,
// the end hook after it), or the allocator finds the capture by itself and
// gives it a private pool that lives as long as the runtime's graph.
void op_native_capture(FuzzedDataProvider& in, State& st) {
  capalloc::DeviceRuntime& rt = device_runtime();
  const int kind = in.ConsumeIntegralInRange<int>(0, 5);
  if (kind == 4) {  // replay or destroy a graph of the runtime
    if (st.native_graphs.empty()) return;
    const std::size_t i = in.ConsumeIntegralInRange<std::size_t>(0, st.native_graphs.size() - 1);
    const std::uint64_t g = st.native_graphs[i];
    if (in.ConsumeBool()) {
      void* s = pick_live_stream(in, st);
      tracef("runtime: launch graph %llu on stream %p", static_cast<unsigned long long>(g), s);
      rt.launch_graph(g, reinterpret_cast<capalloc::StreamHandle>(s)).IgnoreError();
    } else {
      tracef("runtime: destroy graph %llu", static_cast<unsigned long long>(g));
      if (rt.destroy_graph(g).ok()) {
        st.native_graphs.erase(st.native_graphs.begin() + static_cast<std::ptrdiff_t>(i));
      }
    }
    return;
  }
  if (kind == 5) {  // end a capture left open
    if (st.native.empty()) return;
    void* s = *st.native.begin();
    tracef("runtime: end capture on stream %p", s);
    auto graph = rt.end_capture(reinterpret_cast<capalloc::StreamHandle>(s));
    st.native.erase(s);  // over, whatever the outcome
    if (graph.ok()) st.native_graphs.push_back(*graph);
    return;
  }
  std::vector<void*> idle;
  for (void* s : st.streams) {
    if (!is_capturing(st, s)) idle.push_back(s);
  }
  if (idle.empty()) return;
  void* s = idle[in.ConsumeIntegralInRange<std::size_t>(0, idle.size() - 1)];
  const auto handle = reinterpret_cast<capalloc::StreamHandle>(s);
  // PyTorch announces the pool before the capture exists.
  std::optional<std::pair<std::uint64_t, std::uint64_t>> torch_pool;
  if (in.ConsumeIntegralInRange<int>(0, 3) != 0) {
    const auto id = pick_torch_pool(in);
    const bool zero = id.first == 0 && id.second == 0;
    if (zero || st.torch[id].begins < 6) {
      capalloc_stream_filter filter = in.ConsumeBool() ? accept_if_context : accept_all;
      if (in.ConsumeIntegralInRange<int>(0, 5) == 0) filter = reject_all;
      if (CALL(zero ? Expect::kError : Expect::kAny,
               capalloc_torch_begin_allocate_to_pool(0, id.first, id.second, filter, s)) ==
          CAPALLOC_OK) {
        ++st.torch[id].begins;
        torch_pool = id;
      }
    }
  }
  static constexpr capalloc::CaptureMode kModes[] = {
      capalloc::CaptureMode::kGlobal, capalloc::CaptureMode::kThreadLocal,
      capalloc::CaptureMode::kRelaxed};
  const capalloc::CaptureMode mode = in.PickValueInArray(kModes);
  tracef("runtime: capture on stream %p (mode %d)", s, static_cast<int>(mode));
  if (!rt.begin_capture(handle, mode).ok()) return;
  st.native.insert(s);
  // The C ABI's own capture calls refuse a capture they did not begin.
  std::uint64_t graph = 0;
  CALL(Expect::kError, capalloc_capture_end(s, &graph, nullptr));
  CALL(Expect::kError, capalloc_capture_begin(0, s, 0, nullptr));
  CALL(Expect::kError, capalloc_stream_synchronize(s));

  std::vector<std::uintptr_t> mine;
  const int steps = in.ConsumeIntegralInRange<int>(1, 10);
  for (int i = 0; i < steps; ++i) {
    switch (in.ConsumeIntegralInRange<int>(0, 4)) {
      case 0:
      case 1: {
        const std::size_t size = in.ConsumeBool() ? in.ConsumeIntegralInRange<std::size_t>(1, 8192)
                                                  : pick_size(in);
        if (st.live.size() >= kMaxBlocks || st.live_bytes + size > kLiveBytesCap) break;
        void* p = nullptr;
        if (in.ConsumeIntegralInRange<int>(0, 3) != 0) {
          p = capalloc_torch_malloc(size, 0, s);
        } else if (CALL(Expect::kAny, capalloc_malloc(&p, size, 0, s)) != CAPALLOC_OK) {
          p = nullptr;
        }
        tracef("  native capture malloc(%zu) = %p", size, p);
        if (p == nullptr) break;
        add_block(st, p, size, "malloc (native capture)");
        mine.push_back(reinterpret_cast<std::uintptr_t>(p));
        break;
      }
      case 2: {  // PyTorch's free of one of this capture's blocks
        if (mine.empty()) break;
        const std::size_t j = in.ConsumeIntegralInRange<std::size_t>(0, mine.size() - 1);
        const auto addr = mine[j];
        const capalloc_stats before = stats_now("torch_free (native capture)");
        capalloc_torch_free(reinterpret_cast<void*>(addr), st.live.at(addr).size, 0, s);
        const capalloc_stats after = stats_now("torch_free (native capture)");
        tracef("  native capture torch_free %p: %lld blocks -> %lld", reinterpret_cast<void*>(addr),
               static_cast<long long>(before.allocated_blocks),
               static_cast<long long>(after.allocated_blocks));
        if (after.allocated_blocks == before.allocated_blocks - 1) remove_block(st, addr);
        mine.erase(mine.begin() + static_cast<std::ptrdiff_t>(j));
        break;
      }
      case 3: {
        if (!mine.empty() && in.ConsumeBool()) {
          const Block& b =
              st.live.at(mine[in.ConsumeIntegralInRange<std::size_t>(0, mine.size() - 1)]);
          const std::size_t offset = in.ConsumeIntegralInRange<std::size_t>(0, b.size - 1);
          const std::size_t bytes = in.ConsumeIntegralInRange<std::size_t>(1, b.size - offset);
          tracef("  memset %p + %zu, %zu bytes", reinterpret_cast<void*>(b.addr), offset, bytes);
          rt.memset_async(reinterpret_cast<void*>(b.addr + offset), in.ConsumeIntegral<std::uint8_t>(),
                          bytes, handle)
              .IgnoreError();
        } else {
          launch_bodiless_kernel(in, st, s);
        }
        break;
      }
      default: {  // a graph launched into the capture
        if (st.native_graphs.empty()) break;
        rt.launch_graph(st.native_graphs[in.ConsumeIntegralInRange<std::size_t>(
                            0, st.native_graphs.size() - 1)],
                        handle)
            .IgnoreError();
        break;
      }
    }
    check_all(st, "a native capture's step");
  }
  if (in.ConsumeIntegralInRange<int>(0, 7) == 0) return;  // left open
  tracef("runtime: end capture on stream %p", s);
  auto ended = rt.end_capture(handle);
  st.native.erase(s);
  if (ended.ok()) st.native_graphs.push_back(*ended);
  if (torch_pool && in.ConsumeIntegralInRange<int>(0, 3) != 0) {
    const char* json = nullptr;
    if (CALL(Expect::kAny, capalloc_torch_end_allocate_to_pool(0, torch_pool->first,
                                                              torch_pool->second, &json)) ==
        CAPALLOC_OK) {
      require_json(json, "capalloc_torch_end_allocate_to_pool", true);
    }
  }
  if (ended.ok() && in.ConsumeBool()) {
    rt.launch_graph(*ended, reinterpret_cast<capalloc::StreamHandle>(pick_live_stream(in, st)))
        .IgnoreError();
  }
}

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

}  // namespace

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
