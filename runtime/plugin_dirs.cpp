// runtime/plugin_dirs.cpp: the plugin directories a library's build adds
// after its own directory (plugins.hpp). Compiled once per library: the
// installed libcapalloc.so adds none (its backends sit beside it); the build
// tree's static library (tests, tools) adds the build directory, where the
// plugins are built, through CAPALLOC_BUILD_PLUGIN_DIR.
#include "runtime/plugins.hpp"

namespace capalloc::detail {

std::vector<std::string> extra_plugin_dirs() {
#if defined(CAPALLOC_BUILD_PLUGIN_DIR)
  return {CAPALLOC_BUILD_PLUGIN_DIR};
#else
  return {};
#endif
}

}  // namespace capalloc::detail
