// runtime_plugins_test.cpp: the GPU backends are plugins (runtime/plugins.hpp).
//
// Linked against the shared libcapalloc.so, as a consumer links it: what is
// tested is what crosses the library's boundary. Each TEST_CASE runs in its
// own process (catch_discover_tests), so a case that hides the backends
// (CAPALLOC_BACKEND_PATH naming an empty directory) starts with none loaded.
// This machine may have HIP's and CUDA's libraries installed but no device:
// every GPU runtime then fails, each for a reason the message names.
#include <cstdlib>
#include <filesystem>
#include <string>

#include <catch2/catch.hpp>

#include "capalloc/allocator.hpp"
#include "capalloc/capalloc.h"
#include "capalloc/runtime.hpp"

namespace {

std::string message(const absl::Status& s) { return std::string(s.message()); }

// A directory that holds no plugin.
std::string empty_directory() {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / "capalloc_no_backends";
  std::filesystem::create_directories(dir);
  return dir.string();
}

}  // namespace

TEST_CASE("with the backends hidden, an explicit GPU runtime is a clear error naming the search",
          "[plugins]") {
  const std::string dir = empty_directory();
  REQUIRE(setenv("CAPALLOC_BACKEND_PATH", dir.c_str(), 1) == 0);
  for (const char* kind : {"cuda", "hip"}) {
    auto runtime = capalloc::make_runtime(kind);
    REQUIRE_FALSE(runtime.ok());
    CHECK(runtime.status().code() == absl::StatusCode::kUnavailable);
    const std::string why = message(runtime.status());
    CHECK_THAT(why, Catch::Contains(std::string("libcapalloc_backend_") + kind + ".so"));
    CHECK_THAT(why, Catch::Contains(dir));
    CHECK_THAT(why, Catch::Contains("CAPALLOC_BACKEND_PATH"));
  }
}

TEST_CASE("with the backends hidden, auto falls back to the host runtime and the core works",
          "[plugins]") {
  REQUIRE(setenv("CAPALLOC_BACKEND_PATH", empty_directory().c_str(), 1) == 0);
  auto runtime = capalloc::make_runtime("auto");
  REQUIRE(runtime.ok());
  CHECK((*runtime)->kind() == capalloc::RuntimeKind::kHost);
  auto allocator = capalloc::Allocator::create(*runtime);
  REQUIRE(allocator.ok());
  auto block = (*allocator)->allocate(1 << 20, 0, capalloc::kDefaultStream);
  REQUIRE(block.ok());
  CHECK((*allocator)->deallocate(*block).ok());
}

TEST_CASE("behind the PyTorch entry points, auto never falls back to host memory", "[plugins]") {
  REQUIRE(setenv("CAPALLOC_BACKEND_PATH", empty_directory().c_str(), 1) == 0);
  REQUIRE(unsetenv("CAPALLOC_RUNTIME") == 0);
  CHECK(capalloc_torch_malloc(4096, 0, nullptr) == nullptr);
  const std::string why = capalloc_last_error();
  CHECK_THAT(why, Catch::Contains("need a GPU runtime"));
  CHECK_THAT(why, Catch::Contains("libcapalloc_backend_cuda.so"));
  // The C ABI itself (not PyTorch) still runs on the host runtime it chose.
  void* p = nullptr;
  CHECK(capalloc_malloc(&p, 4096, 0, nullptr) == CAPALLOC_OK);
  CHECK(capalloc_free(p) == CAPALLOC_OK);
}

TEST_CASE("an explicit host runtime serves the PyTorch entry points", "[plugins]") {
  REQUIRE(setenv("CAPALLOC_RUNTIME", "host", 1) == 0);
  void* p = capalloc_torch_malloc(4096, 0, nullptr);
  CHECK(p != nullptr);
  capalloc_torch_free(p, 4096, 0, nullptr);
}

TEST_CASE("the backends beside libcapalloc are found: each GPU runtime loads or says why",
          "[plugins]") {
  REQUIRE(unsetenv("CAPALLOC_BACKEND_PATH") == 0);
  struct Backend {
    const char* kind;
    bool built;  // by this tree (tests/CMakeLists.txt)
  };
  for (const Backend b : {Backend{"cuda", CAPALLOC_TEST_BUILT_CUDA != 0},
                          Backend{"hip", CAPALLOC_TEST_BUILT_HIP != 0}}) {
    auto runtime = capalloc::make_runtime(b.kind);
    if (runtime.ok()) {
      CHECK(b.built);
      CHECK((*runtime)->name() == b.kind);
      continue;
    }
    CHECK(runtime.status().code() == absl::StatusCode::kUnavailable);
    const std::string why = message(runtime.status());
    INFO(why);
    const std::string plugin = std::string("libcapalloc_backend_") + b.kind + ".so";
    if (!b.built) {
      // Not built here: the message names the plugin, says it is not there
      // and how to point at one.
      CHECK(why.find(plugin) != std::string::npos);
      CHECK(why.find("not there") != std::string::npos);
      CHECK(why.find("CAPALLOC_BACKEND_PATH") != std::string::npos);
      continue;
    }
    // Found and loaded but no device, or found and its toolkit runtime is
    // missing: never "not there".
    const bool no_device = why.find("device") != std::string::npos;
    const bool toolkit_missing = why.find(std::string("lib") + b.kind) != std::string::npos &&
                                 why.find("not there") == std::string::npos;
    CHECK((no_device || toolkit_missing));
  }
}
