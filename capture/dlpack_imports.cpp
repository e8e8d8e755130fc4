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
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_format.h"
#include "capalloc/dlpack.hpp"
#include "common/guarded.hpp"
#include "common/log.hpp"
#include "common/status_macros.hpp"

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
    if (stride == std::numeric_limits<std::int64_t>::min()) {  // -stride would overflow
      return absl::InvalidArgumentError(absl::StrFormat(
          "dlpack import: dimension %d has stride %d, whose magnitude does not fit in int64", d,
          stride));
    }
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
  std::int64_t low = 0;         // Extent::low
  bool stream_gone = false;     // the import's stream was destroyed since
};

// What the stream-destruction watcher may touch after the object is gone.
struct State {
  std::mutex mu;
  absl::flat_hash_map<DLManagedTensor*, Imported> imported;  // guarded by mu
  std::uint64_t released_at_teardown = 0;                    // guarded by mu
  std::uint64_t next_token = 1;                              // guarded by mu
};

}  // namespace

struct CAPALLOC_INTERNAL DlpackImports::Impl {
  ReleaseQueue* queue = nullptr;
  std::uint64_t hook = 0;  // the queue's teardown hook
  std::shared_ptr<State> state = std::make_shared<State>();

  enum class Outcome { kReleased, kNotImported, kFailed };
  // Takes the tensor out of the registry (when `token` is 0 or names its
  // import) and hands its deleter to the queue; puts it back if the queue
  // refuses.
  absl::Status release(DLManagedTensor* tensor, std::uint64_t token, Outcome* outcome);
};

DlpackImports::DlpackImports(ReleaseQueue& queue) : impl_(std::make_unique<Impl>()) {
  impl_->queue = &queue;
  impl_->hook = queue.add_teardown_hook([this] { release_all_at_teardown(); });
  // A destroyed stream's work has run (destroy_stream waits for it): the
  // tensors imported on it are marked so that their release does not ask
  // the runtime about a stream it no longer knows (as the allocator forgets
  // a destroyed stream: allocator/stream_lifetimes.cpp).
  std::weak_ptr<State> weak = impl_->state;
  queue.runtime().watch_stream_destruction([weak](StreamHandle stream) {
    auto state = weak.lock();
    if (state == nullptr) return false;
    std::lock_guard lock(state->mu);
    for (auto& [tensor, entry] : state->imported) {
      if (entry.view.stream == stream) entry.stream_gone = true;
    }
    return true;
  });
}

DlpackImports::~DlpackImports() {
  impl_->queue->remove_teardown_hook(impl_->hook);
  release_all_at_teardown();
}

std::size_t DlpackImports::release_all_at_teardown() {
  // In a fork() child the tensors are the parent's: it releases them.
  if (!impl_->queue->check_process("").ok()) return 0;
  State& st = *impl_->state;
  std::vector<DLManagedTensor*> left;
  {
    std::lock_guard lock(st.mu);
    for (const auto& [tensor, entry] : st.imported) left.push_back(tensor);
  }
  std::size_t released = 0;
  for (DLManagedTensor* tensor : left) {
    Impl::Outcome outcome = Impl::Outcome::kFailed;
    absl::Status s = impl_->release(tensor, 0, &outcome);
    if (outcome == Impl::Outcome::kReleased) {
      ++released;
    } else if (outcome == Impl::Outcome::kFailed) {
      // Only "released meanwhile" (by another thread) is not worth a word.
      detail::log().error(
          "dlpack imports: releasing the tensor {} still imported at teardown failed ({}); "
          "its deleter was not called",
          static_cast<const void*>(tensor), s.ToString());
    }
  }
  if (released > 0) {
    {
      std::lock_guard lock(st.mu);
      st.released_at_teardown += released;
    }
    detail::log().warn(
        "dlpack imports: {} tensor(s) still imported at teardown were released (never released "
        "by the application); each deleter runs after its stream's work",
        released);
  }
  return released;
}

std::size_t DlpackImports::released_at_teardown() const {
  std::lock_guard lock(impl_->state->mu);
  return impl_->state->released_at_teardown;
}

absl::StatusOr<ImportedTensor> DlpackImports::import(DLManagedTensor* tensor, StreamHandle stream) {
  return detail::guarded("dlpack import", [&]() -> absl::StatusOr<ImportedTensor> {
    if (tensor == nullptr) return absl::InvalidArgumentError("dlpack import: the tensor is null");
    CAPALLOC_RETURN_IF_ERROR(impl_->queue->check_process("dlpack import"));
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
    // data + byte_offset + low .. + bytes must lie inside the address space.
    const auto base = reinterpret_cast<std::uintptr_t>(t.data);
    constexpr std::uintptr_t kTop = std::numeric_limits<std::uintptr_t>::max();
    if (t.byte_offset > kTop - base) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "dlpack import: byte_offset %u past data %p runs past the end of the address space",
          t.byte_offset, t.data));
    }
    const std::uintptr_t first = base + t.byte_offset;
    const auto below = static_cast<std::uintptr_t>(-extent->low);  // low <= 0
    if (extent->bytes != 0 &&
        (below > first || extent->bytes > kTop - (first - below))) {
      return absl::InvalidArgumentError(
          "dlpack import: the bytes the tensor addresses (data + byte_offset and its strides) run "
          "outside the address space");
    }
    // Checked before the tensor is registered: a stream the runtime does
    // not know fails here rather than at release.
    if (auto info = rt.capture_info(stream); !info.ok()) return info.status();
    Imported entry;
    entry.view.data = reinterpret_cast<void*>(first);
    entry.view.bytes = static_cast<std::size_t>(extent->bytes);
    entry.view.device = t.device.device_id;
    entry.view.stream = stream;
    entry.low = extent->low;
    State& st = *impl_->state;
    std::lock_guard lock(st.mu);
    entry.view.token = st.next_token;
    if (!st.imported.try_emplace(tensor, entry).second) {
      return absl::AlreadyExistsError(
          "dlpack import: this DLManagedTensor is already imported (a capsule is consumed "
          "once); release it before importing it again");
    }
    ++st.next_token;
    return entry.view;
  });
}

absl::Status DlpackImports::Impl::release(DLManagedTensor* tensor, std::uint64_t token,
                                          Outcome* outcome) {
  *outcome = Outcome::kFailed;
  if (tensor == nullptr) return absl::InvalidArgumentError("dlpack release: the tensor is null");
  Imported entry;
  {
    std::lock_guard lock(state->mu);
    auto it = state->imported.find(tensor);
    if (it == state->imported.end()) {
      *outcome = Outcome::kNotImported;
      return absl::NotFoundError(
          "dlpack release: this DLManagedTensor is not imported here, or was released already "
          "(its deleter may have run: the pointer must not be used again)");
    }
    if (token != 0 && it->second.view.token != token) {
      *outcome = Outcome::kNotImported;
      return absl::NotFoundError(absl::StrFormat(
          "dlpack release: import %u of this DLManagedTensor was released already; the address "
          "is now import %u (the producer reused the struct), which this release leaves alone",
          token, it->second.view.token));
    }
    entry = it->second;
    state->imported.erase(it);
  }
  std::vector<MemorySpan> memory;
  if (entry.view.bytes != 0) {
    memory.push_back({static_cast<char*>(entry.view.data) + entry.low, entry.view.bytes});
  }
  auto deleter = [tensor] {
    if (tensor->deleter != nullptr) tensor->deleter(tensor);
  };
  absl::Status queued =
      entry.stream_gone
          ? queue->release_after_stream_destroyed(entry.view.device, entry.view.stream,
                                                  std::move(deleter), std::move(memory))
          : queue->release(entry.view.device, entry.view.stream, std::move(deleter),
                           std::move(memory));
  if (!queued.ok()) {
    // Nothing changed: the tensor stays imported.
    std::lock_guard lock(state->mu);
    state->imported.try_emplace(tensor, entry);
    return queued;
  }
  *outcome = Outcome::kReleased;
  return queued;
}

absl::Status DlpackImports::release(DLManagedTensor* tensor) { return release(tensor, 0); }

absl::Status DlpackImports::release(DLManagedTensor* tensor, std::uint64_t token) {
  return detail::guarded("dlpack release", [&]() -> absl::Status {
    Impl::Outcome outcome;
    return impl_->release(tensor, token, &outcome);
  });
}

std::size_t DlpackImports::imported() const {
  std::lock_guard lock(impl_->state->mu);
  return impl_->state->imported.size();
}

}  // namespace capalloc
