// tools/trace/json_error.hpp: why a line of a trace is not JSON, for the
// readers' messages (`capalloc bench`, `audit --trace`, `report`).
#ifndef CAPALLOC_TOOLS_TRACE_JSON_ERROR_HPP_
#define CAPALLOC_TOOLS_TRACE_JSON_ERROR_HPP_

#include <algorithm>
#include <cstddef>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace capalloc::trace {

// nlohmann's reason `text` is not one JSON value ("syntax error while
// parsing value - invalid string: ill-formed UTF-8 byte", "number overflow
// parsing '1e400'", ...), without its "[json.exception...] parse error at
// line 1, column N: " prefix (the line is the caller's); "" when it parses.
// Every parser error is a reason here, not an exception: a number too large
// for a double is out_of_range, not parse_error.
inline std::string json_error(std::string_view text) {
  try {
    [[maybe_unused]] const nlohmann::json parsed = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    std::string why = e.what();
    if (const auto colon = why.find(": "); colon != std::string::npos) {
      why = why.substr(colon + 2);
    } else if (const auto tag = why.find("] "); why.starts_with("[") && tag != std::string::npos) {
      why = why.substr(tag + 2);
    }
    return why.empty() ? std::string("not JSON") : why;
  }
  return "";
}

// The deepest nesting of arrays and objects in `text` (one JSON document or
// JSON Lines), brackets inside strings not counted. Writing JSON back out
// (nlohmann's dump) recurses once per level: a reader that copies input
// into its output refuses a depth far beyond any real snapshot or trace
// rather than overflow the stack.
inline std::size_t json_depth(std::string_view text) {
  std::size_t depth = 0, deepest = 0;
  bool in_string = false, escaped = false;
  for (const char c : text) {
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (c == '\\') {
        escaped = true;
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      deepest = std::max(deepest, ++depth);
    } else if ((c == ']' || c == '}') && depth > 0) {
      --depth;
    } else if (c == '\n') {
      depth = 0;  // JSON Lines: each line stands alone (a string cannot hold a raw newline)
      in_string = false;
    }
  }
  return deepest;
}

}  // namespace capalloc::trace

#endif  // CAPALLOC_TOOLS_TRACE_JSON_ERROR_HPP_
