// allocator/allocation_sites.cpp: see allocation_sites.hpp.
//
// The site table is a deque of entries (never moved, never freed) and a hash
// index from a 64-bit hash of (scope site, frames) to the first entry with
// that hash; entries with the same hash are chained, and compared frame by
// frame, so a collision costs a comparison, never a wrong site.
#include "allocator/allocation_sites.hpp"

#include <dlfcn.h>

#include <algorithm>
#include <cstring>
#include <deque>
#include <initializer_list>
#include <string_view>
#include <mutex>

#include "absl/container/flat_hash_map.h"
#include "absl/debugging/stacktrace.h"
#include "absl/debugging/symbolize.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/interned_strings.hpp"

namespace capalloc::detail {

namespace {

struct SiteEntry {
  std::uint32_t location_id = 0;  // interned text; 0: none
  std::uint32_t next_same_hash = 0;
  int depth = 0;
  void* frames[kMaxSiteFrames] = {};
  bool symbolized = false;
  std::vector<std::string> names;  // after symbolizing
};

struct SiteTable {
  std::mutex mu;
  std::deque<SiteEntry> entries;  // entry i has site id i + 1
  absl::flat_hash_map<std::uint64_t, std::uint32_t> by_hash;
};

SiteTable& table() {
  static SiteTable* t = new SiteTable();  // never destroyed: ids outlive static destructors
  return *t;
}

std::uint64_t hash_of(std::uint32_t location_id, void* const* frames, int depth) {
  std::uint64_t h = 0x9E3779B97F4A7C15ull ^ location_id;
  for (int i = 0; i < depth; ++i) {
    h ^= reinterpret_cast<std::uintptr_t>(frames[i]);
    h *= 0xFF51AFD7ED558CCDull;
    h ^= h >> 29;
  }
  return h ^ static_cast<std::uint64_t>(depth);
}

// The id of (location, frames), adding it on first sight. Requires t.mu.
std::uint32_t intern_site(SiteTable& t, std::uint32_t location_id, void* const* frames,
                          int depth) {
  const std::uint64_t h = hash_of(location_id, frames, depth);
  auto it = t.by_hash.find(h);
  for (std::uint32_t id = it == t.by_hash.end() ? 0 : it->second; id != 0;) {
    const SiteEntry& e = t.entries[id - 1];
    if (e.location_id == location_id && e.depth == depth &&
        std::equal(frames, frames + depth, e.frames)) {
      return id;
    }
    id = e.next_same_hash;
  }
  SiteEntry& e = t.entries.emplace_back();
  e.location_id = location_id;
  e.depth = depth;
  std::copy(frames, frames + depth, e.frames);
  const auto id = static_cast<std::uint32_t>(t.entries.size());
  if (it == t.by_hash.end()) {
    t.by_hash.emplace(h, id);
  } else {
    e.next_same_hash = it->second;
    it->second = id;
  }
  return id;
}

// Frames of capalloc itself (and of the unwinder) are not where an
// allocation was made.
bool is_capalloc_frame(std::string_view name) {
  for (std::string_view library :
       {"capalloc::Allocator::", "capalloc::detail::", "capalloc::CaptureTracker::",
        "capalloc::PersistentCache::", "capalloc_", "absl::", "0x"}) {
    if (name.starts_with(library)) return true;
  }
  return false;
}

// The calling thread's scopes: plain data, constant-initialised, so that no
// TLS init function is needed (see tracker_impl.hpp on hidden-visibility
// links).
struct ScopeStack {
  int depth = 0;
  TagScope scopes[kMaxTagScopes];
};
thread_local ScopeStack scope_stack;

}  // namespace

std::uint32_t record_stack_site(std::uint32_t scope_site, int skip) {
  void* frames[kMaxSiteFrames];
  const int depth = absl::GetStackTrace(frames, kMaxSiteFrames, skip + 1);
  SiteTable& t = table();
  std::lock_guard lock(t.mu);
  // A scope site is a location-only entry: its location is what combines.
  const std::uint32_t location_id = scope_site == 0 ? 0 : t.entries[scope_site - 1].location_id;
  return intern_site(t, location_id, frames, depth);
}

std::uint32_t location_site(std::string_view location) {
  if (location.empty()) return 0;
  const std::uint32_t location_id = intern_id(location);
  SiteTable& t = table();
  std::lock_guard lock(t.mu);
  return intern_site(t, location_id, nullptr, 0);
}

SiteDescription describe_site(std::uint32_t site) {
  SiteDescription d;
  if (site == 0) return d;
  SiteTable& t = table();
  std::lock_guard lock(t.mu);
  if (site > t.entries.size()) return d;
  SiteEntry& e = t.entries[site - 1];
  if (!e.symbolized) {
    for (int i = 0; i < e.depth; ++i) {
      char name[1024];
      // A return address: the call is the instruction before it.
      const void* pc = static_cast<const char*>(e.frames[i]) - 1;
      if (absl::Symbolize(pc, name, sizeof name)) {
        e.names.emplace_back(name);
        continue;
      }
      // No symbol: a frame of an object without symbols is named by object
      // and offset; an address in no loaded object is not code at all. The
      // frame-pointer unwinder walked off the chain there (code built
      // without frame pointers, such as the Python interpreter): the stack
      // ends, rather than naming a stack address as a frame.
      Dl_info object;
      if (dladdr(pc, &object) == 0 || object.dli_fname == nullptr) break;
      const char* file = std::strrchr(object.dli_fname, '/');
      e.names.push_back(absl::StrFormat(
          "%s+0x%x", file == nullptr ? object.dli_fname : file + 1,
          static_cast<const char*>(pc) - static_cast<const char*>(object.dli_fbase)));
    }
    e.symbolized = true;
  }
  d.location = std::string(interned(e.location_id));
  d.frames = e.names;
  if (!d.location.empty()) {
    d.summary = d.location;
  } else {
    for (const std::string& f : d.frames) {
      if (!is_capalloc_frame(f)) {
        d.summary = f;
        break;
      }
    }
    if (d.summary.empty() && !d.frames.empty()) d.summary = d.frames.back();
  }
  return d;
}

absl::Status push_tag_scope(std::string_view tag, std::string_view location, const void* owner) {
  ScopeStack& s = scope_stack;
  if (s.depth == kMaxTagScopes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "push_tag: ", kMaxTagScopes,
        " tag scopes are already open on this thread; is a pop_tag missing?"));
  }
  s.scopes[s.depth] = TagScope{intern_id(tag), location_site(location), owner};
  ++s.depth;
  return absl::OkStatus();
}

absl::Status pop_tag_scope() {
  ScopeStack& s = scope_stack;
  if (s.depth == 0) {
    return absl::FailedPreconditionError("pop_tag: no tag scope is open on this thread");
  }
  --s.depth;
  return absl::OkStatus();
}

void set_tag_scope(std::optional<std::string_view> tag, std::string_view location,
                   const void* owner) {
  ScopeStack& s = scope_stack;
  if (!tag.has_value()) {
    s.depth = 0;
    return;
  }
  s.scopes[0] = TagScope{intern_id(*tag), location_site(location), owner};
  s.depth = 1;
}

const TagScope* current_tag_scope(const void* owner) {
  const ScopeStack& s = scope_stack;
  for (int i = s.depth - 1; i >= 0; --i) {
    if (s.scopes[i].owner == owner) return &s.scopes[i];
  }
  return nullptr;
}

}  // namespace capalloc::detail
