// capture/byte_ranges.cpp: see byte_ranges.hpp.
#include "capture/byte_ranges.hpp"

#include <algorithm>
#include <cstdint>
#include <utility>

namespace capalloc::detail {

MemorySpan intersect(MemorySpan a, MemorySpan b) {
  const std::uintptr_t begin = std::max(a.begin(), b.begin());
  const std::uintptr_t end = std::min(a.end(), b.end());
  return end > begin ? MemorySpan{reinterpret_cast<const void*>(begin), end - begin} : MemorySpan{};
}

void merge_in_place(std::vector<MemorySpan>& spans) {
  // Sorted, then compacted over itself (no second vector).
  if (spans.size() > 1) {
    std::sort(spans.begin(), spans.end(),
              [](const MemorySpan& a, const MemorySpan& b) { return a.begin() < b.begin(); });
  }
  std::size_t kept = 0;
  for (std::size_t i = 0; i < spans.size(); ++i) {
    const MemorySpan s = spans[i];
    if (s.bytes == 0) continue;
    if (kept != 0 && s.begin() <= spans[kept - 1].end()) {
      const std::uintptr_t end = std::max(spans[kept - 1].end(), s.end());
      spans[kept - 1].bytes = end - spans[kept - 1].begin();
    } else {
      spans[kept++] = s;
    }
  }
  spans.resize(kept);
}

std::vector<MemorySpan> merged(std::vector<MemorySpan> spans) {
  merge_in_place(spans);
  return spans;
}

void subtract_into(MemorySpan range, std::vector<MemorySpan>& cover,
                   std::vector<MemorySpan>& out) {
  if (range.bytes == 0) return;
  merge_in_place(cover);
  std::uintptr_t at = range.begin();
  for (const MemorySpan& c : cover) {
    if (c.end() <= at) continue;
    if (c.begin() >= range.end()) break;
    if (c.begin() > at) out.push_back({reinterpret_cast<const void*>(at), c.begin() - at});
    at = std::max(at, c.end());
  }
  if (at < range.end()) out.push_back({reinterpret_cast<const void*>(at), range.end() - at});
}

std::vector<MemorySpan> subtract(MemorySpan range, std::vector<MemorySpan> cover) {
  std::vector<MemorySpan> out;
  subtract_into(range, cover, out);
  return out;
}

std::vector<MemorySpan> intersect_all(const std::vector<MemorySpan>& set, MemorySpan range) {
  std::vector<MemorySpan> out;
  for (const MemorySpan& s : set) {
    const MemorySpan piece = intersect(s, range);
    if (piece.bytes != 0) out.push_back(piece);
  }
  return out;
}

bool covers(std::vector<MemorySpan> spans, MemorySpan range) {
  return range.bytes == 0 || subtract(range, std::move(spans)).empty();
}

}  // namespace capalloc::detail
