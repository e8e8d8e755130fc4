// runtime_factory.cpp: choosing a DeviceRuntime by name.
//
// This library is built with the host runtime only: "host" and "auto" give
// it ("auto" says in one log line that it fell back), "cuda" and "hip" are
// kUnavailable. When a GPU runtime is built in, it is added here and "auto"
// prefers it when a device is present.
#include <memory>
#include <string_view>

#include "absl/strings/str_format.h"
#include "allocator/runtime/host_runtime.hpp"
#include "capalloc/runtime.hpp"
#include "allocator/runtime/log.hpp"

namespace capalloc {

absl::StatusOr<std::shared_ptr<DeviceRuntime>> make_host_runtime(
    const HostRuntimeOptions& options) {
  auto runtime = detail::HostRuntime::create(options);
  if (!runtime.ok()) return runtime.status();
  return std::shared_ptr<DeviceRuntime>(*std::move(runtime));
}

absl::StatusOr<std::shared_ptr<DeviceRuntime>> make_runtime(std::string_view kind) {
  if (kind == "host") return make_host_runtime();
  if (kind == "auto") {
    detail::log().info(
        "runtime 'auto': no GPU runtime (cuda, hip) is built into this library; using the host "
        "runtime");
    return make_host_runtime();
  }
  if (kind == "cuda" || kind == "hip") {
    return absl::UnavailableError(absl::StrFormat(
        "runtime '%s' is not built into this library (built runtimes: host)", kind));
  }
  return absl::InvalidArgumentError(absl::StrFormat(
      "unknown runtime '%s'; valid names are auto, host, cuda and hip", kind));
}

}  // namespace capalloc
