// tests/fuzz/c_api_ops_misc.cpp: the C ABI fuzzer's other operations
// (tests/fuzz/c_api_fuzzer.cpp): PyTorch's pool hooks, and empty_cache,
// stats, checks, snapshots, strict mode, waivers and pattern sweeps.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <string>

#include "c_api_fuzzer.hpp"
#include "capalloc/capalloc.h"

namespace capalloc::fuzz {

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

// A call that answers JSON through its one out-parameter: it succeeds with
// text that parses (an array, or an object), and refuses a NULL
// out-parameter. A macro, as CALL is, so that the calls' traces and
// messages name them.
#define CHECK_JSON_ANSWER(fn, array)        \
  do {                                      \
    const char* json = nullptr;             \
    CALL(Expect::kOk, fn(&json));           \
    require_json(json, #fn, array);         \
    CALL(Expect::kError, fn(nullptr));      \
  } while (false)

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
    case 2:
      CHECK_JSON_ANSWER(capalloc_check, true);
      return;
    case 3:
      CHECK_JSON_ANSWER(capalloc_snapshot, false);
      return;
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

#undef CHECK_JSON_ANSWER

}  // namespace capalloc::fuzz
