// runtime/plugins.cpp: see plugins.hpp.
#include "runtime/plugins.hpp"

#include <dlfcn.h>

#include <algorithm>
#include <mutex>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/config.hpp"
#include "common/log.hpp"

namespace capalloc::detail {
namespace {

// The directory of the file (shared library or executable) holding this code.
std::string directory_of_this_code() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&plugin_search_path), &info) == 0 ||
      info.dli_fname == nullptr) {
    return {};
  }
  std::string path(info.dli_fname);
  const std::size_t slash = path.rfind('/');
  return slash == std::string::npos ? std::string(".") : path.substr(0, slash);
}

struct LoadedPlugins {
  std::mutex mu;
  absl::flat_hash_map<std::string, void*> handles;  // stem -> dlopen handle
};

LoadedPlugins& loaded() {
  static auto* plugins = new LoadedPlugins();  // never destroyed: plugins stay loaded
  return *plugins;
}

}  // namespace

std::string backend_stem(RuntimeKind kind) {
  return absl::StrCat("capalloc_backend_", std::string(runtime_kind_name(kind)));
}

std::vector<std::string> plugin_search_path() {
  std::vector<std::string> dirs;
  if (const std::string path = config::get_text(config::Var::kBackendPath); !path.empty()) {
    for (absl::string_view dir : absl::StrSplit(path, ':', absl::SkipEmpty())) {
      dirs.emplace_back(dir);
    }
    return dirs;
  }
  if (std::string own = directory_of_this_code(); !own.empty()) dirs.push_back(std::move(own));
  for (std::string& dir : extra_plugin_dirs()) {
    if (std::find(dirs.begin(), dirs.end(), dir) == dirs.end()) dirs.push_back(std::move(dir));
  }
  return dirs;
}

absl::StatusOr<void*> load_plugin(std::string_view stem) {
  LoadedPlugins& plugins = loaded();
  const std::string key(stem);
  std::lock_guard<std::mutex> lock(plugins.mu);
  if (auto it = plugins.handles.find(key); it != plugins.handles.end()) return it->second;
  const std::string file = absl::StrCat("lib", key, ".so");
  const std::vector<std::string> dirs = plugin_search_path();
  std::vector<std::string> tried;
  for (const std::string& dir : dirs) {
    const std::string path = absl::StrCat(dir, "/", file);
    dlerror();
    if (void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL); handle != nullptr) {
      plugins.handles.emplace(key, handle);
      log().debug("loaded {}", path);
      return handle;
    }
    const char* why = dlerror();
    std::string reason = why != nullptr ? why : "unknown loader error";
    // "cannot open shared object file" for the plugin itself means absent;
    // for a library it needs, the loader names that library.
    if (reason.find(path) != std::string::npos &&
        reason.find("No such file or directory") != std::string::npos) {
      reason = "not there";
    }
    tried.push_back(absl::StrCat(path, " (", reason, ")"));
  }
  if (dirs.empty()) {
    return absl::UnavailableError(absl::StrCat(
        file, " not found: no directory to search (CAPALLOC_BACKEND_PATH is empty)"));
  }
  return absl::UnavailableError(absl::StrCat(file, " could not be loaded: ",
                                             absl::StrJoin(tried, "; "),
                                             " (CAPALLOC_BACKEND_PATH sets where to look)"));
}

absl::StatusOr<void*> plugin_symbol(std::string_view stem, const char* symbol) {
  auto handle = load_plugin(stem);
  if (!handle.ok()) return handle.status();
  dlerror();
  void* address = dlsym(*handle, symbol);
  if (address == nullptr) {
    const char* why = dlerror();
    return absl::UnavailableError(absl::StrFormat("lib%s.so has no symbol %s: %s",
                                                  std::string(stem), symbol,
                                                  why != nullptr ? why : "null address"));
  }
  return address;
}

absl::StatusOr<const BackendEntry*> load_backend(RuntimeKind kind) {
  if (kind == RuntimeKind::kHost) {
    return absl::InvalidArgumentError("the host runtime is part of libcapalloc, not a backend");
  }
  const std::string stem = backend_stem(kind);
  auto symbol = plugin_symbol(stem, CAPALLOC_BACKEND_ENTRY_NAME);
  if (!symbol.ok()) return symbol.status();
  using EntryFn = const BackendEntry* (*)();
  const BackendEntry* entry = reinterpret_cast<EntryFn>(*symbol)();
  if (entry == nullptr || entry->abi_version != kBackendAbiVersion ||
      entry->capalloc_version == nullptr ||
      std::string_view(entry->capalloc_version) != CAPALLOC_VERSION || entry->kind != kind ||
      entry->make_runtime == nullptr) {
    return absl::UnavailableError(absl::StrFormat(
        "lib%s.so does not match this libcapalloc (%s, backend ABI %d): it reports %s, ABI %d",
        stem, CAPALLOC_VERSION, kBackendAbiVersion,
        entry != nullptr && entry->capalloc_version != nullptr ? entry->capalloc_version : "?",
        entry != nullptr ? entry->abi_version : 0));
  }
  return entry;
}

}  // namespace capalloc::detail
