// capalloc/persistent_cache.hpp: persistent device buffers by (device, key),
// warmed before any capture.
//
// Seed 003's lesson as an API. A kernel library that needs a workspace or a
// semaphore across launches must not allocate it lazily on a cache keyed by
// stream: a capture always runs on a fresh stream, so the first capturing call
// allocates inside the capture, where the block can take an address that a
// graph replay writes. Here buffers are keyed by device and key (never by
// stream), created by preallocate() during warmup, and get() never allocates.
// A preallocate() that lands inside a capture is refused by the allocator with
// an error naming the key and the fix.
//
//   capalloc::PersistentCache cache(*allocator);
//   cache.preallocate(0, "splitk.workspace", 16 << 20).value();  // warmup
//   ...
//   void* ws = cache.get(0, "splitk.workspace").value();  // inside a capture: fine
//
// Thread safety: all methods may be called concurrently. The cache frees its
// blocks when destroyed and must be destroyed before its allocator.
#ifndef CAPALLOC_PERSISTENT_CACHE_HPP_
#define CAPALLOC_PERSISTENT_CACHE_HPP_

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "capalloc/allocator.hpp"
#include "capalloc/export.h"

namespace capalloc {

class CAPALLOC_API PersistentCache {
 public:
  struct Entry {
    int device = 0;
    std::string key;
    void* ptr = nullptr;
    std::size_t bytes = 0;
  };

  explicit PersistentCache(Allocator& allocator);
  ~PersistentCache();
  PersistentCache(const PersistentCache&) = delete;
  PersistentCache& operator=(const PersistentCache&) = delete;

  // Returns the buffer for (device, key), creating it with `bytes` if it does
  // not exist. Errors: kFailedPrecondition while a capture is active (from the
  // allocator) or when the key exists with fewer bytes (growing it would move
  // a buffer graphs may already point at); kInvalidArgument for an empty key
  // or zero bytes; the allocator's errors otherwise.
  absl::StatusOr<void*> preallocate(int device, std::string_view key, std::size_t bytes);
  // The buffer for (device, key). Never allocates: kNotFound, naming
  // preallocate, when the key was not warmed.
  absl::StatusOr<void*> get(int device, std::string_view key) const;
  // Frees the buffer. The caller guarantees no graph that uses it replays again.
  // This is the only way to free it: the allocator refuses a plain
  // deallocate() of a cache's buffer (kFailedPrecondition naming this call).
  // kNotFound, changing nothing, for a key that holds no buffer.
  absl::Status release(int device, std::string_view key);
  std::vector<Entry> entries() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace capalloc

#endif  // CAPALLOC_PERSISTENT_CACHE_HPP_
