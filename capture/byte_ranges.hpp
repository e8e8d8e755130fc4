// capture/byte_ranges.hpp: sets of byte ranges, as the alias rule computes
// harmed bytes: intersections, unions and differences of MemorySpans. A
// "range set" is a vector of spans sorted by start, disjoint and non-empty.
#ifndef CAPALLOC_CAPTURE_BYTE_RANGES_HPP_
#define CAPALLOC_CAPTURE_BYTE_RANGES_HPP_

#include <vector>

#include "capalloc/runtime.hpp"

namespace capalloc::detail {

// The bytes both hold (an empty span when none).
MemorySpan intersect(MemorySpan a, MemorySpan b);
// `spans` as a range set: sorted, merged where they touch or overlap.
std::vector<MemorySpan> merged(std::vector<MemorySpan> spans);
// The same in place (no allocation).
void merge_in_place(std::vector<MemorySpan>& spans);
// The bytes of `range` that none of `cover` holds, as a range set.
std::vector<MemorySpan> subtract(MemorySpan range, std::vector<MemorySpan> cover);
// The same appended to `out`; `cover` may be merged in place. For callers
// that keep their vectors across calls (the alias rule's inner loops), so
// that neither allocates once grown.
void subtract_into(MemorySpan range, std::vector<MemorySpan>& cover, std::vector<MemorySpan>& out);
// The range set `set` within `range`.
std::vector<MemorySpan> intersect_all(const std::vector<MemorySpan>& set, MemorySpan range);
// True when `spans` together hold every byte of `range`.
bool covers(std::vector<MemorySpan> spans, MemorySpan range);

}  // namespace capalloc::detail

#endif  // CAPALLOC_CAPTURE_BYTE_RANGES_HPP_
