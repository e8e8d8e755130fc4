// capalloc/cuda_mr.hpp (optional): a capalloc::Allocator as a CCCL memory
// resource, so that code written against `cuda::mr` (RMM, Thrust, CUB,
// cuda::mr::resource_ref) allocates through capalloc.
//
// CudaMemoryResource satisfies, in the CCCL of the CUDA toolkit it is
// compiled with (CCCL 3.0 in CUDA 13.0):
//
//   cuda::mr::resource / async_resource         allocate(bytes, alignment),
//                                               deallocate(ptr, bytes, alignment),
//                                               allocate_async(bytes, alignment, stream_ref),
//                                               deallocate_async(ptr, bytes, alignment, stream_ref),
//                                               == and !=
//   cuda::mr::resource_with<..., device_accessible>  (get_property)
//
// In CCCL 3.0 `cuda::mr` is experimental: <cuda/memory_resource> defines
// nothing unless LIBCUDACXX_ENABLE_EXPERIMENTAL_MEMORY_RESOURCE is defined
// before its first inclusion. This header defines it when it is not; define
// it yourself (on the command line) if a CCCL header may come first.
//
// Semantics:
//   - allocate_async(bytes, alignment, stream) is Allocator::allocate on
//     `stream` (a graph pool's block when the stream is capturing), on the
//     resource's device. allocate() is the same on the default stream.
//   - deallocate_async(p, ..., stream) frees p stream-ordered: when `stream`
//     is not the stream p was allocated on, Allocator::record_stream(p,
//     stream) first, so the block is reused only after the work enqueued on
//     `stream` so far has run; the caller is never blocked.
//   - Alignment: capalloc aligns every block to its round granularity
//     (AllocatorOptions::round_granularity, at least 256). Any power of two up
//     to it is honoured; a larger one throws capalloc::CudaMrBadAlloc, one that
//     is not a power of two throws std::invalid_argument.
//   - 0 bytes allocates the smallest block (a distinct, valid pointer).
//   - Errors throw (the cuda::mr convention): CudaMrBadAlloc (a std::bad_alloc
//     that carries capalloc's message) when allocate fails, std::invalid_argument
//     when deallocate is given a pointer capalloc does not hold (no state
//     changes then).
//   - Two resources are equal when they wrap the same Allocator and device:
//     memory from one may be freed through the other.
//   - device_accessible: the memory is device memory when the Allocator runs
//     over a GPU runtime (make_runtime("cuda")). Over the host runtime (for
//     tests) it is host memory that capalloc models as device memory.
//
// The resource holds a reference: the Allocator must outlive it.
#ifndef CAPALLOC_CUDA_MR_HPP_
#define CAPALLOC_CUDA_MR_HPP_

#ifndef LIBCUDACXX_ENABLE_EXPERIMENTAL_MEMORY_RESOURCE
#define LIBCUDACXX_ENABLE_EXPERIMENTAL_MEMORY_RESOURCE
#endif

#include <cuda/memory_resource>
#include <cuda/stream_ref>

#include <cstddef>
#include <new>
#include <stdexcept>
#include <string>
#include <utility>

#include "capalloc/allocator.hpp"

namespace capalloc {

// std::bad_alloc with capalloc's reason (what()).
class CudaMrBadAlloc : public std::bad_alloc {
 public:
  explicit CudaMrBadAlloc(std::string message) : message_(std::move(message)) {}
  const char* what() const noexcept override { return message_.c_str(); }

 private:
  std::string message_;
};

class CudaMemoryResource {
 public:
  explicit CudaMemoryResource(Allocator& allocator, int device = 0) noexcept
      : allocator_(&allocator), device_(device) {}

  void* allocate(std::size_t bytes, std::size_t alignment) {
    return allocate_on(bytes, alignment, kDefaultStream);
  }

  void deallocate(void* ptr, std::size_t bytes, std::size_t alignment) {
    (void)bytes;
    (void)alignment;
    free_checked(allocator_->deallocate(ptr, device_));
  }

  void* allocate_async(std::size_t bytes, std::size_t alignment, ::cuda::stream_ref stream) {
    return allocate_on(bytes, alignment, to_handle(stream));
  }

  void deallocate_async(void* ptr, std::size_t bytes, std::size_t alignment,
                        ::cuda::stream_ref stream) {
    (void)bytes;
    (void)alignment;
    auto block = allocator_->block_info(ptr);
    if (!block.ok()) free_checked(block.status());
    if (block->stream != to_handle(stream)) {
      free_checked(allocator_->record_stream(ptr, to_handle(stream)));
    }
    free_checked(allocator_->deallocate(ptr, device_));
  }

  Allocator& allocator() const noexcept { return *allocator_; }
  int device() const noexcept { return device_; }

  friend bool operator==(const CudaMemoryResource& a, const CudaMemoryResource& b) noexcept {
    return a.allocator_ == b.allocator_ && a.device_ == b.device_;
  }
  friend bool operator!=(const CudaMemoryResource& a, const CudaMemoryResource& b) noexcept {
    return !(a == b);
  }
  // The cuda::mr property: memory this resource hands out is device memory.
  friend constexpr void get_property(const CudaMemoryResource&,
                                     ::cuda::mr::device_accessible) noexcept {}

 private:
  static StreamHandle to_handle(::cuda::stream_ref stream) noexcept {
    return reinterpret_cast<StreamHandle>(stream.get());
  }

  void* allocate_on(std::size_t bytes, std::size_t alignment, StreamHandle stream) {
    if (alignment == 0 || (alignment & (alignment - 1)) != 0) {
      throw std::invalid_argument("capalloc::CudaMemoryResource: alignment " +
                                  std::to_string(alignment) + " is not a power of two");
    }
    const std::size_t honoured = allocator_->options().round_granularity;
    if (alignment > honoured) {
      throw CudaMrBadAlloc("capalloc::CudaMemoryResource: alignment " + std::to_string(alignment) +
                           " exceeds the " + std::to_string(honoured) +
                           " bytes capalloc aligns blocks to (AllocatorOptions::round_granularity)");
    }
    auto p = allocator_->allocate(bytes == 0 ? 1 : bytes, device_, stream);
    if (!p.ok()) throw CudaMrBadAlloc("capalloc::CudaMemoryResource: " + p.status().ToString());
    return *p;
  }

  static void free_checked(const absl::Status& s) {
    if (!s.ok()) throw std::invalid_argument("capalloc::CudaMemoryResource: " + s.ToString());
  }

  Allocator* allocator_;
  int device_;
};

}  // namespace capalloc

#endif  // CAPALLOC_CUDA_MR_HPP_
