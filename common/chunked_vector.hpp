// common/chunked_vector.hpp: a sequence that grows at its end without moving
// its elements, in chunks of kChunk.
//
// What std::deque gives for push_back, at one allocation per kChunk elements:
// libstdc++'s deque holds 512 bytes a node, so elements of about 100 bytes
// cost an allocation every four or five. Elements are default-constructed a
// chunk at a time, and emplace_back hands out the next one as constructed
// (never used before: nothing is ever erased). Moving the whole moves the
// chunks' pointers; the elements stay where they are.
#ifndef CAPALLOC_COMMON_CHUNKED_VECTOR_HPP_
#define CAPALLOC_COMMON_CHUNKED_VECTOR_HPP_

#include <cassert>
#include <cstddef>
#include <memory>
#include <utility>
#include <vector>

namespace capalloc::detail {

template <typename T, std::size_t kChunk = 128>
class ChunkedVector {
 public:
  ChunkedVector() = default;
  ChunkedVector(const ChunkedVector&) = delete;
  ChunkedVector& operator=(const ChunkedVector&) = delete;
  ChunkedVector(ChunkedVector&& other) noexcept
      : chunks_(std::move(other.chunks_)), size_(std::exchange(other.size_, 0)) {}
  ChunkedVector& operator=(ChunkedVector&& other) noexcept {
    if (this != &other) {
      chunks_ = std::move(other.chunks_);
      size_ = std::exchange(other.size_, 0);
    }
    return *this;
  }

  // The next element, default-constructed. Throws std::bad_alloc (nothing
  // changed) when a new chunk cannot be had.
  T& emplace_back() {
    if (size_ == chunks_.size() * kChunk) {
      auto chunk = std::make_unique<T[]>(kChunk);
      chunks_.push_back(std::move(chunk));
    }
    T& slot = chunks_[size_ / kChunk][size_ % kChunk];
    ++size_;
    return slot;
  }
  T& push_back(T&& value) {
    T& slot = emplace_back();
    slot = std::move(value);
    return slot;
  }

  std::size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  T& operator[](std::size_t i) {
    assert(i < size_);
    return chunks_[i / kChunk][i % kChunk];
  }
  const T& operator[](std::size_t i) const {
    assert(i < size_);
    return chunks_[i / kChunk][i % kChunk];
  }

 private:
  std::vector<std::unique_ptr<T[]>> chunks_;
  std::size_t size_ = 0;
};

}  // namespace capalloc::detail

#endif  // CAPALLOC_COMMON_CHUNKED_VECTOR_HPP_
