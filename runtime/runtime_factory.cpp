// runtime_factory.cpp: choosing a DeviceRuntime by name.
//
// "host" is part of this library. "cuda" and "hip" come from their backend
// plugins (plugins.hpp), loaded on first use; a backend that is missing, does
// not load, or finds no device is kUnavailable with the reason. "auto"
// prefers cuda, then hip, and otherwise falls back to host with exactly one
// info line that gives each GPU runtime's reason.
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/log.hpp"
#include "runtime/host_runtime.hpp"
#include "runtime/plugins.hpp"
#include "runtime/runtime_factory.hpp"
#include "capalloc/runtime.hpp"

namespace capalloc {
namespace detail {

absl::StatusOr<std::shared_ptr<DeviceRuntime>> make_gpu_runtime(RuntimeKind kind) {
  auto backend = load_backend(kind);
  if (!backend.ok()) {
    return absl::UnavailableError(absl::StrFormat("runtime '%s': %s",
                                                  std::string(runtime_kind_name(kind)),
                                                  backend.status().message()));
  }
  auto runtime = (*backend)->make_runtime();
  if (!runtime.ok()) {
    return absl::Status(runtime.status().code(),
                        absl::StrFormat("runtime '%s': %s", std::string(runtime_kind_name(kind)),
                                        runtime.status().message()));
  }
  return runtime;
}

absl::StatusOr<ChosenRuntime> choose_runtime(std::string_view name) {
  auto chosen = [](absl::StatusOr<std::shared_ptr<DeviceRuntime>> runtime,
                   std::string fallback_reason = {}) -> absl::StatusOr<ChosenRuntime> {
    if (!runtime.ok()) return runtime.status();
    return ChosenRuntime{*std::move(runtime), std::move(fallback_reason)};
  };
  if (name == "host") return chosen(make_host_runtime());
  if (name == "cuda") return chosen(make_gpu_runtime(RuntimeKind::kCuda));
  if (name == "hip") return chosen(make_gpu_runtime(RuntimeKind::kHip));
  if (name != "auto") {
    return absl::InvalidArgumentError(absl::StrFormat(
        "unknown runtime '%s'; valid names are auto, host, cuda and hip", std::string(name)));
  }
  std::vector<std::string> reasons;
  for (RuntimeKind kind : {RuntimeKind::kCuda, RuntimeKind::kHip}) {
    auto runtime = make_gpu_runtime(kind);
    if (runtime.ok()) return chosen(std::move(runtime));
    reasons.emplace_back(runtime.status().message());
  }
  std::string why = absl::StrJoin(reasons, "; ");
  log().info("runtime 'auto': using the host runtime ({})", why);
  return chosen(make_host_runtime(), std::move(why));
}

}  // namespace detail

absl::StatusOr<std::shared_ptr<DeviceRuntime>> make_host_runtime(
    const HostRuntimeOptions& options) {
  auto runtime = detail::HostRuntime::create(options);
  if (!runtime.ok()) return runtime.status();
  return std::shared_ptr<DeviceRuntime>(*std::move(runtime));
}

absl::StatusOr<std::shared_ptr<DeviceRuntime>> make_runtime(std::string_view kind) {
  auto chosen = detail::choose_runtime(kind);
  if (!chosen.ok()) return chosen.status();
  return std::move(chosen->runtime);
}

}  // namespace capalloc
