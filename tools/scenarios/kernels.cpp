// tools/scenarios/kernels.cpp: see kernels.hpp. Each kernel carries a host
// body (the host runtime) and a device body that launches the same kernel
// from scenario_kernels.cu, found in the runtime's scenario plugin, on the
// runtime's native stream.
#include "tools/scenarios/kernels.hpp"

#include <algorithm>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "runtime/plugins.hpp"

namespace capalloc::scenarios {

namespace {

// The scenario kernels' plugin for a runtime: libcapalloc_scenarios_cuda.so
// or ..._hip.so, built from scenario_kernels.cu beside the backends and found
// the same way (runtime/plugins.hpp). Each launcher returns the native error
// code (0: ok).
template <typename Launcher, typename... Args>
absl::Status on_device(const char* kernel, RuntimeKind runtime, void* stream, Args... args) {
  if (runtime == RuntimeKind::kHost) {
    return absl::InvalidArgumentError("scenario kernels: the host runtime runs host bodies");
  }
  const std::string plugin =
      absl::StrCat("capalloc_scenarios_", std::string(runtime_kind_name(runtime)));
  const std::string symbol = absl::StrCat("capalloc_scenario_", kernel);
  auto address = detail::plugin_symbol(plugin, symbol.c_str());
  if (!address.ok()) {
    return absl::UnavailableError(absl::StrFormat("scenario kernel %s: %s", kernel,
                                                  address.status().message()));
  }
  const int rc = reinterpret_cast<Launcher>(*address)(args..., stream);
  if (rc == 0) return absl::OkStatus();
  return absl::InternalError(absl::StrFormat("scenario kernel %s on %s: launch failed (error %d)",
                                             kernel, std::string(runtime_kind_name(runtime)), rc));
}

using FillLauncher = int (*)(float*, std::size_t, float, void*);
using ScaleLauncher = int (*)(float*, const float*, std::size_t, float, void*);
using SumLauncher = int (*)(float*, const float*, std::size_t, void*);

}  // namespace

KernelLaunch fill_kernel(float* dst, std::size_t n, float value) {
  KernelLaunch k;
  k.name = "fill";
  k.writes = {{dst, n * sizeof(float)}};
  k.host_body = [dst, n, value] { std::fill(dst, dst + n, value); };
  k.device_body = [dst, n, value](RuntimeKind runtime, void* stream) {
    return on_device<FillLauncher>("fill", runtime, stream, dst, n, value);
  };
  return k;
}

KernelLaunch scale_kernel(float* dst, const float* src, std::size_t n, float factor) {
  KernelLaunch k;
  k.name = "scale";
  k.reads = {{src, n * sizeof(float)}};
  k.writes = {{dst, n * sizeof(float)}};
  k.host_body = [dst, src, n, factor] {
    for (std::size_t i = 0; i < n; ++i) dst[i] = src[i] * factor;
  };
  k.device_body = [dst, src, n, factor](RuntimeKind runtime, void* stream) {
    return on_device<ScaleLauncher>("scale", runtime, stream, dst, src, n, factor);
  };
  return k;
}

KernelLaunch sum_kernel(float* dst, const float* src, std::size_t n) {
  KernelLaunch k;
  k.name = "sum";
  k.reads = {{src, n * sizeof(float)}};
  k.writes = {{dst, sizeof(float)}};
  k.host_body = [dst, src, n] {
    double total = 0;
    for (std::size_t i = 0; i < n; ++i) total += src[i];
    dst[0] = static_cast<float>(total);
  };
  k.device_body = [dst, src, n](RuntimeKind runtime, void* stream) {
    return on_device<SumLauncher>("sum", runtime, stream, dst, src, n);
  };
  return k;
}

}  // namespace capalloc::scenarios
