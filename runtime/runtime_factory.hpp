// runtime/runtime_factory.hpp: make_runtime's choice, with what it passed
// over, for callers that must not run on the host runtime by accident (the
// PyTorch entry points: host memory handed to PyTorch as device memory would
// crash far from here).
#ifndef CAPALLOC_RUNTIME_RUNTIME_FACTORY_HPP_
#define CAPALLOC_RUNTIME_RUNTIME_FACTORY_HPP_

#include <memory>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "capalloc/runtime.hpp"

namespace capalloc::detail {

struct ChosenRuntime {
  std::shared_ptr<DeviceRuntime> runtime;
  // Set when "auto" fell back to host: why each GPU runtime was passed over.
  std::string host_fallback_reason;
};

// make_runtime(name), keeping the reason of a fallback to host.
absl::StatusOr<ChosenRuntime> choose_runtime(std::string_view name);

// The cuda or hip runtime from its backend plugin; kUnavailable with the
// reason when it cannot be had.
absl::StatusOr<std::shared_ptr<DeviceRuntime>> make_gpu_runtime(RuntimeKind kind);

}  // namespace capalloc::detail

#endif  // CAPALLOC_RUNTIME_RUNTIME_FACTORY_HPP_
