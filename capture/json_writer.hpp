// capture/json_writer.hpp: the JSON writer of findings, snapshots and CLI
// output. Callers say what goes where (begin_object, key, value, ...); the
// document is built with nlohmann-json and printed compactly, keys in the
// order written. Output is always valid UTF-8: invalid bytes in a string (a
// tag is the caller's bytes) are replaced by U+FFFD, as nlohmann-json's
// `replace` error handler does. Non-finite doubles print as null.
#ifndef CAPALLOC_CAPTURE_JSON_WRITER_HPP_
#define CAPALLOC_CAPTURE_JSON_WRITER_HPP_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace capalloc::detail {

class JsonWriter {
 public:
  JsonWriter& begin_object() { return open(nlohmann::ordered_json::object()); }
  JsonWriter& end_object() { return close(); }
  JsonWriter& begin_array() { return open(nlohmann::ordered_json::array()); }
  JsonWriter& end_array() { return close(); }
  JsonWriter& key(std::string_view k) {
    key_ = std::string(k);
    return *this;
  }
  JsonWriter& value(std::string_view v) { return place(std::string(v)); }
  JsonWriter& value(const char* v) { return value(std::string_view(v)); }
  JsonWriter& value(const std::string& v) { return place(v); }
  JsonWriter& value(bool v) { return place(v); }
  JsonWriter& value(std::uint64_t v) { return place(v); }
  JsonWriter& value(std::int64_t v) { return place(v); }
  JsonWriter& value(int v) { return place(static_cast<std::int64_t>(v)); }
  JsonWriter& value(double v) { return place(v); }
  JsonWriter& null() { return place(nullptr); }
  JsonWriter& pointer(const void* p);  // "0x..." string
  template <typename T>
  JsonWriter& field(std::string_view k, const T& v) {
    key(k);
    return value(v);
  }
  // The document so far (complete once every object and array is closed).
  const std::string& str() const;

 private:
  JsonWriter& open(nlohmann::ordered_json container);
  JsonWriter& close();
  JsonWriter& place(nlohmann::ordered_json v);

  nlohmann::ordered_json root_;
  bool has_root_ = false;
  // The open containers, outermost first. Only the innermost one grows while
  // it is open, so the pointers stay valid.
  std::vector<nlohmann::ordered_json*> open_;
  std::optional<std::string> key_;
  mutable std::string out_;
};

}  // namespace capalloc::detail

#endif  // CAPALLOC_CAPTURE_JSON_WRITER_HPP_
