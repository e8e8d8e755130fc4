// tests/fuzz/c_api_fuzzer.hpp: what the C ABI fuzzer's files share
// (tests/fuzz/c_api_fuzzer.cpp says what it calls and what it checks): the
// checks every call goes through, the model of what the input made, the
// helpers that decode the input, and the operations.
#ifndef CAPALLOC_TESTS_FUZZ_C_API_FUZZER_HPP_
#define CAPALLOC_TESTS_FUZZ_C_API_FUZZER_HPP_

#include <fuzzer/FuzzedDataProvider.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "capalloc/capalloc.h"
#include "capalloc/runtime.hpp"

namespace capalloc::fuzz {

// --- Checks (c_api_checks.cpp) -----------------------------------------------

// Prints the violated invariant and the last error, and traps: libFuzzer
// records the input.
[[noreturn]] __attribute__((format(printf, 1, 2))) void die(const char* fmt, ...);

// What a status call must return.
enum class Expect { kAny, kOk, kError };

// FUZZ_TRACE=1 prints every call and its status: for reading a
// crashing input (run the fuzzer binary on the file alone).
extern bool g_trace;
__attribute__((format(printf, 1, 2))) void tracef(const char* fmt, ...);

// Checks what every status-returning call promises: a known code, an empty
// last error on success and a message on failure; then `expect`.
capalloc_status checked(capalloc_status s, Expect expect, const char* what);

#define CALL(expect, call) checked((call), (expect), #call)

// Fails unless `json` parses, as an array or as an object.
void require_json(const char* json, const char* what, bool array);

// --- The model (c_api_model.cpp) -----------------------------------------------

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

void write_pattern(Block& b, std::uint8_t seed);
void verify_pattern(const Block& b, const char* when);
const Block* block_containing(const State& st, std::uintptr_t addr);
Block& add_block(State& st, void* ptr, std::size_t size, const char* what);
void remove_block(State& st, std::uintptr_t addr);
capalloc_stats stats_now(const char* when);
void check_all(const State& st, const char* when);
void add_graph(State& st, std::uint64_t graph);
bool any_capture(const State& st);
bool is_capturing(const State& st, void* s);

// --- Decoding helpers (c_api_decode.cpp) ----------------------------------------

int pick_device(FuzzedDataProvider& in, bool* valid);
std::size_t pick_size(FuzzedDataProvider& in);
std::size_t pick_huge_size(FuzzedDataProvider& in);
std::string pick_key(FuzzedDataProvider& in);
void* pick_live_stream(FuzzedDataProvider& in, const State& st);
bool is_live_stream(const State& st, void* s);
std::optional<void*> pick_bad_stream(FuzzedDataProvider& in, const State& st);
const Block* pick_block(FuzzedDataProvider& in, const State& st, bool include_owned);
void* pick_bad_pointer(FuzzedDataProvider& in, const State& st);
std::uint64_t pick_bad_pool(FuzzedDataProvider& in, const State& st);
std::uint64_t pick_bad_graph(FuzzedDataProvider& in, const State& st);
// PyTorch's pool filters.
int accept_all(void*, void*);
int reject_all(void*, void*);
int accept_if_context(void* context, void* stream);
std::pair<std::uint64_t, std::uint64_t> pick_torch_pool(FuzzedDataProvider& in);

// --- Operations: each decodes its call(s) from `in` and checks them ------------

// Blocks, plain and persistent (c_api_ops_blocks.cpp).
void op_malloc(FuzzedDataProvider& in, State& st);
void op_free(FuzzedDataProvider& in, State& st);
void op_free_bad(FuzzedDataProvider& in, State& st);
void op_malloc_bad(FuzzedDataProvider& in, State& st);
void op_record_stream(FuzzedDataProvider& in, State& st);
void op_persistent(FuzzedDataProvider& in, State& st);
// Streams, pools, captures and graphs (c_api_ops_handles.cpp).
void op_stream(FuzzedDataProvider& in, State& st);
void op_pool(FuzzedDataProvider& in, State& st);
void op_capture_begin(FuzzedDataProvider& in, State& st);
void op_capture_end(FuzzedDataProvider& in, State& st);
void op_graph(FuzzedDataProvider& in, State& st);
// PyTorch's pool hooks, and the rest of the ABI (c_api_ops_misc.cpp).
void op_torch_pool(FuzzedDataProvider& in, State& st);
void op_misc(FuzzedDataProvider& in, State& st);
// Work on the runtime directly (c_api_ops_kernels.cpp).
capalloc::DeviceRuntime& device_runtime();
void launch_bodiless_kernel(FuzzedDataProvider& in, const State& st, void* stream);
void op_kernel(FuzzedDataProvider& in, State& st);
// Whole captures, through the C ABI and native (c_api_ops_captures.cpp).
void op_capture_scenario(FuzzedDataProvider& in, State& st);
void op_native_capture(FuzzedDataProvider& in, State& st);

// --- Teardown (c_api_fuzzer.cpp) ----------------------------------------------

// Releases everything the input created; afterwards the allocator must hold
// nothing.
void teardown(State& st);

}  // namespace capalloc::fuzz

#endif  // CAPALLOC_TESTS_FUZZ_C_API_FUZZER_HPP_
