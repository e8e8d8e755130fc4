// capture/json_writer.hpp: a minimal streaming JSON writer for findings,
// snapshots and CLI output. Commas and escaping are handled here so callers
// only say what goes where.
#ifndef CAPALLOC_CAPTURE_JSON_WRITER_HPP_
#define CAPALLOC_CAPTURE_JSON_WRITER_HPP_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace capalloc::detail {

class JsonWriter {
 public:
  JsonWriter& begin_object() { return open('{'); }
  JsonWriter& end_object() { return close('}'); }
  JsonWriter& begin_array() { return open('['); }
  JsonWriter& end_array() { return close(']'); }
  JsonWriter& key(std::string_view k) {
    separate();
    string(k);
    out_ += ':';
    after_key_ = true;
    return *this;
  }
  JsonWriter& value(std::string_view v) {
    separate();
    string(v);
    return *this;
  }
  JsonWriter& value(const char* v) { return value(std::string_view(v)); }
  JsonWriter& value(bool v) {
    separate();
    out_ += v ? "true" : "false";
    return *this;
  }
  JsonWriter& value(std::uint64_t v) {
    separate();
    out_ += std::to_string(v);
    return *this;
  }
  JsonWriter& value(std::int64_t v) {
    separate();
    out_ += std::to_string(v);
    return *this;
  }
  JsonWriter& value(int v) { return value(static_cast<std::int64_t>(v)); }
  JsonWriter& value(double v);
  JsonWriter& null() { return raw("null"); }
  JsonWriter& pointer(const void* p);  // "0x..." string
  JsonWriter& raw(std::string_view json) {
    separate();
    out_ += json;
    return *this;
  }
  template <typename T>
  JsonWriter& field(std::string_view k, const T& v) {
    key(k);
    return value(v);
  }
  const std::string& str() const { return out_; }

 private:
  JsonWriter& open(char c) {
    separate();
    out_ += c;
    first_.push_back(true);
    return *this;
  }
  JsonWriter& close(char c) {
    out_ += c;
    first_.pop_back();
    return *this;
  }
  void separate() {
    if (after_key_) {
      after_key_ = false;
      return;
    }
    if (!first_.empty()) {
      if (!first_.back()) out_ += ',';
      first_.back() = false;
    }
  }
  void string(std::string_view s);

  std::string out_;
  std::vector<bool> first_;
  bool after_key_ = false;
};

}  // namespace capalloc::detail

#endif  // CAPALLOC_CAPTURE_JSON_WRITER_HPP_
