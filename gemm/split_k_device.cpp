// gemm/split_k_device.cpp: dispatch of a split-K launch to the kernels built
// into the runtime's backend plugin (see split_k_device.hpp).
#include "gemm/split_k_device.hpp"

#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "runtime/plugins.hpp"

namespace capalloc::detail {

absl::Status launch_split_k_on_device(RuntimeKind runtime, const splitk::Params& params,
                                      void* native_stream) {
  if (runtime == RuntimeKind::kHost) {
    return absl::InvalidArgumentError("split-K GEMM: the host runtime runs the host units");
  }
  // split_k_device.cu, compiled into the runtime's backend plugin.
  using Launcher = int (*)(const splitk::Params*, void*, char*, unsigned long);
  auto address = plugin_symbol(backend_stem(runtime), "capalloc_splitk_launch");
  if (!address.ok()) {
    return absl::UnavailableError(
        absl::StrCat("split-K GEMM: ", std::string(address.status().message())));
  }
  char error[256] = {};
  if (reinterpret_cast<Launcher>(*address)(&params, native_stream, error, sizeof error) != 0) {
    return absl::InternalError(absl::StrFormat("split-K GEMM launch on %s failed: %s",
                                               std::string(runtime_kind_name(runtime)), error));
  }
  return absl::OkStatus();
}

}  // namespace capalloc::detail
