// common/format.cpp: see format.hpp.
#include "common/format.hpp"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace capalloc::detail {

std::string bytes(std::uint64_t n) {
  static constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  if (n < 1024) return absl::StrFormat("%d B", n);
  double value = static_cast<double>(n);
  int unit = 0;
  while (value >= 1024.0 && unit < 6) {
    value /= 1024.0;
    ++unit;
  }
  return absl::StrFormat("%.2f %s", value, kUnits[unit]);
}

std::string bytes(std::int64_t n) {
  if (n >= 0) return bytes(static_cast<std::uint64_t>(n));
  // Negated in unsigned arithmetic, so INT64_MIN has a magnitude too. StrCat
  // rather than "-" + string: GCC 12 at -O3 gives a false -Wrestrict there.
  return absl::StrCat("-", bytes(0 - static_cast<std::uint64_t>(n)));
}

const char* state_name(BlockState state) {
  switch (state) {
    case BlockState::kAllocated:
      return "allocated";
    case BlockState::kFree:
      return "free";
    case BlockState::kPendingFree:
      return "pending-free";
  }
  return "?";
}

std::string describe_stats(const AllocatorStats& s) {
  return absl::StrFormat(
      "allocated %s (peak %s), requested %s (peak %s), reserved %s (peak %s) in %d segment(s); "
      "%d live block(s), %d cached free, %d pending free; %d allocations, %d frees, %d retries, "
      "%d OOMs",
      bytes(s.allocated_bytes.current), bytes(s.allocated_bytes.peak),
      bytes(s.requested_bytes.current), bytes(s.requested_bytes.peak),
      bytes(s.reserved_bytes.current), bytes(s.reserved_bytes.peak), s.segments.current,
      s.allocated_blocks.current, s.free_blocks, s.pending_free_blocks, s.allocations, s.frees,
      s.retries, s.ooms);
}

}  // namespace capalloc::detail
