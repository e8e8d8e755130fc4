// allocator/persistent_cache.cpp: see capalloc/persistent_cache.hpp.
//
// The cache is a map from (device, key) to a block the allocator holds as
// persistent. It holds its own lock while calling the allocator; the
// allocator never calls the cache, so the two locks nest one way only.
#include "capalloc/persistent_cache.hpp"

#include <map>
#include <mutex>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/str_format.h"

namespace capalloc {

struct CAPALLOC_INTERNAL PersistentCache::Impl {
  Allocator* allocator = nullptr;
  mutable std::mutex mu;
  std::map<std::pair<int, std::string>, Entry> entries;
};

PersistentCache::PersistentCache(Allocator& allocator) : impl_(std::make_unique<Impl>()) {
  impl_->allocator = &allocator;
}

namespace {

// The owner recorded on each buffer: the call that releases it, so that a
// plain free of the buffer is refused with the way to release it.
std::string owner_of(int device, std::string_view key) {
  const std::string k = absl::CHexEscape(absl::string_view(key.data(), key.size()));
  return absl::StrFormat(
      "PersistentCache::release(%d, \"%s\") (C: capalloc_release_persistent(%d, \"%s\"); "
      "Python: capalloc.release_persistent(%d, \"%s\"))",
      device, k, device, k, device, k);
}

}  // namespace

PersistentCache::~PersistentCache() {
  for (auto& [key, entry] : impl_->entries) {
    impl_->allocator->deallocate_owned(entry.ptr, owner_of(entry.device, entry.key)).IgnoreError();
  }
}

absl::StatusOr<void*> PersistentCache::preallocate(int device, std::string_view key,
                                                   std::size_t bytes) {
  if (key.empty()) return absl::InvalidArgumentError("preallocate: empty key");
  if (bytes == 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("preallocate(%d, \"%s\"): zero bytes", device, std::string(key)));
  }
  std::lock_guard lock(impl_->mu);
  auto it = impl_->entries.find({device, std::string(key)});
  if (it != impl_->entries.end()) {
    if (it->second.bytes >= bytes) return it->second.ptr;
    return absl::FailedPreconditionError(absl::StrFormat(
        "preallocate(%d, \"%s\", %d): the key already holds %d bytes; growing it would move a "
        "buffer that captured graphs may point at. Preallocate the largest size first, or "
        "release the key once no graph uses it.",
        device, std::string(key), bytes, it->second.bytes));
  }
  const std::string owner = owner_of(device, key);
  auto p = impl_->allocator->allocate(
      bytes, device, kDefaultStream, {.lifetime = Lifetime::kPersistent, .tag = key, .owner = owner});
  if (!p.ok()) return p.status();
  impl_->entries.emplace(std::make_pair(device, std::string(key)),
                         Entry{device, std::string(key), *p, bytes});
  return *p;
}

absl::StatusOr<void*> PersistentCache::get(int device, std::string_view key) const {
  std::lock_guard lock(impl_->mu);
  auto it = impl_->entries.find({device, std::string(key)});
  if (it == impl_->entries.end()) {
    return absl::NotFoundError(absl::StrFormat(
        "persistent buffer \"%s\" on device %d was never preallocated; call "
        "PersistentCache::preallocate(%d, \"%s\", bytes) during warmup, before any capture",
        std::string(key), device, device, std::string(key)));
  }
  return it->second.ptr;
}

absl::Status PersistentCache::release(int device, std::string_view key) {
  std::lock_guard lock(impl_->mu);
  auto it = impl_->entries.find({device, std::string(key)});
  if (it == impl_->entries.end()) {
    return absl::NotFoundError(absl::StrFormat("release: no persistent buffer \"%s\" on device %d",
                                               std::string(key), device));
  }
  if (absl::Status s = impl_->allocator->deallocate_owned(it->second.ptr, owner_of(device, key));
      !s.ok()) {
    return s;
  }
  impl_->entries.erase(it);
  return absl::OkStatus();
}

std::vector<PersistentCache::Entry> PersistentCache::entries() const {
  std::lock_guard lock(impl_->mu);
  std::vector<Entry> out;
  for (const auto& [key, entry] : impl_->entries) out.push_back(entry);
  return out;
}

}  // namespace capalloc
