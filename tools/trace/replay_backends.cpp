// tools/trace/replay_backends.cpp: see replay_backends.hpp.
#include "tools/trace/replay_backends.hpp"

#include <dlfcn.h>
#include <unistd.h>

#include <string_view>

#include "absl/strings/str_cat.h"
#include "c_api/global.hpp"

namespace capalloc::trace {

namespace {

absl::Status c_error(const char* call) {
  return absl::InternalError(absl::StrCat(call, ": ", capalloc_last_error()));
}

}  // namespace

absl::Status CapallocBackend::open(const Trace& trace) {
  const char* runtime = capalloc_runtime_name();
  if (runtime == nullptr) return c_error("capalloc_runtime_name");
  if (std::string_view(runtime) != runtime_) {
    return absl::FailedPreconditionError(absl::StrCat("capalloc runs on the \"", runtime,
                                                      "\" runtime; this replay needs CAPALLOC_RUNTIME=",
                                                      runtime_));
  }
  streams_.assign(trace.stream_ids.size(), nullptr);  // dense stream 0: the default stream
  for (std::size_t s = 1; s < streams_.size(); ++s) {
    if (capalloc_stream_create(0, &streams_[s]) != CAPALLOC_OK) return c_error("capalloc_stream_create");
  }
  capture_streams_.assign(trace.captures, nullptr);
  graphs_.assign(trace.captures, 0);
  // One graph pool per pool name, kept across passes (as a server keeps its
  // pool): the measured pass finds what the warm-up pass left cached there,
  // as every other allocator finds its warm caches.
  pools_.assign(trace.pools.size(), 0);
  for (std::uint64_t& pool : pools_) {
    if (capalloc_pool_create(0, &pool) != CAPALLOC_OK) return c_error("capalloc_pool_create");
  }
  return absl::OkStatus();
}

std::vector<PoolMemory> CapallocBackend::pool_memory(const Trace& trace) const {
  // Read through the library's internals: the C ABI has no per-pool figure.
  std::vector<PoolMemory> out;
  const auto& global = detail::global_capalloc();
  if (!global.ok()) return out;
  for (std::size_t i = 0; i < pools_.size(); ++i) {
    auto stats = global->allocator->pool_stats(pools_[i]);
    if (!stats.ok()) continue;
    out.push_back({.name = trace.pools[i],
                   .reserved_peak = stats->reserved_bytes.peak,
                   .reserved_at_end = stats->reserved_bytes.current});
  }
  return out;
}

absl::Status CapallocBackend::end_pass() {
  for (std::uint64_t& graph : graphs_) {
    if (graph != 0 && capalloc_graph_destroy(graph) != CAPALLOC_OK) return c_error("capalloc_graph_destroy");
    graph = 0;
  }
  for (void* stream : streams_) {
    if (capalloc_stream_synchronize(stream) != CAPALLOC_OK) return c_error("capalloc_stream_synchronize");
  }
  return absl::OkStatus();
}

absl::Status NaiveBackend::open(const Trace&) {
  auto runtime = make_host_runtime();
  if (!runtime.ok()) return runtime.status();
  runtime_ = *std::move(runtime);
  const long page = sysconf(_SC_PAGESIZE);
  if (page > 0) page_bytes_ = static_cast<std::uint64_t>(page);
  return absl::OkStatus();
}

std::string malloc_library() {
  void* (*const resolved)(std::size_t) = &std::malloc;
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(resolved), &info) == 0 || info.dli_fname == nullptr) {
    return "unknown";
  }
  return info.dli_fname;
}

}  // namespace capalloc::trace
