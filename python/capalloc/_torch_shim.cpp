// python/capalloc/_torch_shim.cpp: capalloc as PyTorch's CUDA allocator with
// every hook CUDAPluggableAllocator offers that capalloc answers, not only
// malloc and free.
//
// Built by capalloc.install() on the machine where PyTorch is installed
// (python/capalloc/_shim_build.py: the system C++ compiler, against
// PyTorch's own headers and libraries); never part of the CMake build.
// It calls libcapalloc.so's C ABI (include/capalloc/capalloc.h) through
// dlsym on the library the Python module loaded, so both share one
// process-wide capalloc, and sets on a CUDAPluggableAllocator:
//
//   record_stream       tensor.record_stream(s)        -> capalloc_record_stream
//   reset (emptyCache)  torch.cuda.empty_cache()       -> capalloc_empty_cache(-1)
//   begin_allocate_to_pool  CUDAGraph::capture_begin   -> capalloc_torch_begin_allocate_to_pool
//   end_allocate_to_pool    CUDAGraph::capture_end     -> capalloc_torch_end_allocate_to_pool
//   release_pool            CUDAGraph::reset / del     -> capalloc_torch_release_pool
//
// The end hook runs after cudaStreamEndCapture and before PyTorch
// instantiates (and destroys) the graph: capalloc inspects the graph there
// and checks it. A strict-mode refusal is thrown as a c10::Error, which
// PyTorch raises in Python (RuntimeError) at the end of the
// `with torch.cuda.graph(...)` block, with the finding in its message.
#include <dlfcn.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>

#include <pybind11/pybind11.h>
#include <c10/util/Exception.h>
#include <torch/csrc/cuda/CUDAPluggableAllocator.h>

namespace {

// capalloc's C ABI, as include/capalloc/capalloc.h declares it (statuses are
// ints: CAPALLOC_OK is 0).
struct CapallocApi {
  void* (*torch_malloc)(size_t, int, void*) = nullptr;
  void (*torch_free)(void*, size_t, int, void*) = nullptr;
  int (*record_stream)(void*, void*) = nullptr;
  int (*empty_cache)(int) = nullptr;
  int (*begin_allocate_to_pool)(int, uint64_t, uint64_t, int (*)(void*, void*), void*) = nullptr;
  int (*end_allocate_to_pool)(int, uint64_t, uint64_t, const char**) = nullptr;
  int (*release_pool)(int, uint64_t, uint64_t) = nullptr;
  const char* (*last_error)() = nullptr;
};

CapallocApi api;

template <typename Fn>
void bind(void* library, const char* name, Fn& fn) {
  void* symbol = dlsym(library, name);
  if (symbol == nullptr) {
    throw std::runtime_error(std::string("capalloc torch shim: libcapalloc.so has no ") + name +
                             " (a library older than this shim?)");
  }
  fn = reinterpret_cast<Fn>(symbol);
}

using Filter = std::function<bool(cudaStream_t)>;
using PoolKey = std::tuple<int, unsigned long long, unsigned long long>;

// The filters of begins not yet ended, per (device, MempoolId_t), oldest
// first: capalloc calls them (through call_filter) until the matching end.
std::mutex filters_mu;
std::map<PoolKey, std::deque<std::unique_ptr<Filter>>> filters;

// How often each hook ran: what capalloc.active_hooks() reports as seen.
struct Counts {
  std::atomic<uint64_t> record_stream{0};
  std::atomic<uint64_t> empty_cache{0};
  std::atomic<uint64_t> begin_allocate_to_pool{0};
  std::atomic<uint64_t> end_allocate_to_pool{0};
  std::atomic<uint64_t> release_pool{0};
  std::atomic<uint64_t> filter_calls{0};
};
Counts counts;

std::mutex findings_mu;
std::string last_findings = "[]";

std::shared_ptr<c10::cuda::CUDACachingAllocator::CUDAAllocator> installed;

// Called by capalloc, never with an exception escaping into C.
int call_filter(void* context, void* stream) {
  counts.filter_calls.fetch_add(1, std::memory_order_relaxed);
  try {
    return (*static_cast<Filter*>(context))(static_cast<cudaStream_t>(stream)) ? 1 : 0;
  } catch (...) {
    return 0;
  }
}

std::string capalloc_error(const char* call, int status) {
  return std::string(call) + " failed (status " + std::to_string(status) + "): " +
         (api.last_error != nullptr ? api.last_error() : "");
}

void on_record_stream(void* ptr, cudaStream_t stream) {
  counts.record_stream.fetch_add(1, std::memory_order_relaxed);
  if (ptr == nullptr) return;  // an empty tensor holds no block
  const int status = api.record_stream(ptr, static_cast<void*>(stream));
  TORCH_CHECK(status == 0, capalloc_error("capalloc_record_stream", status));
}

void on_empty_cache() {
  counts.empty_cache.fetch_add(1, std::memory_order_relaxed);
  const int status = api.empty_cache(-1);
  TORCH_CHECK(status == 0, capalloc_error("capalloc_empty_cache", status));
}

void on_begin_allocate_to_pool(int device, c10::cuda::MempoolId_t pool, Filter filter) {
  counts.begin_allocate_to_pool.fetch_add(1, std::memory_order_relaxed);
  auto owned = std::make_unique<Filter>(std::move(filter));
  Filter* context = owned.get();
  std::lock_guard<std::mutex> lock(filters_mu);
  const int status = api.begin_allocate_to_pool(device, pool.first, pool.second,
                                                *context ? &call_filter : nullptr, context);
  TORCH_CHECK(status == 0, capalloc_error("capalloc_torch_begin_allocate_to_pool", status));
  filters[PoolKey{device, pool.first, pool.second}].push_back(std::move(owned));
}

void on_end_allocate_to_pool(int device, c10::cuda::MempoolId_t pool) {
  counts.end_allocate_to_pool.fetch_add(1, std::memory_order_relaxed);
  const char* json = nullptr;
  int status = 0;
  {
    std::lock_guard<std::mutex> lock(filters_mu);
    status = api.end_allocate_to_pool(device, pool.first, pool.second, &json);
    // The JSON is set exactly when the end happened: the begin's filter is
    // no longer called, and goes.
    if (json != nullptr) {
      const PoolKey key{device, pool.first, pool.second};
      auto it = filters.find(key);
      if (it != filters.end() && !it->second.empty()) {
        it->second.pop_front();
        if (it->second.empty()) filters.erase(it);
      }
    }
  }
  if (json != nullptr) {
    std::lock_guard<std::mutex> lock(findings_mu);
    last_findings = json;
  }
  TORCH_CHECK(status == 0, capalloc_error("capalloc_torch_end_allocate_to_pool", status));
}

void on_release_pool(int device, c10::cuda::MempoolId_t pool) {
  counts.release_pool.fetch_add(1, std::memory_order_relaxed);
  // PyTorch releases pools from destructors: report, never throw.
  const int status = api.release_pool(device, pool.first, pool.second);
  if (status != 0) {
    std::fprintf(stderr, "capalloc: %s\n",
                 capalloc_error("capalloc_torch_release_pool", status).c_str());
  }
}

// Makes capalloc (the library at `library_path`, already loaded by the
// Python module) PyTorch's CUDA allocator, with every hook above. Before the
// first CUDA allocation of the process, as for any pluggable allocator.
void install(const std::string& library_path) {
  TORCH_CHECK(!installed, "capalloc torch shim: already installed");
  void* library = dlopen(library_path.c_str(), RTLD_NOW | RTLD_GLOBAL);
  TORCH_CHECK(library != nullptr, "capalloc torch shim: cannot load ", library_path, ": ",
              dlerror());
  CapallocApi found;
  bind(library, "capalloc_torch_malloc", found.torch_malloc);
  bind(library, "capalloc_torch_free", found.torch_free);
  bind(library, "capalloc_record_stream", found.record_stream);
  bind(library, "capalloc_empty_cache", found.empty_cache);
  bind(library, "capalloc_torch_begin_allocate_to_pool", found.begin_allocate_to_pool);
  bind(library, "capalloc_torch_end_allocate_to_pool", found.end_allocate_to_pool);
  bind(library, "capalloc_torch_release_pool", found.release_pool);
  bind(library, "capalloc_last_error", found.last_error);
  api = found;

  namespace pluggable = torch::cuda::CUDAPluggableAllocator;
  auto allocator = pluggable::createCustomAllocator(
      [](size_t size, int device, cudaStream_t stream) {
        return api.torch_malloc(size, device, static_cast<void*>(stream));
      },
      [](void* ptr, size_t size, int device, cudaStream_t stream) {
        api.torch_free(ptr, size, device, static_cast<void*>(stream));
      });
  // createCustomAllocator makes a CUDAPluggableAllocator.
  auto hooks = std::static_pointer_cast<pluggable::CUDAPluggableAllocator>(allocator);
  hooks->set_record_stream_fn(&on_record_stream);
  hooks->set_reset_fn(&on_empty_cache);
  hooks->set_begin_allocate_to_pool(&on_begin_allocate_to_pool);
  hooks->set_end_allocate_to_pool_fn(&on_end_allocate_to_pool);
  hooks->set_release_pool(&on_release_pool);
  pluggable::changeCurrentAllocator(allocator);
  installed = allocator;
}

pybind11::dict hook_counts() {
  pybind11::dict d;
  d["record_stream"] = counts.record_stream.load();
  d["empty_cache"] = counts.empty_cache.load();
  d["begin_allocate_to_pool"] = counts.begin_allocate_to_pool.load();
  d["end_allocate_to_pool"] = counts.end_allocate_to_pool.load();
  d["release_pool"] = counts.release_pool.load();
  d["filter_calls"] = counts.filter_calls.load();
  return d;
}

std::string findings_of_last_end() {
  std::lock_guard<std::mutex> lock(findings_mu);
  return last_findings;
}

}  // namespace

PYBIND11_MODULE(_capalloc_torch_shim, m) {
  m.doc() = "capalloc's PyTorch shim: CUDAPluggableAllocator with capalloc's hooks";
  m.def("install", &install, pybind11::arg("library_path"));
  m.def("installed", [] { return static_cast<bool>(installed); });
  m.def("hook_counts", &hook_counts);
  m.def("findings_of_last_end", &findings_of_last_end);
  m.def("hooks", [] {
    pybind11::list l;
    for (const char* h : {"malloc", "free", "record_stream", "empty_cache",
                          "begin_allocate_to_pool", "end_allocate_to_pool", "release_pool"}) {
      l.append(h);
    }
    return l;
  });
}
