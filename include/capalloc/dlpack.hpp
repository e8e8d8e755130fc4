// capalloc/dlpack.hpp: DLPack tensors imported for use on a stream and
// released in stream order.
//
// A consumer that takes a DLManagedTensor (a capsule from __dlpack__) owns
// it until it calls the tensor's deleter. Field report 001 is a consumer
// that called the deleter while preparing a launch, before the kernel
// reading the memory had run: a producer whose deleter returns the memory
// to a pool then lets the next allocation overwrite what the kernel reads.
// DlpackImports keeps the tensor until release(), and its deleter then runs
// on the ReleaseQueue, after the work enqueued on the import's stream up to
// the release has completed (and, when a live graph reads or writes the
// memory, after that graph is gone: capalloc/release.hpp).
//
// Example:
//
//   capalloc::DlpackImports imports(*queue);
//   auto t = imports.import(managed, stream).value();    // t.data, t.bytes
//   rt->launch_kernel(stream, kernel_reading(t.data, t.bytes));
//   imports.release(managed).IgnoreError();               // never waits
//
// Devices: kDLCUDA on the cuda runtime, kDLROCM on the hip runtime, kDLCPU
// on the host runtime (whose device memory is host memory); device_id is
// capalloc's device number.
//
// Teardown: tensors never released are released (in stream order, as if
// release() had been called, with one warning giving their number) when
// the queue is drained or destroyed (ReleaseQueue::drain(),
// capalloc_release_drain, the C library's exit handler, the Python
// package's atexit hook) and when this object is destroyed.
//
// Thread safety: every method may be called from any thread. The object
// must be destroyed before its queue.
#ifndef CAPALLOC_DLPACK_HPP_
#define CAPALLOC_DLPACK_HPP_

#include <cstddef>
#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "capalloc/export.h"
#include "capalloc/release.hpp"
#include "capalloc/runtime.hpp"

// <dlpack/dlpack.h> (Debian: libdlpack-dev); declared here so that this
// header does not require it.
struct DLManagedTensor;

namespace capalloc {

struct ImportedTensor {
  void* data = nullptr;   // dl_tensor.data + byte_offset: the first element
  std::size_t bytes = 0;  // from the lowest to one past the highest byte addressed
  int device = 0;
  StreamHandle stream = kDefaultStream;
  // This import's number (never 0, never reused): release(tensor, token)
  // releases this import only, not a later import of the same address (a
  // producer may reuse its DLManagedTensor once the deleter has run).
  std::uint64_t token = 0;
};

class CAPALLOC_API DlpackImports {
 public:
  explicit DlpackImports(ReleaseQueue& queue);
  // Releases every tensor still imported, in stream order.
  ~DlpackImports();
  DlpackImports(const DlpackImports&) = delete;
  DlpackImports& operator=(const DlpackImports&) = delete;

  // Takes ownership of `tensor` for use on `stream`. Errors, changing
  // nothing (the caller still owns the tensor): kInvalidArgument for a null
  // tensor, a device type the runtime cannot serve (naming both), a device
  // id the runtime does not have, a null data pointer with elements, a
  // negative dimension or a size that overflows; kAlreadyExists for a tensor
  // already imported and not yet released.
  absl::StatusOr<ImportedTensor> import(DLManagedTensor* tensor, StreamHandle stream);

  // Gives the tensor back: its deleter (if any) runs once the work enqueued
  // on the import's stream up to now has completed. Never waits. Errors,
  // changing nothing: kInvalidArgument for null; kNotFound for a tensor not
  // imported here, or released already (its deleter may have run, so the
  // pointer must not be used again); the queue's errors.
  //
  // A tensor whose import stream has since been destroyed is released too:
  // destroy_stream waited for its work, so the deleter runs in request order
  // without waiting on the stream.
  absl::Status release(DLManagedTensor* tensor);
  // As release(tensor), for the import `token` names only (0: whichever
  // import): kNotFound when the tensor's current import is another one
  // (this one was released already, and the producer reused the struct).
  absl::Status release(DLManagedTensor* tensor, std::uint64_t token);

  // Tensors imported and not yet released.
  std::size_t imported() const;
  // Tensors the application never released that teardown released (the
  // queue's drain or destruction, or this object's).
  std::size_t released_at_teardown() const;

 private:
  // Releases every tensor still imported (teardown); how many.
  std::size_t release_all_at_teardown();

  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace capalloc

#endif  // CAPALLOC_DLPACK_HPP_
