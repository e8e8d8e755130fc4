// common/interned_strings.cpp: see interned_strings.hpp.
#include "common/interned_strings.hpp"

#include <deque>
#include <mutex>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "common/log.hpp"

namespace capalloc::detail {

namespace {

struct Table {
  std::mutex mu;
  std::deque<std::string> names;  // a deque never moves its strings
  absl::flat_hash_map<std::string, std::uint32_t> ids;
  std::uint32_t overflow = 0;  // the placeholder's id, once the table is full
};

Table& table() {
  static Table* t = new Table();  // never destroyed: views outlive static destructors
  return *t;
}

}  // namespace

std::uint32_t intern_id(std::string_view s) {
  if (s.empty()) return 0;
  Table& t = table();
  std::lock_guard lock(t.mu);
  // Debian's Abseil has its own string_view type, hence the conversion.
  if (auto it = t.ids.find(absl::string_view(s.data(), s.size())); it != t.ids.end()) {
    return it->second;
  }
  if (t.names.size() >= kMaxInternedStrings) {
    // Full: every new string is one placeholder, so that per-request tags
    // (a request id in each tag) cannot grow the process without bound.
    if (t.overflow == 0) {
      t.names.emplace_back(kInternedOverflow);
      t.overflow = static_cast<std::uint32_t>(t.names.size());
      t.ids.emplace(t.names.back(), t.overflow);
      log().warn(
          "capalloc: {} distinct tags, locations and names are interned, the most it keeps (they "
          "are never freed); new ones are recorded as '{}' from now on. Tag by what a block is "
          "for (\"decoder.layer3\"), not by request.",
          kMaxInternedStrings, kInternedOverflow);
    }
    return t.overflow;
  }
  t.names.emplace_back(s);
  const auto id = static_cast<std::uint32_t>(t.names.size());
  t.ids.emplace(t.names.back(), id);
  return id;
}

std::size_t interned_count() {
  Table& t = table();
  std::lock_guard lock(t.mu);
  return t.names.size();
}

std::string_view interned_nonzero(std::uint32_t id) {
  Table& t = table();
  std::lock_guard lock(t.mu);
  return t.names[id - 1];
}

}  // namespace capalloc::detail
