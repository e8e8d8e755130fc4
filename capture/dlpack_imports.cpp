// capture/dlpack_imports.cpp: DlpackImports (capalloc/dlpack.hpp).
//
// Owns the registry of imported tensors (by DLManagedTensor address, under
// `mu`) and nothing else: a release moves the tensor out of the registry
// and hands its deleter to the ReleaseQueue, which runs it in stream order.
// The only file that includes <dlpack/dlpack.h>, so the public headers do
// not need it.
#include <dlpack/dlpack.h>

#include <cstdint>
#include <limits>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_format.h"
#include "capalloc/dlpack.hpp"
#include "common/guarded.hpp"
#include "common/log.hpp"

namespace capalloc {

namespace {

const char* dl_device_name(int type) {
  switch (type) {
    case kDLCPU:
      return "kDLCPU";
    case kDLCUDA:
      return "kDLCUDA";
    case kDLCUDAHost:
      return "kDLCUDAHost";
    case kDLROCM:
      return "kDLROCM";
    case kDLROCMHost:
      return "kDLROCMHost";
    case kDLCUDAManaged:
      return "kDLCUDAManaged";
    default:
      return "another device type";
  }
}

// The one DLPack device type each runtime's device memory is.
DLDeviceType served_device_type(RuntimeKind kind) {
  switch (kind) {
    case RuntimeKind::kCuda:
      return kDLCUDA;
    case RuntimeKind::kHip:
      return kDLROCM;
    case RuntimeKind::kHost:
      break;
  }
  return kDLCPU;
}

// The bytes a tensor addresses, from its lowest to one past its highest
// byte, relative to data + byte_offset (strides may be negative: `low`
// is then below the first element).
struct Extent {
  std::int64_t low = 0;
  std::uint64_t bytes = 0;
};

absl::StatusOr<Extent> tensor_extent(const DLTensor& t) {
  if (t.ndim < 0) return absl::InvalidArgumentError("dlpack import: ndim is negative");
  if (t.ndim > 0 && t.shape == nullptr) {
    return absl::InvalidArgumentError("dlpack import: shape is null with ndim > 0");
  }
  const std::uint64_t element_bits = std::uint64_t{t.dtype.bits} * t.dtype.lanes;
  const std::uint64_t element_bytes = (element_bits + 7) / 8;
  if (element_bytes == 0) {
    return absl::InvalidArgumentError("dlpack import: the data type has zero bits or lanes");
  }
  constexpr std::int64_t kMax = std::numeric_limits<std::int64_t>::max() / 4;
  std::int64_t low = 0;
  std::int64_t high = 0;  // in elements, of the last element
  std::int64_t contiguous = 1;
  for (int d = t.ndim - 1; d >= 0; --d) {
    const std::int64_t n = t.shape[d];
    if (n < 0) {
      return absl::InvalidArgumentError(
          absl::StrFormat("dlpack import: dimension %d has negative size %d", d, n));
    }
    if (n == 0) return Extent{0, 0};
    const std::int64_t stride = t.strides != nullptr ? t.strides[d] : contiguous;
    const std::int64_t span = n - 1;
    if (stride != 0 && (span > kMax / (stride < 0 ? -stride : stride))) {
      return absl::InvalidArgumentError("dlpack import: the tensor's size overflows");
    }
    if (stride >= 0) {
      high += span * stride;
    } else {
      low += span * stride;
    }
    if (high > kMax || low < -kMax) {
      return absl::InvalidArgumentError("dlpack import: the tensor's size overflows");
    }
    if (t.strides == nullptr) {
      if (contiguous > kMax / n) {
        return absl::InvalidArgumentError("dlpack import: the tensor's size overflows");
      }
      contiguous *= n;
    }
  }
  const auto elements = static_cast<std::uint64_t>(high - low + 1);
  if (elements > static_cast<std::uint64_t>(kMax) / element_bytes) {
    return absl::InvalidArgumentError("dlpack import: the tensor's size overflows");
  }
  return Extent{low * static_cast<std::int64_t>(element_bytes), elements * element_bytes};
}

struct Imported {
  ImportedTensor view;
  std::int64_t low = 0;  // Extent::low
};

}  // namespace

struct CAPALLOC_INTERNAL DlpackImports::Impl {
  ReleaseQueue* queue = nullptr;
  std::uint64_t hook = 0;  // the queue's teardown hook
  mutable std::mutex mu;
  absl::flat_hash_map<DLManagedTensor*, Imported> imported;  // guarded by mu
  std::uint64_t released_at_teardown = 0;                    // guarded by mu
};

DlpackImports::DlpackImports(ReleaseQueue& queue) : impl_(std::make_unique<Impl>()) {
  impl_->queue = &queue;
  impl_->hook = queue.add_teardown_hook([this] { release_all_at_teardown(); });
}

DlpackImports::~DlpackImports() {
  impl_->queue->remove_teardown_hook(impl_->hook);
  release_all_at_teardown();
}

std::size_t DlpackImports::release_all_at_teardown() {
  std::vector<DLManagedTensor*> left;
  {
    std::lock_guard lock(impl_->mu);
    for (const auto& [tensor, entry] : impl_->imported) left.push_back(tensor);
  }
  std::size_t released = 0;
  for (DLManagedTensor* tensor : left) {
    if (absl::Status s = release(tensor); s.ok()) {
      ++released;
    } else if (s.code() != absl::StatusCode::kNotFound) {  // kNotFound: released meanwhile
      detail::log().error(
          "dlpack imports: releasing a tensor still imported at teardown failed ({}); "
          "its deleter was not called",
          s.ToString());
    }
  }
  if (released > 0) {
    {
      std::lock_guard lock(impl_->mu);
      impl_->released_at_teardown += released;
    }
    detail::log().warn(
        "dlpack imports: {} tensor(s) still imported at teardown were released (never released "
        "by the application); each deleter runs after its stream's work",
        released);
  }
  return released;
}

std::size_t DlpackImports::released_at_teardown() const {
  std::lock_guard lock(impl_->mu);
  return impl_->released_at_teardown;
}

absl::StatusOr<ImportedTensor> DlpackImports::import(DLManagedTensor* tensor, StreamHandle stream) {
  return detail::guarded("dlpack import", [&]() -> absl::StatusOr<ImportedTensor> {
    if (tensor == nullptr) return absl::InvalidArgumentError("dlpack import: the tensor is null");
    MemoryRuntime& rt = impl_->queue->runtime();
    const DLTensor& t = tensor->dl_tensor;
    const DLDeviceType served = served_device_type(rt.kind());
    if (t.device.device_type != served) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "dlpack import: the tensor's device type is %s (%d); the %s runtime serves %s only",
          dl_device_name(t.device.device_type), static_cast<int>(t.device.device_type),
          std::string(rt.name()), dl_device_name(served)));
    }
    if (t.device.device_id < 0 || t.device.device_id >= rt.device_count()) {
      return absl::InvalidArgumentError(
          absl::StrFormat("dlpack import: device id %d does not exist (the %s runtime has %d)",
                          t.device.device_id, std::string(rt.name()), rt.device_count()));
    }
    auto extent = tensor_extent(t);
    if (!extent.ok()) return extent.status();
    if (t.data == nullptr && extent->bytes != 0) {
      return absl::InvalidArgumentError("dlpack import: data is null for a non-empty tensor");
    }
    // Checked before the tensor is registered: a stream the runtime does
    // not know fails here rather than at release.
    if (auto info = rt.capture_info(stream); !info.ok()) return info.status();
    Imported entry;
    entry.view.data = static_cast<char*>(t.data) + t.byte_offset;
    entry.view.bytes = static_cast<std::size_t>(extent->bytes);
    entry.view.device = t.device.device_id;
    entry.view.stream = stream;
    entry.low = extent->low;
    std::lock_guard lock(impl_->mu);
    if (!impl_->imported.try_emplace(tensor, entry).second) {
      return absl::AlreadyExistsError(
          "dlpack import: this DLManagedTensor is already imported (a capsule is consumed "
          "once); release it before importing it again");
    }
    return entry.view;
  });
}

absl::Status DlpackImports::release(DLManagedTensor* tensor) {
  return detail::guarded("dlpack release", [&]() -> absl::Status {
    if (tensor == nullptr) return absl::InvalidArgumentError("dlpack release: the tensor is null");
    Imported entry;
    {
      std::lock_guard lock(impl_->mu);
      auto it = impl_->imported.find(tensor);
      if (it == impl_->imported.end()) {
        return absl::NotFoundError(
            "dlpack release: this DLManagedTensor is not imported here, or was released already "
            "(its deleter may have run: the pointer must not be used again)");
      }
      entry = it->second;
      impl_->imported.erase(it);
    }
    std::vector<MemorySpan> memory;
    if (entry.view.bytes != 0) {
      memory.push_back({static_cast<char*>(entry.view.data) + entry.low, entry.view.bytes});
    }
    absl::Status queued = impl_->queue->release(
        entry.view.device, entry.view.stream,
        [tensor] {
          if (tensor->deleter != nullptr) tensor->deleter(tensor);
        },
        std::move(memory));
    if (!queued.ok()) {
      // Nothing changed: the tensor stays imported.
      std::lock_guard lock(impl_->mu);
      impl_->imported.try_emplace(tensor, entry);
    }
    return queued;
  });
}

std::size_t DlpackImports::imported() const {
  std::lock_guard lock(impl_->mu);
  return impl_->imported.size();
}

}  // namespace capalloc
