// capture/json_writer.cpp: see json_writer.hpp.
#include "capture/json_writer.hpp"

#include <utility>

#include "absl/strings/str_format.h"

namespace capalloc::detail {

JsonWriter& JsonWriter::pointer(const void* p) {
  return value(absl::StrFormat("%p", p == nullptr ? reinterpret_cast<const void*>(0) : p));
}

JsonWriter& JsonWriter::place(nlohmann::ordered_json v) {
  if (open_.empty()) {
    root_ = std::move(v);
    has_root_ = true;
    return *this;
  }
  nlohmann::ordered_json& parent = *open_.back();
  if (parent.is_object()) {
    parent[key_.value_or(std::string())] = std::move(v);
    key_.reset();
  } else {
    parent.push_back(std::move(v));
  }
  return *this;
}

JsonWriter& JsonWriter::open(nlohmann::ordered_json container) {
  if (open_.empty()) {
    root_ = std::move(container);
    has_root_ = true;
    open_.push_back(&root_);
    return *this;
  }
  nlohmann::ordered_json& parent = *open_.back();
  nlohmann::ordered_json* child = nullptr;
  if (parent.is_object()) {
    child = &(parent[key_.value_or(std::string())] = std::move(container));
    key_.reset();
  } else {
    parent.push_back(std::move(container));
    child = &parent.back();
  }
  open_.push_back(child);
  return *this;
}

JsonWriter& JsonWriter::close() {
  if (!open_.empty()) open_.pop_back();
  return *this;
}

const std::string& JsonWriter::str() const {
  out_ = has_root_ ? root_.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace)
                   : std::string();
  return out_;
}

}  // namespace capalloc::detail
