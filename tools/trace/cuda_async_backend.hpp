// tools/trace/cuda_async_backend.hpp: the CUDA runtime's own stream-ordered
// allocator (cudaMallocAsync/cudaFreeAsync on the device's default memory
// pool) as a replay backend of `capalloc bench`, for the GPU columns next to
// capalloc's cuda runtime and PyTorch's caching allocator.
//
// libcudart is loaded at run time (dlopen), so the tool builds and runs
// without CUDA: on a machine without a device, available() says why and the
// column is skipped. The pool's release threshold is set to its maximum, so
// that freed memory stays cached as in the other allocators (the default, 0,
// gives it back at every synchronization); peak reserved is the pool's
// cudaMemPoolAttrReservedMemHigh. Frees are ordered on the trace's stream of
// each block; a trace's record_stream events are no-ops here (the pool
// follows event dependencies itself), and traces with captures are skipped.
#ifndef CAPALLOC_TOOLS_TRACE_CUDA_ASYNC_BACKEND_HPP_
#define CAPALLOC_TOOLS_TRACE_CUDA_ASYNC_BACKEND_HPP_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "tools/trace/replay_backends.hpp"
#include "tools/trace/trace_reader.hpp"

namespace capalloc::trace {

class CudaAsyncBackend : public NoCaptureBackend {
 public:
  // "" when libcudart loads and reports a device; else why not.
  static std::string available();

  absl::Status open(const Trace& trace);
  void* alloc(std::uint64_t size, std::uint32_t stream) {
    void* p = nullptr;
    return api_.malloc_async(&p, size, streams_[stream]) == 0 ? p : nullptr;
  }
  void free(void* p, std::uint64_t, std::uint32_t stream) {
    api_.free_async(p, streams_[stream]);
  }
  absl::Status end_pass();
  // The default pool's reserved bytes at most (0 when it cannot be read).
  std::uint64_t peak_reserved() const;
  ~CudaAsyncBackend();

  // The entry points used, as loaded from libcudart (error codes as int:
  // 0 is cudaSuccess).
  struct Api {
    int (*get_device_count)(int*) = nullptr;
    int (*stream_create)(void**) = nullptr;
    int (*stream_destroy)(void*) = nullptr;
    int (*stream_synchronize)(void*) = nullptr;
    int (*malloc_async)(void**, std::size_t, void*) = nullptr;
    int (*free_async)(void*, void*) = nullptr;
    int (*device_get_default_mem_pool)(void**, int) = nullptr;
    int (*mem_pool_set_attribute)(void*, int, void*) = nullptr;
    int (*mem_pool_get_attribute)(void*, int, void*) = nullptr;
  };

 private:
  Api api_;
  void* pool_ = nullptr;
  std::vector<void*> streams_;
};

}  // namespace capalloc::trace

#endif  // CAPALLOC_TOOLS_TRACE_CUDA_ASYNC_BACKEND_HPP_
