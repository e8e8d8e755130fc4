// The shared library as PyTorch's CUDAPluggableAllocator uses it: loaded with
// dlopen, the two entry points found with dlsym by name, and called with
// PyTorch's pattern (alloc with device and stream; free with the pointer, the
// allocation's size, device and stream). Runs on the host runtime, without a
// GPU. This program links neither capalloc library: it sees only what the
// .so exports (its main() is Catch2's own, from catch_main.cpp).
#include <catch2/catch.hpp>

#include <dlfcn.h>

#include <cstdint>
#include <cstdlib>
#include <vector>

namespace {

using TorchMalloc = void* (*)(std::size_t, int, void*);
using TorchFree = void (*)(void*, std::size_t, int, void*);
using StreamCreate = int (*)(int, void**);
using StreamDestroy = int (*)(void*);
using Checker = int (*)();

struct Library {
  void* handle = nullptr;
  Library() {
    ::setenv("CAPALLOC_RUNTIME", "host", 1);
    handle = dlopen(CAPALLOC_LIBRARY_PATH, RTLD_NOW | RTLD_LOCAL);
  }
  ~Library() {
    // Not dlclosed: the process-wide allocator is never torn down.
  }
  template <typename F>
  F symbol(const char* name) const {
    return reinterpret_cast<F>(dlsym(handle, name));
  }
};

const Library& library() {
  static const Library lib;
  return lib;
}

}  // namespace

TEST_CASE("dlopen finds PyTorch's two entry points by name", "[dlopen][torch]") {
  INFO(dlerror());
  REQUIRE(library().handle != nullptr);
  CHECK(library().symbol<TorchMalloc>("capalloc_torch_malloc") != nullptr);
  CHECK(library().symbol<TorchFree>("capalloc_torch_free") != nullptr);
}

TEST_CASE("PyTorch's call pattern through dlsym on the host runtime", "[dlopen][torch]") {
  REQUIRE(library().handle != nullptr);
  auto torch_malloc = library().symbol<TorchMalloc>("capalloc_torch_malloc");
  auto torch_free = library().symbol<TorchFree>("capalloc_torch_free");
  auto stream_create = library().symbol<StreamCreate>("capalloc_stream_create");
  auto stream_destroy = library().symbol<StreamDestroy>("capalloc_stream_destroy");
  auto check = library().symbol<Checker>("capalloc_check_invariants");
  REQUIRE(torch_malloc != nullptr);
  REQUIRE(torch_free != nullptr);
  REQUIRE(stream_create != nullptr);
  REQUIRE(check != nullptr);

  void* stream = nullptr;
  REQUIRE(stream_create(0, &stream) == 0);
  struct Allocation {
    void* ptr;
    std::size_t size;
    void* stream;
  };
  std::vector<Allocation> live;
  // Tensors of many sizes on the default stream and on a side stream, some
  // freed out of order, as a training step does.
  for (int i = 0; i < 200; ++i) {
    const std::size_t size = 1 + static_cast<std::size_t>(i) * 4099 % (3 << 20);
    void* s = (i % 3 == 0) ? stream : nullptr;
    void* p = torch_malloc(size, 0, s);
    REQUIRE(p != nullptr);
    CHECK(reinterpret_cast<std::uintptr_t>(p) % 256 == 0);
    static_cast<unsigned char*>(p)[size - 1] = 0x5a;  // host runtime: memory is host memory
    live.push_back({p, size, s});
    if (i % 4 == 3) {
      const Allocation a = live[live.size() / 2];
      live.erase(live.begin() + static_cast<std::ptrdiff_t>(live.size() / 2));
      torch_free(a.ptr, a.size, 0, a.stream);
    }
  }
  CHECK(torch_malloc(0, 0, nullptr) == nullptr);       // empty tensors
  CHECK(torch_malloc(64, 3, nullptr) == nullptr);      // no device 3: NULL, no exception
  torch_free(nullptr, 0, 0, nullptr);                  // ignored
  for (const Allocation& a : live) torch_free(a.ptr, a.size, 0, a.stream);
  CHECK(check() == 0);
  REQUIRE(stream_destroy(stream) == 0);
}
