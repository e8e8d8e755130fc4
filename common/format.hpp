// common/format.hpp: human-readable renderings shared by error messages,
// describe() and the CLI.
#ifndef CAPALLOC_COMMON_FORMAT_HPP_
#define CAPALLOC_COMMON_FORMAT_HPP_

#include <cstdint>
#include <string>

#include "capalloc/allocator.hpp"

namespace capalloc::detail {

// "1.50 MiB", "512 B".
std::string bytes(std::uint64_t n);
std::string bytes(std::int64_t n);
const char* state_name(BlockState state);
// One line: allocated/requested/reserved (current and peak), blocks, segments.
std::string describe_stats(const AllocatorStats& stats);

}  // namespace capalloc::detail

#endif  // CAPALLOC_COMMON_FORMAT_HPP_
