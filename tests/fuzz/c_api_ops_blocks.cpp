// tests/fuzz/c_api_ops_blocks.cpp: the C ABI fuzzer's operations on blocks
// (tests/fuzz/c_api_fuzzer.cpp): malloc and free (plain, tagged, PyTorch's),
// malformed ones, record_stream, and persistent buffers by key.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>

#include "c_api_fuzzer.hpp"
#include "capalloc/capalloc.h"

namespace capalloc::fuzz {

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

}  // namespace capalloc::fuzz
