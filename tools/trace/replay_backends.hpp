// tools/trace/replay_backends.hpp: the allocators a trace is replayed
// through, each behind the same small interface (alloc, free, record_stream,
// the capture events, and a cleanup between passes), so that one loop
// template (replay.cpp) drives them all and inlines their calls.
//
//   CapallocBackend  the process-wide capalloc through the C ABI entry points
//                    PyTorch uses (capalloc_torch_malloc/_free), captures
//                    through the C ABI capture calls; CAPALLOC_RUNTIME=host,
//                    or cuda for the GPU column
//   CudaAsyncBackend cudaMallocAsync/cudaFreeAsync (cuda_async_backend.hpp)
//   NaiveBackend     one host-runtime reserve and release per request
//                    (MemoryRuntime::reserve/release), the cost of having no
//                    allocator at all
//   MallocBackend    malloc and free: glibc's, or whichever library the
//                    parent preloaded into this process (jemalloc, mimalloc,
//                    tcmalloc)
//
// Memory is never touched: what is measured is bookkeeping. Setup (streams,
// pools) happens before a pass and is not timed.
#ifndef CAPALLOC_TOOLS_TRACE_REPLAY_BACKENDS_HPP_
#define CAPALLOC_TOOLS_TRACE_REPLAY_BACKENDS_HPP_

#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "capalloc/capalloc.h"
#include "capalloc/runtime.hpp"
#include "tools/trace/trace_reader.hpp"

namespace capalloc::trace {

// Graph-pool memory of one pool name, after a pass (capalloc only).
struct PoolMemory {
  std::string name;
  std::int64_t reserved_peak = 0;
  std::int64_t reserved_at_end = 0;
};

class CapallocBackend {
 public:
  static constexpr bool kSupportsCaptures = true;

  // `runtime`: the capalloc runtime the process must be running ("host";
  // "cuda" for the GPU column), so that a result is never reported for
  // another.
  explicit CapallocBackend(std::string runtime) : runtime_(std::move(runtime)) {}

  // Creates the trace's streams and graph pools (the process-wide capalloc
  // starts here); the pools live until the process ends.
  absl::Status open(const Trace& trace);
  absl::Status begin_pass(const Trace&) { return absl::OkStatus(); }
  void* alloc(std::uint64_t size, std::uint32_t stream) {
    return capalloc_torch_malloc(size, 0, streams_[stream]);
  }
  void free(void* p, std::uint64_t size, std::uint32_t stream) {
    capalloc_torch_free(p, size, 0, streams_[stream]);
  }
  bool record_stream(void* p, std::uint32_t stream) {
    return capalloc_record_stream(p, streams_[stream]) == CAPALLOC_OK;
  }
  bool capture_begin(std::uint32_t capture, std::uint32_t stream, std::uint32_t pool) {
    capture_streams_[capture] = streams_[stream];
    return capalloc_capture_begin(0, streams_[stream], pool == kNoPool ? 0 : pools_[pool],
                                  nullptr) == CAPALLOC_OK;
  }
  bool capture_end(std::uint32_t capture) {
    return capalloc_capture_end(capture_streams_[capture], &graphs_[capture], nullptr) ==
           CAPALLOC_OK;
  }
  bool replay(std::uint32_t capture) {
    return capalloc_graph_replay(graphs_[capture], capture_streams_[capture]) == CAPALLOC_OK;
  }
  bool graph_destroy(std::uint32_t capture) {
    const bool ok = capalloc_graph_destroy(graphs_[capture]) == CAPALLOC_OK;
    graphs_[capture] = 0;
    return ok;
  }
  // The graph pools' memory now.
  std::vector<PoolMemory> pool_memory(const Trace& trace) const;
  // After a pass whose live blocks were freed: destroys the graphs the trace
  // left, waits for the streams.
  absl::Status end_pass();

 private:
  std::string runtime_;
  std::vector<void*> streams_;
  std::vector<std::uint64_t> pools_;
  std::vector<void*> capture_streams_;
  std::vector<std::uint64_t> graphs_;
};

// What a backend without streams or graphs does with the trace's stream
// and capture events: a record_stream is a no-op, a capture event is
// refused (the replay skips traces with captures for such a backend).
struct NoCaptureBackend {
  static constexpr bool kSupportsCaptures = false;

  absl::Status begin_pass(const Trace&) { return absl::OkStatus(); }
  bool record_stream(void*, std::uint32_t) { return true; }
  bool capture_begin(std::uint32_t, std::uint32_t, std::uint32_t) { return false; }
  bool capture_end(std::uint32_t) { return false; }
  bool replay(std::uint32_t) { return false; }
  bool graph_destroy(std::uint32_t) { return false; }
  absl::Status end_pass() { return absl::OkStatus(); }
};

class NaiveBackend : public NoCaptureBackend {
 public:
  absl::Status open(const Trace& trace);
  void* alloc(std::uint64_t size, std::uint32_t) {
    auto p = runtime_->reserve(0, size);
    if (!p.ok()) return nullptr;
    reserved_ += round_to_pages(size);
    if (reserved_ > peak_reserved_) peak_reserved_ = reserved_;
    return *p;
  }
  void free(void* p, std::uint64_t size, std::uint32_t) {
    if (runtime_->release(0, p, size).ok()) reserved_ -= round_to_pages(size);
  }
  // What the host runtime held at most: each live request rounded up to its
  // page size, as it maps them.
  std::uint64_t peak_reserved() const { return peak_reserved_; }

 private:
  std::uint64_t round_to_pages(std::uint64_t size) const {
    return (size + page_bytes_ - 1) / page_bytes_ * page_bytes_;
  }
  std::shared_ptr<DeviceRuntime> runtime_;
  std::uint64_t page_bytes_ = 4096;
  std::uint64_t reserved_ = 0;
  std::uint64_t peak_reserved_ = 0;
};

class MallocBackend : public NoCaptureBackend {
 public:
  absl::Status open(const Trace&) { return absl::OkStatus(); }
  void* alloc(std::uint64_t size, std::uint32_t) { return std::malloc(size); }
  void free(void* p, std::uint64_t, std::uint32_t) { std::free(p); }
};

// The shared object that `malloc` resolves to in this process (the libc, or
// the preloaded allocator), so that a replay can prove which one it measured.
std::string malloc_library();

}  // namespace capalloc::trace

#endif  // CAPALLOC_TOOLS_TRACE_REPLAY_BACKENDS_HPP_
