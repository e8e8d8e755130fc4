// common/fibonacci_hash.hpp: Fibonacci hashing, for tables whose slot is
// the top bits of a key: the key times 2^64 / phi, whose top bits depend on
// every bit of the key (small integers and aligned pointers alike spread
// over the slots). One multiply and one shift.
#ifndef CAPALLOC_COMMON_FIBONACCI_HASH_HPP_
#define CAPALLOC_COMMON_FIBONACCI_HASH_HPP_

#include <cstddef>
#include <cstdint>

namespace capalloc::detail {

// The slot of `key` in a table of 2^(64 - shift) slots.
inline std::size_t fibonacci_slot(std::uint64_t key, unsigned shift) {
  return static_cast<std::size_t>((key * 0x9E3779B97F4A7C15ull) >> shift);
}

}  // namespace capalloc::detail

#endif  // CAPALLOC_COMMON_FIBONACCI_HASH_HPP_
