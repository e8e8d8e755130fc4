// tools/terminal_text.hpp: text from the program's inputs (tags, sites,
// stack frames: the caller's bytes) made safe to print on a terminal.
//
// A tag may hold any bytes: a newline would forge a line of the report, an
// ESC start a terminal control sequence. terminal_text() keeps printable
// UTF-8 as it is and writes everything else as an escape: \n, \r, \t, \\,
// \xNN for other control bytes (C0, DEL) and for bytes that are not valid
// UTF-8, \uNNNN for the C1 controls (U+0080..U+009F), the line and
// paragraph separators and the bidirectional formatting characters (which
// reorder what a terminal shows). JSON output needs none of this: its
// writer escapes strings itself.
#ifndef CAPALLOC_TOOLS_TERMINAL_TEXT_HPP_
#define CAPALLOC_TOOLS_TERMINAL_TEXT_HPP_

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/strings/str_format.h"

namespace capalloc::cli {

namespace terminal_text_detail {

// The length of the valid UTF-8 sequence at s[i] and its code point; 0 when
// the bytes there are not one.
inline int utf8_sequence(std::string_view s, std::size_t i, std::uint32_t* code) {
  const auto byte = [&](std::size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char b0 = byte(i);
  int length = 0;
  std::uint32_t c = 0;
  if (b0 >= 0xc2 && b0 <= 0xdf) {
    length = 2;
    c = b0 & 0x1f;
  } else if (b0 >= 0xe0 && b0 <= 0xef) {
    length = 3;
    c = b0 & 0x0f;
  } else if (b0 >= 0xf0 && b0 <= 0xf4) {
    length = 4;
    c = b0 & 0x07;
  } else {
    return 0;
  }
  if (i + length > s.size()) return 0;
  for (int k = 1; k < length; ++k) {
    if ((byte(i + k) & 0xc0) != 0x80) return 0;
    c = (c << 6) | (byte(i + k) & 0x3f);
  }
  // Overlong forms, surrogates and values beyond U+10FFFF are not UTF-8.
  if ((length == 3 && c < 0x800) || (length == 4 && (c < 0x10000 || c > 0x10ffff)) ||
      (c >= 0xd800 && c <= 0xdfff)) {
    return 0;
  }
  *code = c;
  return length;
}

inline bool shown_escaped(std::uint32_t c) {
  return (c >= 0x80 && c <= 0x9f) || c == 0x2028 || c == 0x2029 || c == 0x200e ||
         c == 0x200f || (c >= 0x202a && c <= 0x202e) || (c >= 0x2066 && c <= 0x2069);
}

}  // namespace terminal_text_detail

inline std::string terminal_text(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (std::size_t i = 0; i < s.size();) {
    const auto b = static_cast<unsigned char>(s[i]);
    if (b >= 0x20 && b < 0x7f) {
      if (b == '\\') out += '\\';
      out += static_cast<char>(b);
      ++i;
      continue;
    }
    switch (b) {
      case '\n': out += "\\n"; ++i; continue;
      case '\r': out += "\\r"; ++i; continue;
      case '\t': out += "\\t"; ++i; continue;
      default: break;
    }
    std::uint32_t code = 0;
    const int length = b >= 0x80 ? terminal_text_detail::utf8_sequence(s, i, &code) : 0;
    if (length == 0) {
      absl::StrAppendFormat(&out, "\\x%02x", b);
      ++i;
    } else if (terminal_text_detail::shown_escaped(code)) {
      absl::StrAppendFormat(&out, "\\u%04x", code);
      i += length;
    } else {
      out.append(s.substr(i, length));
      i += length;
    }
  }
  return out;
}

}  // namespace capalloc::cli

#endif  // CAPALLOC_TOOLS_TERMINAL_TEXT_HPP_
