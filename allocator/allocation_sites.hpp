// allocator/allocation_sites.hpp: where allocations were made, for the
// retention audit: allocation stacks, Python call sites, and the calling
// thread's tag scopes.
//
// A site is a process-wide id (1-based; 0: none) naming a call stack, a
// call-site text (a Python "file.py:12 in f", given by a tag scope), or both.
// Sites are interned: the same stack from the same scope is one id, so a
// block carries 4 bytes and recording a stack costs the unwind, a hash of its
// frames and one lookup under a process-wide lock (no heap allocation once
// the site has been seen). Frames are symbolized only when a site is
// described (absl::Symbolize), and the names are then kept.
//
// Tag scopes are per thread: the innermost scope's tag and site apply to the
// allocations the thread makes without a tag of its own, by an allocator
// that applies scopes (Allocator::Impl's observer, see observation.hpp).
// Nothing here is per allocator; the table never shrinks, so a site id stays
// valid for the life of the process. Thread-safe.
#ifndef CAPALLOC_ALLOCATOR_ALLOCATION_SITES_HPP_
#define CAPALLOC_ALLOCATOR_ALLOCATION_SITES_HPP_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"

namespace capalloc::detail {

// The deepest stack a site keeps, innermost frame first.
inline constexpr int kMaxSiteFrames = 32;

// The site of the current call stack within the scope site `scope_site` (0:
// none), skipping the `skip` innermost frames (the recorder's own).
std::uint32_t record_stack_site(std::uint32_t scope_site, int skip);
// The site naming `location` only (a tag scope's call site); 0 for "".
std::uint32_t location_site(std::string_view location);

struct SiteDescription {
  std::string location;             // the scope's call site, or empty
  std::vector<std::string> frames;  // symbolized, innermost first; "0x..." if unknown
  // The first frame outside capalloc (the allocating code), or the location
  // when there is no stack; empty for site 0.
  std::string summary;
};
// Symbolizes on first use (cached).
SiteDescription describe_site(std::uint32_t site);

// The calling thread's tag scopes: a stack, innermost applying. Push fails
// (kResourceExhausted) past kMaxTagScopes nested scopes; pop fails
// (kFailedPrecondition) with none open. Both change nothing on failure.
inline constexpr int kMaxTagScopes = 64;
//
// Each scope belongs to one allocator (`owner`: the token enable_tag_scopes
// returns; compared, never dereferenced): an allocator applies the
// innermost scope it owns, so that a scope opened for allocator A does not
// tag what allocator B allocates on the same thread.
struct TagScope {
  std::uint32_t tag_id = 0;   // interned tag (common/interned_strings.hpp)
  std::uint32_t site_id = 0;  // location_site of the scope's call site
  const void* owner = nullptr;
};
absl::Status push_tag_scope(std::string_view tag, std::string_view location, const void* owner);
absl::Status pop_tag_scope();
// Replaces the calling thread's scopes with one (`tag`, `location`), or with
// none when `tag` is empty (nullopt): for a caller that keeps the scope
// stack itself (Python's, per asyncio task and context) and tells the
// thread which scope is current.
void set_tag_scope(std::optional<std::string_view> tag, std::string_view location,
                   const void* owner);
// The calling thread's innermost scope that `owner` owns, or null.
const TagScope* current_tag_scope(const void* owner);

}  // namespace capalloc::detail

#endif  // CAPALLOC_ALLOCATOR_ALLOCATION_SITES_HPP_
