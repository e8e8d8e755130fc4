// common/interned_strings.cpp: see interned_strings.hpp.
#include "common/interned_strings.hpp"

#include <deque>
#include <mutex>
#include <string>

#include "absl/container/flat_hash_map.h"

namespace capalloc::detail {

namespace {

struct Table {
  std::mutex mu;
  std::deque<std::string> names;  // a deque never moves its strings
  absl::flat_hash_map<std::string, std::uint32_t> ids;
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
  t.names.emplace_back(s);
  const auto id = static_cast<std::uint32_t>(t.names.size());
  t.ids.emplace(t.names.back(), id);
  return id;
}

std::string_view interned(std::uint32_t id) {
  if (id == 0) return {};
  Table& t = table();
  std::lock_guard lock(t.mu);
  return t.names[id - 1];
}

}  // namespace capalloc::detail
