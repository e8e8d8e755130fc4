// runtime/plugins.hpp: capalloc's run-time loaded libraries.
//
// The GPU backends (libcapalloc_backend_cuda.so, libcapalloc_backend_hip.so:
// a DeviceRuntime and the GEMM's device code, each linked against its own
// toolkit only) and the scenario kernels (libcapalloc_scenarios_cuda.so, ...)
// are plugins: libcapalloc itself links no GPU runtime, so it loads on a
// machine with neither toolkit. A plugin is named by its stem
// ("capalloc_backend_cuda") and looked up as lib<stem>.so in, in order:
//   - the directories of CAPALLOC_BACKEND_PATH (colon-separated), when set;
//     then nothing else is searched;
//   - otherwise the directory that holds libcapalloc's code (the install's
//     library directory), and, for the build tree's static library only, the
//     build directory where the plugins are built.
// A plugin is loaded once (RTLD_NOW | RTLD_LOCAL) and never unloaded: the
// runtimes and kernels it hands out may be used until the process exits.
//
// A backend plugin defines one C entry point, CAPALLOC_BACKEND_ENTRY, that
// returns its BackendEntry; the loader refuses a plugin built for another
// ABI version or another capalloc version, naming both.
#ifndef CAPALLOC_RUNTIME_PLUGINS_HPP_
#define CAPALLOC_RUNTIME_PLUGINS_HPP_

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "capalloc/runtime.hpp"

// The one symbol a backend plugin exports, and its signature.
#define CAPALLOC_BACKEND_ENTRY capalloc_backend_entry_v1
#define CAPALLOC_BACKEND_ENTRY_NAME "capalloc_backend_entry_v1"

namespace capalloc::detail {

inline constexpr std::uint32_t kBackendAbiVersion = 1;

struct BackendEntry {
  std::uint32_t abi_version = 0;  // kBackendAbiVersion
  const char* capalloc_version = nullptr;  // CAPALLOC_VERSION it was built from
  RuntimeKind kind = RuntimeKind::kHost;
  // Fails with kUnavailable ("no CUDA device") when the toolkit finds none.
  absl::StatusOr<std::shared_ptr<DeviceRuntime>> (*make_runtime)() = nullptr;
};

// The stem of a kind's backend plugin: "capalloc_backend_cuda".
std::string backend_stem(RuntimeKind kind);

// Where plugins are looked for, in order (see the file comment).
std::vector<std::string> plugin_search_path();

// Loads lib<stem>.so from the search path (once) and returns its handle.
// kUnavailable, naming every place tried and what failed there (not found,
// or the loader's message: a missing libcudart.so.13, say).
absl::StatusOr<void*> load_plugin(std::string_view stem);

// The address of `symbol` in plugin `stem`, loading it first if needed.
absl::StatusOr<void*> plugin_symbol(std::string_view stem, const char* symbol);

// The backend of a GPU runtime kind, checked against this library's ABI.
absl::StatusOr<const BackendEntry*> load_backend(RuntimeKind kind);

// The directories this library's build adds after its own (plugin_dirs.cpp,
// compiled once per library: the shared one adds none).
std::vector<std::string> extra_plugin_dirs();

}  // namespace capalloc::detail

#endif  // CAPALLOC_RUNTIME_PLUGINS_HPP_
