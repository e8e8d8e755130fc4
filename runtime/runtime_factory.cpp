// runtime_factory.cpp: choosing a DeviceRuntime by name.
//
// "host" is always built. "cuda" and "hip" exist when the library was built
// with them (CAPALLOC_HAVE_CUDA_RUNTIME / CAPALLOC_HAVE_HIP_RUNTIME) and a
// device is present; a name that is not built in is kUnavailable, and so is
// a built runtime that finds no device ("no CUDA device"). "auto" prefers
// cuda, then hip, each only when it finds a device, and otherwise falls back
// to host with exactly one info line saying which GPU runtimes were built and
// that no device was found.
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "runtime/gpu_runtimes.hpp"
#include "runtime/host_runtime.hpp"
#include "common/log.hpp"
#include "capalloc/runtime.hpp"

namespace capalloc {
namespace {

// The GPU runtimes built into this library, in the order "auto" tries them.
std::vector<std::string> built_gpu_runtimes() {
  std::vector<std::string> names;
#if defined(CAPALLOC_HAVE_CUDA_RUNTIME)
  names.push_back("cuda");
#endif
#if defined(CAPALLOC_HAVE_HIP_RUNTIME)
  names.push_back("hip");
#endif
  return names;
}

absl::StatusOr<std::shared_ptr<DeviceRuntime>> make_gpu_runtime(std::string_view kind) {
#if defined(CAPALLOC_HAVE_CUDA_RUNTIME)
  if (kind == "cuda") return detail::make_cuda_runtime();
#endif
#if defined(CAPALLOC_HAVE_HIP_RUNTIME)
  if (kind == "hip") return detail::make_hip_runtime();
#endif
  std::vector<std::string> built = {"host"};
  for (std::string& name : built_gpu_runtimes()) built.push_back(std::move(name));
  return absl::UnavailableError(
      absl::StrFormat("runtime '%s' is not built into this library (built runtimes: %s)", kind,
                      absl::StrJoin(built, ", ")));
}

}  // namespace

absl::StatusOr<std::shared_ptr<DeviceRuntime>> make_host_runtime(
    const HostRuntimeOptions& options) {
  auto runtime = detail::HostRuntime::create(options);
  if (!runtime.ok()) return runtime.status();
  return std::shared_ptr<DeviceRuntime>(*std::move(runtime));
}

absl::StatusOr<std::shared_ptr<DeviceRuntime>> make_runtime(std::string_view kind) {
  if (kind == "host") return make_host_runtime();
  if (kind == "cuda" || kind == "hip") return make_gpu_runtime(kind);
  if (kind == "auto") {
    const std::vector<std::string> built = built_gpu_runtimes();
    for (const std::string& name : built) {
      auto runtime = make_gpu_runtime(name);
      if (runtime.ok()) return runtime;
    }
    if (built.empty()) {
      detail::log().info(
          "runtime 'auto': no GPU runtime (cuda, hip) is built into this library; using the "
          "host runtime");
    } else {
      detail::log().info(
          "runtime 'auto': GPU runtime(s) {} built in, but no device was found; using the host "
          "runtime",
          absl::StrJoin(built, " and "));
    }
    return make_host_runtime();
  }
  return absl::InvalidArgumentError(
      absl::StrFormat("unknown runtime '%s'; valid names are auto, host, cuda and hip", kind));
}

}  // namespace capalloc
