// tools/trace/json_error.hpp: why a line of a trace is not JSON, for the
// readers' messages (`capalloc bench`, `audit --trace`, `report`).
#ifndef CAPALLOC_TOOLS_TRACE_JSON_ERROR_HPP_
#define CAPALLOC_TOOLS_TRACE_JSON_ERROR_HPP_

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

}  // namespace capalloc::trace

#endif  // CAPALLOC_TOOLS_TRACE_JSON_ERROR_HPP_
