// allocator/global.hpp: the process-wide allocator behind the C ABI.
//
// Created on first use over the runtime named by CAPALLOC_RUNTIME (default
// "auto") with AllocatorOptions::from_env(). If creation fails, every later
// call gets the same error; the process does not retry with other settings.
#ifndef CAPALLOC_ALLOCATOR_GLOBAL_HPP_
#define CAPALLOC_ALLOCATOR_GLOBAL_HPP_

#include "absl/status/statusor.h"
#include "capalloc/allocator.hpp"

namespace capalloc::detail {

absl::StatusOr<Allocator*> global_allocator();

}  // namespace capalloc::detail

#endif  // CAPALLOC_ALLOCATOR_GLOBAL_HPP_
