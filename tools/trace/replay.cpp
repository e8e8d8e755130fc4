// tools/trace/replay.cpp: see replay.hpp. The loop is a template over the
// backend (replay_backends.hpp), so that each allocator's calls are direct
// and the loop itself is the same for all of them: decoded ops in an array,
// block pointers in a slot array sized before the pass, nothing allocated,
// parsed or hashed while it runs.
#include "tools/trace/replay.hpp"

#include <time.h>

#include <chrono>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "tools/trace/cuda_async_backend.hpp"
#include "tools/trace/replay_backends.hpp"
#include "tools/trace/trace_reader.hpp"

namespace capalloc::trace {

namespace {

struct EventCost {
  std::uint64_t count = 0;
  std::uint64_t ns = 0;
};

struct PassResult {
  std::uint64_t ops_outside = 0, ns_outside = 0;  // operations with no capture active
  std::uint64_t ops_inside = 0, ns_inside = 0;    // operations while a capture is active
  std::vector<float> batch_ns_per_op;
  EventCost capture_begin, capture_end, replay, graph_destroy;
  std::uint64_t cpu_ns = 0;  // the replaying thread's CPU time over the whole pass
  bool failed = false;
  std::size_t failed_op = 0;
};

std::uint64_t thread_cpu_ns() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<std::uint64_t>(ts.tv_sec) * 1000000000u + static_cast<std::uint64_t>(ts.tv_nsec);
}

std::uint64_t now_ns() {
  return static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                        std::chrono::steady_clock::now().time_since_epoch())
                                        .count());
}

// The counted pass's operations: out of line, so that callgrind's inclusive
// cost of each is what one allocation or one free cost.
template <typename Backend>
[[gnu::noinline]] void* counted_alloc(Backend& backend, std::uint64_t size, std::uint32_t stream) {
  return backend.alloc(size, stream);
}
template <typename Backend>
[[gnu::noinline]] void counted_free(Backend& backend, void* p, std::uint64_t size,
                                    std::uint32_t stream) {
  backend.free(p, size, stream);
}

template <typename Backend>
bool capture_event(Backend& backend, const TraceOp& op, int& capturing) {
  switch (op.kind) {
    case OpKind::kCaptureBegin:
      ++capturing;
      return backend.capture_begin(op.index, op.stream, op.pool);
    case OpKind::kCaptureEnd:
      --capturing;
      return backend.capture_end(op.index);
    case OpKind::kReplay:
      return backend.replay(op.index);
    case OpKind::kGraphDestroy:
      return backend.graph_destroy(op.index);
    default:
      return false;
  }
}

template <typename Backend, bool kTimed>
inline void replay_ops(Backend& backend, const Trace& trace, void** slots, PassResult& r) {
  const TraceOp* const ops = trace.ops.data();
  const std::size_t n = trace.ops.size();
  int capturing = 0;
  std::size_t i = 0;
  while (i < n) {
    if (ops[i].kind >= OpKind::kCaptureBegin) {
      const std::uint64_t t0 = kTimed ? now_ns() : 0;
      const bool ok = capture_event(backend, ops[i], capturing);
      if constexpr (kTimed) {
        EventCost& cost = ops[i].kind == OpKind::kCaptureBegin ? r.capture_begin
                          : ops[i].kind == OpKind::kCaptureEnd ? r.capture_end
                          : ops[i].kind == OpKind::kReplay     ? r.replay
                                                               : r.graph_destroy;
        ++cost.count;
        cost.ns += now_ns() - t0;
      }
      if (!ok) {
        r.failed = true;
        r.failed_op = i;
        return;
      }
      ++i;
      continue;
    }
    const std::uint64_t t0 = kTimed ? now_ns() : 0;
    unsigned done = 0;
    for (; i < n && done < kBatchOps; ++i) {
      const TraceOp& op = ops[i];
      if (op.kind == OpKind::kAlloc) {
        void* p = kTimed ? backend.alloc(op.size, op.stream) : counted_alloc(backend, op.size, op.stream);
        if (p == nullptr) {
          r.failed = true;
          r.failed_op = i;
          return;
        }
        slots[op.index] = p;
        ++done;
      } else if (op.kind == OpKind::kFree) {
        if (kTimed) {
          backend.free(slots[op.index], op.size, op.stream);
        } else {
          counted_free(backend, slots[op.index], op.size, op.stream);
        }
        ++done;
      } else if (op.kind == OpKind::kRecordStream) {
        if (!backend.record_stream(slots[op.index], op.stream)) {
          r.failed = true;
          r.failed_op = i;
          return;
        }
      } else {
        break;  // a capture event ends the batch
      }
    }
    if constexpr (kTimed) {
      const std::uint64_t ns = now_ns() - t0;
      if (done == 0) continue;
      if (capturing > 0) {
        r.ops_inside += done;
        r.ns_inside += ns;
      } else {
        r.ops_outside += done;
        r.ns_outside += ns;
      }
      r.batch_ns_per_op.push_back(static_cast<float>(ns) / static_cast<float>(done));
    }
  }
}

template <typename Backend>
[[gnu::noinline]] void timed_replay_pass(Backend& backend, const Trace& trace, void** slots,
                                         PassResult& r) {
  replay_ops<Backend, true>(backend, trace, slots, r);
}

// The pass `capalloc bench --callgrind` collects (--toggle-collect names it).
template <typename Backend>
[[gnu::noinline]] void counted_replay_pass(Backend& backend, const Trace& trace, void** slots,
                                           PassResult& r) {
  replay_ops<Backend, false>(backend, trace, slots, r);
}

// "FILE:LINE: <the event> failed: <why>", the line the event came from.
std::string failure_message(const Trace& trace, const PassResult& r, bool capalloc) {
  const TraceOp& op = trace.ops[r.failed_op];
  const std::string what = op.kind == OpKind::kAlloc
                               ? absl::StrCat("alloc of ", op.size, " bytes")
                               : std::string(op_name(op.kind));
  const std::string where = r.failed_op < trace.op_lines.size()
                                ? absl::StrCat(trace.name, ":", trace.op_lines[r.failed_op])
                                : trace.name;
  return absl::StrCat(where, ": ", what, " failed",
                      capalloc ? absl::StrCat(": ", capalloc_last_error()) : std::string());
}

template <typename Backend>
absl::Status one_pass(Backend& backend, const Trace& trace, std::vector<void*>& slots,
                      PassResult& r, bool measured, bool counted, bool capalloc,
                      std::vector<PoolMemory>* pools) {
  if (auto s = backend.begin_pass(trace); !s.ok()) return s;
  if (!measured || !counted) {
    const std::uint64_t cpu0 = thread_cpu_ns();
    timed_replay_pass(backend, trace, slots.data(), r);
    r.cpu_ns = thread_cpu_ns() - cpu0;
  } else {
    counted_replay_pass(backend, trace, slots.data(), r);
  }
  if (r.failed) return absl::InternalError(failure_message(trace, r, capalloc));
  if constexpr (Backend::kSupportsCaptures) {
    if (pools != nullptr) *pools = backend.pool_memory(trace);
  }
  for (const Trace::LiveBlock& block : trace.live_at_end) {
    backend.free(slots[block.slot], block.size, block.stream);
  }
  return backend.end_pass();
}

nlohmann::ordered_json cost_json(const EventCost& cost) {
  return {{"count", cost.count}, {"ns", cost.ns}};
}

template <typename Backend>
absl::StatusOr<nlohmann::ordered_json> replay_with(Backend& backend, const Trace& trace,
                                                   const ReplayOptions& options) {
  constexpr bool kCapalloc = Backend::kSupportsCaptures;
  if (trace.has_captures() && !kCapalloc) {
    return absl::InvalidArgumentError(absl::StrCat(
        trace.name, ": a trace with captures replays through capalloc only, not ", options.allocator));
  }
  if (auto s = backend.open(trace); !s.ok()) return s;
  std::vector<void*> slots(trace.slots, nullptr);
  for (int w = 0; w < options.warmups; ++w) {
    PassResult warmup;
    warmup.batch_ns_per_op.reserve(trace.operations() / kBatchOps + trace.ops.size() / 4 + 2);
    if (auto s = one_pass(backend, trace, slots, warmup, false, false, kCapalloc, nullptr); !s.ok()) {
      return s;
    }
  }
  PassResult r;
  // Room for every batch before the pass: a capture event ends at most one.
  std::size_t capture_events = 0;
  for (const TraceOp& op : trace.ops) capture_events += op.kind >= OpKind::kCaptureBegin;
  r.batch_ns_per_op.reserve(trace.operations() / kBatchOps + capture_events + 2);
  std::vector<PoolMemory> pools;
  if (auto s = one_pass(backend, trace, slots, r, true, options.counted, kCapalloc,
                        kCapalloc ? &pools : nullptr);
      !s.ok()) {
    return s;
  }

  nlohmann::ordered_json out;
  out["allocator"] = options.allocator;
  out["malloc_library"] = malloc_library();
  out["trace"] = trace.name;
  out["operations"] = trace.operations();
  out["warmups"] = options.warmups;
  out["counted"] = options.counted;
  if (!options.counted) {
    out["pass"] = {{"ops_outside", r.ops_outside}, {"ns_outside", r.ns_outside},
                   {"ops_inside", r.ops_inside},   {"ns_inside", r.ns_inside},
                   {"capture_begin", cost_json(r.capture_begin)},
                   {"capture_end", cost_json(r.capture_end)},
                   {"replay", cost_json(r.replay)},
                   {"graph_destroy", cost_json(r.graph_destroy)},
                   {"cpu_ns", r.cpu_ns},
                   {"batch_ns_per_op", r.batch_ns_per_op}};
  }
  if constexpr (kCapalloc) {
    capalloc_stats stats{};
    if (capalloc_get_stats(0, &stats) != CAPALLOC_OK) {
      return absl::InternalError(absl::StrCat("capalloc_get_stats: ", capalloc_last_error()));
    }
    if (stats.allocated_blocks != 0) {
      return absl::InternalError(absl::StrCat(
          trace.name, ": ", stats.allocated_blocks,
          " blocks are still allocated after every free (a capalloc_torch_free failed; "
          "its error was logged)"));
    }
    out["stats"] = {{"reserved_bytes_peak", stats.reserved_bytes_peak},
                    {"requested_bytes_peak", stats.requested_bytes_peak},
                    {"allocated_bytes_peak", stats.allocated_bytes_peak},
                    {"segments", stats.segments},
                    {"allocations", stats.allocations},
                    {"frees", stats.frees}};
    nlohmann::ordered_json pool_list = nlohmann::ordered_json::array();
    for (const PoolMemory& pool : pools) {
      pool_list.push_back({{"name", pool.name},
                           {"reserved_bytes_peak", pool.reserved_peak},
                           {"reserved_bytes_at_end", pool.reserved_at_end}});
    }
    out["pools"] = pool_list;
  }
  if constexpr (std::is_same_v<Backend, NaiveBackend> || std::is_same_v<Backend, CudaAsyncBackend>) {
    out["stats"] = {{"reserved_bytes_peak", backend.peak_reserved()}};
  }
  return out;
}

}  // namespace

absl::StatusOr<nlohmann::ordered_json> run_replay(const ReplayOptions& options) {
  auto trace = read_trace(options.trace_path);
  if (!trace.ok()) return trace.status();
  if (options.allocator == "capalloc" || options.allocator == "capalloc-cuda") {
    CapallocBackend backend(options.allocator == "capalloc" ? "host" : "cuda");
    return replay_with(backend, *trace, options);
  }
  if (options.allocator == "torch") {
    return absl::InvalidArgumentError(
        "PyTorch's caching allocator is replayed by tools/trace/torch_replay.py, not bench-replay");
  }
  if (options.allocator == "cudaMallocAsync") {
    CudaAsyncBackend backend;
    return replay_with(backend, *trace, options);
  }
  if (options.allocator == "naive") {
    NaiveBackend backend;
    return replay_with(backend, *trace, options);
  }
  MallocBackend backend;
  return replay_with(backend, *trace, options);
}

}  // namespace capalloc::trace
