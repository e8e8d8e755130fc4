// common/config.hpp: every CAPALLOC_* environment variable, in one table, read
// with one policy.
//
// The policy: an unset or empty variable means its default; any other value
// must be one the table accepts, else the read is kInvalidArgument with a
// message that names the variable, the value given and what is accepted.
// Numbers are checked whole: no sign, no spaces, no trailing characters, no
// overflow. Nothing here falls back to a default on a bad value, and nothing
// here logs: the caller reports the error (from_env functions return it, the
// C ABI fails its start with it, the CLI exits with it).
//
// The README's configuration table lists the same variables; a test
// (tests/config_test.cpp) checks that it names each one with its default and
// accepted values. The `capalloc` CLI validates its flags against the same
// entries (tools/cli_settings.cpp), so a flag accepts what its variable does.
#ifndef CAPALLOC_COMMON_CONFIG_HPP_
#define CAPALLOC_COMMON_CONFIG_HPP_

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace capalloc::config {

// The variables, in table order.
enum class Var {
  kRuntime,
  kRoundGranularity,
  kCaptureGuardScope,
  kStrict,
  kLogLevel,
  kLibrary,
  kBackendPath,
  kCublasLibrary,
  kOraclePrograms,
  kOracleSeed,
  kOracleFirst,
  kStacks,
  kTrace,
  kTorchReplay,
};

enum class Kind {
  kChoice,  // one of `choices`, spelled exactly
  kNumber,  // a decimal integer in [min, max], a power of two if `power_of_two`
  kPath,    // any text (a file name)
};

struct Variable {
  Var id;
  std::string_view name;
  Kind kind;
  std::span<const std::string_view> choices;  // kChoice
  std::uint64_t min = 0;                      // kNumber, inclusive
  std::uint64_t max = 0;                      // kNumber, inclusive
  bool power_of_two = false;                  // kNumber
  std::string_view unit;                      // kNumber: "bytes", or empty
  std::string_view default_value;             // what unset or empty means (empty: no default)
  std::string_view meaning;
  std::string_view read_by;                   // who reads it
};

// Every CAPALLOC_* variable capalloc and its tools read, in the order of Var.
std::span<const Variable> variables();
const Variable& variable(Var id);

// What `v` accepts, in words: "one of auto, host, cuda, hip",
// "a power of two from 256 to 2097152 (bytes)", "a file path".
std::string accepted(const Variable& v);

// Why `text` is not a value of `v` ("is not a power of two", "is negative",
// ...), or empty when it is one. The CLI's validators use it for flags.
std::string problem(const Variable& v, std::string_view text);

// `text` checked as a value of `v`: kInvalidArgument
// "CAPALLOC_X='text' <problem>; accepted: <accepted>" when it is not one.
absl::Status check(const Variable& v, std::string_view text);
absl::StatusOr<std::uint64_t> parse_number(const Variable& v, std::string_view text);

// Whether the variable is set to a non-empty value in the environment.
bool is_set(Var id);
// Its raw value, empty when unset.
std::string raw(Var id);

// The environment's value, checked, or the default when unset or empty.
// get_choice and get_text return the value's text; get_number requires a
// kNumber variable (kInvalidArgument otherwise, as for a wrong kind).
absl::StatusOr<std::string> get_choice(Var id);
absl::StatusOr<std::uint64_t> get_number(Var id);
std::string get_text(Var id);

}  // namespace capalloc::config

#endif  // CAPALLOC_COMMON_CONFIG_HPP_
