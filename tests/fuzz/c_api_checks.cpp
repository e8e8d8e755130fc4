// tests/fuzz/c_api_checks.cpp: the C ABI fuzzer's checks of every call
// (tests/fuzz/c_api_fuzzer.cpp): the status and last error each call
// promises, JSON answers that parse, and the trace of FUZZ_TRACE=1.
#include <cstdarg>
#include <cstdio>
#include <cstring>

#include "c_api_fuzzer.hpp"
#include "capalloc/capalloc.h"
#include "nlohmann/json.hpp"

namespace capalloc::fuzz {
namespace {

const char* status_name(capalloc_status s) {
  switch (s) {
    case CAPALLOC_OK:
      return "OK";
    case CAPALLOC_ERROR_INVALID_ARGUMENT:
      return "INVALID_ARGUMENT";
    case CAPALLOC_ERROR_OUT_OF_MEMORY:
      return "OUT_OF_MEMORY";
    case CAPALLOC_ERROR_NOT_FOUND:
      return "NOT_FOUND";
    case CAPALLOC_ERROR_FAILED_PRECONDITION:
      return "FAILED_PRECONDITION";
    case CAPALLOC_ERROR_UNAVAILABLE:
      return "UNAVAILABLE";
    case CAPALLOC_ERROR_INTERNAL:
      return "INTERNAL";
  }
  return "(not a capalloc_status)";
}

}  // namespace

[[noreturn]] __attribute__((format(printf, 1, 2))) void die(const char* fmt, ...) {
  std::fprintf(stderr, "\nc_api_fuzzer: INVARIANT VIOLATED: ");
  va_list args;
  va_start(args, fmt);
  std::vfprintf(stderr, fmt, args);
  va_end(args);
  std::fprintf(stderr, "\n  (last error: \"%s\")\n", capalloc_last_error());
  std::fflush(stderr);
  __builtin_trap();
}

// FUZZ_TRACE=1 prints every call and its status: for reading a
// crashing input (run the fuzzer binary on the file alone).
bool g_trace = false;

__attribute__((format(printf, 1, 2))) void tracef(const char* fmt, ...) {
  if (!g_trace) return;
  va_list args;
  va_start(args, fmt);
  std::fprintf(stderr, "    ");
  std::vfprintf(stderr, fmt, args);
  std::fprintf(stderr, "\n");
  va_end(args);
}

// Checks what every status-returning call promises: a known code, an empty
// last error on success and a message on failure; then `expect`.
capalloc_status checked(capalloc_status s, Expect expect, const char* what) {
  const char* err = capalloc_last_error();
  if (g_trace) {
    std::fprintf(stderr, "  %s -> %s%s%s\n", what, status_name(s), s == CAPALLOC_OK ? "" : ": ",
                 err == nullptr ? "(null)" : err);
  }
  if (err == nullptr) die("%s: capalloc_last_error() returned NULL", what);
  const std::size_t len = std::strlen(err);
  switch (s) {
    case CAPALLOC_OK:
      if (len != 0) die("%s succeeded but left last error \"%s\"", what, err);
      break;
    case CAPALLOC_ERROR_INVALID_ARGUMENT:
    case CAPALLOC_ERROR_OUT_OF_MEMORY:
    case CAPALLOC_ERROR_NOT_FOUND:
    case CAPALLOC_ERROR_FAILED_PRECONDITION:
    case CAPALLOC_ERROR_UNAVAILABLE:
      if (len == 0) die("%s failed (%s) with an empty last error", what, status_name(s));
      break;
    case CAPALLOC_ERROR_INTERNAL:
      // An internal error is a bug in capalloc by definition (an exception,
      // an impossible state).
      die("%s: CAPALLOC_ERROR_INTERNAL", what);
    default:
      die("%s returned %d, not a capalloc_status", what, static_cast<int>(s));
  }
  if (expect == Expect::kOk && s != CAPALLOC_OK) {
    die("%s failed (%s) where it must succeed", what, status_name(s));
  }
  if (expect == Expect::kError && s == CAPALLOC_OK) {
    die("%s succeeded where the ABI documents an error", what);
  }
  return s;
}

void require_json(const char* json, const char* what, bool array) {
  if (json == nullptr) die("%s: JSON pointer left NULL", what);
  tracef("%s JSON: %.300s", what, json);
  const auto parsed = nlohmann::json::parse(json, nullptr, /*allow_exceptions=*/false);
  if (parsed.is_discarded()) die("%s returned text that is not JSON: %.400s", what, json);
  if (array && !parsed.is_array()) die("%s returned JSON that is not an array: %.400s", what, json);
  if (!array && !parsed.is_object()) die("%s returned JSON that is not an object", what);
}

}  // namespace capalloc::fuzz
