// c_api/global.hpp: the process-wide capalloc behind the C ABI and the
// PyTorch entry points: one allocator, its capture tracker and its
// persistent cache.
//
// Created on first use over the runtime named by CAPALLOC_RUNTIME (default
// "auto") with AllocatorOptions::from_env() and TrackerOptions::from_env().
// Every CAPALLOC_* variable it depends on (CAPALLOC_LOG_LEVEL too) is read
// through common/config.hpp: an invalid one fails creation with a message
// naming it. If creation fails, every later call gets the same error; the
// process does not retry with other settings. Never destroyed: blocks may be freed from
// static destructors of the host application after ours would have run.
#ifndef CAPALLOC_C_API_GLOBAL_HPP_
#define CAPALLOC_C_API_GLOBAL_HPP_

#include "absl/status/statusor.h"
#include <string>

#include "capalloc/allocator.hpp"
#include "capalloc/capture.hpp"
#include "capalloc/persistent_cache.hpp"

namespace capalloc::detail {

struct GlobalCapalloc {
  Allocator* allocator = nullptr;
  CaptureTracker* tracker = nullptr;
  PersistentCache* cache = nullptr;
  // Set when CAPALLOC_RUNTIME was "auto" (or unset) and no GPU backend could
  // be had: why. The PyTorch entry points refuse to run then (host memory
  // handed to PyTorch as device memory would crash far from here).
  std::string host_fallback_reason;
};

// The process-wide capalloc, made on the first call (thread-safe); every
// call returns the same object, by reference: this is on the path of every
// C ABI call, so it costs one guard check, no copy.
const absl::StatusOr<GlobalCapalloc>& global_capalloc();

}  // namespace capalloc::detail

#endif  // CAPALLOC_C_API_GLOBAL_HPP_
