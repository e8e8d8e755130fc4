// Uses the installed C++ API: a host runtime, an allocator over it, one
// allocation, stats before and after the free. Exits 0 only if all of it
// behaves as documented.
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>

#include "capalloc/allocator.hpp"
#include "capalloc/runtime.hpp"

namespace {

int fail(const char* what, const absl::Status& status) {
  std::fprintf(stderr, "consumer_cpp: %s: %s\n", what, status.ToString().c_str());
  return 1;
}

}  // namespace

int main() {
  absl::StatusOr<std::shared_ptr<capalloc::DeviceRuntime>> runtime = capalloc::make_host_runtime();
  if (!runtime.ok()) return fail("make_host_runtime", runtime.status());

  absl::StatusOr<std::unique_ptr<capalloc::Allocator>> allocator =
      capalloc::Allocator::create(*runtime);
  if (!allocator.ok()) return fail("Allocator::create", allocator.status());
  capalloc::Allocator& alloc = **allocator;

  constexpr std::size_t kBytes = std::size_t{1} << 20;
  capalloc::AllocOptions options;
  options.tag = "consumer";
  absl::StatusOr<void*> ptr = alloc.allocate(kBytes, /*device=*/0, capalloc::kDefaultStream, options);
  if (!ptr.ok()) return fail("allocate", ptr.status());
  // The host runtime's device memory is host memory: it can be written here.
  std::memset(*ptr, 0x5a, kBytes);

  absl::StatusOr<capalloc::AllocatorStats> live = alloc.stats(0);
  if (!live.ok()) return fail("stats", live.status());
  if (live->allocated_bytes.current < static_cast<std::int64_t>(kBytes) || live->allocations != 1) {
    std::fprintf(stderr, "consumer_cpp: unexpected stats while live: allocated=%lld allocations=%llu\n",
                 static_cast<long long>(live->allocated_bytes.current),
                 static_cast<unsigned long long>(live->allocations));
    return 1;
  }

  if (absl::Status s = alloc.deallocate(*ptr); !s.ok()) return fail("deallocate", s);
  // A second free of the same pointer is an error, not a crash.
  if (alloc.deallocate(*ptr).ok()) {
    std::fprintf(stderr, "consumer_cpp: double free was accepted\n");
    return 1;
  }

  absl::StatusOr<capalloc::AllocatorStats> after = alloc.stats(0);
  if (!after.ok()) return fail("stats", after.status());
  if (after->allocated_bytes.current != 0 || after->frees != 1 ||
      after->allocated_bytes.peak < static_cast<std::int64_t>(kBytes)) {
    std::fprintf(stderr, "consumer_cpp: unexpected stats after free: allocated=%lld frees=%llu\n",
                 static_cast<long long>(after->allocated_bytes.current),
                 static_cast<unsigned long long>(after->frees));
    return 1;
  }
  if (absl::Status s = alloc.CheckInvariants(); !s.ok()) return fail("CheckInvariants", s);

  // Every backend plugin the build made is installed beside libcapalloc.so
  // and found there: its runtime loads, or fails for a reason of its own (no
  // device, its toolkit runtime missing), never "not found".
  for (const char* kind : {"cuda", "hip"}) {
    const std::string plugin = std::string("capalloc_backend_") + kind;
    if (std::string(CAPALLOC_EXPECTED_BACKENDS).find(plugin) == std::string::npos) continue;
    auto gpu = capalloc::make_runtime(kind);
    if (gpu.ok()) continue;
    const std::string why(gpu.status().message());
    if (why.find("not there") != std::string::npos) {
      std::fprintf(stderr, "consumer_cpp: the installed %s backend was not found: %s\n", kind,
                   why.c_str());
      return 1;
    }
    std::printf("consumer_cpp: %s backend found; %s\n", kind, why.c_str());
  }

  std::printf("consumer_cpp: ok (%s runtime, peak %lld bytes)\n",
              std::string(alloc.runtime().name()).c_str(),
              static_cast<long long>(after->allocated_bytes.peak));
  return 0;
}
