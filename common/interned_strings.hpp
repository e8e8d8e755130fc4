// common/interned_strings.hpp: short strings (block tags, kernel names)
// interned once per process.
//
// Tags and operation names are few (labels, not data) and are named by every
// block and every recorded write; interning them makes those records cheap
// to copy. The table never shrinks, so a view it hands out stays valid for
// the life of the process, past any allocator's or tracker's. Thread-safe.
//
// Bounded: past kMaxInternedStrings distinct strings, every new string gets
// the id of kInternedOverflow (logged once), so that tags that carry data
// (a request id per tag) cost at most the table's size, not memory per
// request for the life of the process.
#ifndef CAPALLOC_COMMON_INTERNED_STRINGS_HPP_
#define CAPALLOC_COMMON_INTERNED_STRINGS_HPP_

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace capalloc::detail {

inline constexpr std::size_t kMaxInternedStrings = std::size_t{1} << 16;
inline constexpr std::string_view kInternedOverflow = "<capalloc: too many distinct tags>";

// The id of `s` (0 for the empty string), adding it on first sight (the
// overflow placeholder's id once the table is full).
std::uint32_t intern_id(std::string_view s);
// Strings interned so far (the placeholder included).
std::size_t interned_count();
// The string of a nonzero id from intern_id.
std::string_view interned_nonzero(std::uint32_t id);
// The string of an id from intern_id; empty for 0 (most blocks are
// untagged: that case costs a comparison, not a call and the table's lock).
inline std::string_view interned(std::uint32_t id) {
  return id == 0 ? std::string_view{} : interned_nonzero(id);
}
// A view of the interned copy of `s`.
inline std::string_view intern(std::string_view s) { return interned(intern_id(s)); }

}  // namespace capalloc::detail

#endif  // CAPALLOC_COMMON_INTERNED_STRINGS_HPP_
