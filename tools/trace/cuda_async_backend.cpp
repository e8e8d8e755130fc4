// tools/trace/cuda_async_backend.cpp: see cuda_async_backend.hpp.
#include "tools/trace/cuda_async_backend.hpp"

#include <dlfcn.h>

#include <cstdint>
#include <limits>
#include <string>
#include <type_traits>

#include "absl/strings/str_cat.h"

namespace capalloc::trace {

namespace {

// driver_types.h's values, so that no CUDA header is needed to build.
constexpr int kReleaseThreshold = 0x4;  // cudaMemPoolAttrReleaseThreshold
constexpr int kReservedMemHigh = 0x6;   // cudaMemPoolAttrReservedMemHigh

// libcudart, loaded once per process, or why not.
struct LoadedApi {
  CudaAsyncBackend::Api api;
  std::string error;  // "" when every entry point was found
};

const LoadedApi& loaded_api() {
  static const LoadedApi loaded = [] {
    LoadedApi out;
    void* lib = nullptr;
    for (const char* name : {"libcudart.so", "libcudart.so.13", "libcudart.so.12"}) {
      lib = dlopen(name, RTLD_NOW | RTLD_LOCAL);
      if (lib != nullptr) break;
    }
    if (lib == nullptr) {
      out.error = "libcudart could not be loaded (libcudart.so, .13 or .12)";
      return out;
    }
    auto find = [&](auto& fn, const char* symbol) {
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(lib, symbol));
      if (fn == nullptr && out.error.empty()) out.error = absl::StrCat("libcudart has no ", symbol);
    };
    CudaAsyncBackend::Api& a = out.api;
    find(a.get_device_count, "cudaGetDeviceCount");
    find(a.stream_create, "cudaStreamCreate");
    find(a.stream_destroy, "cudaStreamDestroy");
    find(a.stream_synchronize, "cudaStreamSynchronize");
    find(a.malloc_async, "cudaMallocAsync");
    find(a.free_async, "cudaFreeAsync");
    find(a.device_get_default_mem_pool, "cudaDeviceGetDefaultMemPool");
    find(a.mem_pool_set_attribute, "cudaMemPoolSetAttribute");
    find(a.mem_pool_get_attribute, "cudaMemPoolGetAttribute");
    return out;
  }();
  return loaded;
}

}  // namespace

std::string CudaAsyncBackend::available() {
  const LoadedApi& loaded = loaded_api();
  if (!loaded.error.empty()) return loaded.error;
  int devices = 0;
  if (int e = loaded.api.get_device_count(&devices); e != 0 || devices == 0) {
    return absl::StrCat("no CUDA device (cudaGetDeviceCount: error ", e, ", ", devices,
                        " device(s))");
  }
  return "";
}

absl::Status CudaAsyncBackend::open(const Trace& trace) {
  if (std::string why = available(); !why.empty()) return absl::FailedPreconditionError(why);
  api_ = loaded_api().api;
  if (int e = api_.device_get_default_mem_pool(&pool_, 0); e != 0) {
    return absl::InternalError(absl::StrCat("cudaDeviceGetDefaultMemPool: error ", e));
  }
  std::uint64_t keep_all = std::numeric_limits<std::uint64_t>::max();
  if (int e = api_.mem_pool_set_attribute(pool_, kReleaseThreshold, &keep_all); e != 0) {
    return absl::InternalError(absl::StrCat("cudaMemPoolSetAttribute(release threshold): error ", e));
  }
  streams_.assign(trace.stream_ids.size(), nullptr);  // dense stream 0: the default stream
  for (std::size_t s = 1; s < streams_.size(); ++s) {
    if (int e = api_.stream_create(&streams_[s]); e != 0) {
      return absl::InternalError(absl::StrCat("cudaStreamCreate: error ", e));
    }
  }
  return absl::OkStatus();
}

absl::Status CudaAsyncBackend::end_pass() {
  for (void* stream : streams_) {
    if (int e = api_.stream_synchronize(stream); e != 0) {
      return absl::InternalError(absl::StrCat("cudaStreamSynchronize: error ", e));
    }
  }
  return absl::OkStatus();
}

std::uint64_t CudaAsyncBackend::peak_reserved() const {
  std::uint64_t high = 0;
  if (pool_ == nullptr || api_.mem_pool_get_attribute(pool_, kReservedMemHigh, &high) != 0) return 0;
  return high;
}

CudaAsyncBackend::~CudaAsyncBackend() {
  for (std::size_t s = 1; s < streams_.size(); ++s) {
    if (streams_[s] != nullptr) api_.stream_destroy(streams_[s]);
  }
}

}  // namespace capalloc::trace
