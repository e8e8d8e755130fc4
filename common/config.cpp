// common/config.cpp: the CAPALLOC_* table and its one reading policy (see
// config.hpp).
#include "common/config.hpp"

#include <array>
#include <bit>
#include <charconv>
#include <cstdlib>
#include <limits>
#include <system_error>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"

namespace capalloc::config {

namespace {

constexpr std::string_view kRuntimes[] = {"auto", "host", "cuda", "hip"};
constexpr std::string_view kScopes[] = {"device", "stream"};
constexpr std::string_view kStrictModes[] = {"0", "1", "possible"};
constexpr std::string_view kOnOff[] = {"0", "1"};
constexpr std::string_view kLogLevels[] = {"trace", "debug", "info", "warn", "error", "off"};

// A bound that keeps `first + programs` of the oracle far from overflow.
constexpr std::uint64_t kOracleLimit = 1'000'000'000'000;

constexpr std::array<Variable, 14> kTable = {{
    {.id = Var::kRuntime,
     .name = "CAPALLOC_RUNTIME",
     .kind = Kind::kChoice,
     .choices = kRuntimes,
     .default_value = "auto",
     .meaning = "the runtime of the process-wide allocator behind the C ABI (the PyTorch "
                "plug-in, the Python module) and of the CLI; `auto`: a GPU runtime when a "
                "device is present, else `host`",
     .read_by = "C ABI, CLI (`--runtime`)"},
    {.id = Var::kRoundGranularity,
     .name = "CAPALLOC_ROUND_GRANULARITY",
     .kind = Kind::kNumber,
     .min = 256,
     .max = std::uint64_t{2} << 20,
     .power_of_two = true,
     .unit = "bytes",
     .default_value = "512",
     .meaning = "bytes that sizes round up to and blocks align to; at most 2 MiB, the small "
                "segment size, which it must divide",
     .read_by = "`AllocatorOptions::from_env`: C ABI, CLI (`--round-granularity`)"},
    {.id = Var::kCaptureGuardScope,
     .name = "CAPALLOC_CAPTURE_GUARD_SCOPE",
     .kind = Kind::kChoice,
     .choices = kScopes,
     .default_value = "device",
     .meaning = "`device`: refuse persistent requests while any capture is active on the "
                "device; `stream`: only while the requesting stream captures",
     .read_by = "`AllocatorOptions::from_env`: C ABI, CLI (`--capture-guard-scope`)"},
    {.id = Var::kStrict,
     .name = "CAPALLOC_STRICT",
     .kind = Kind::kChoice,
     .choices = kStrictModes,
     .default_value = "0",
     .meaning = "`1`: the replay guard refuses graphs with hazard findings; `possible`: also "
                "those with `possible` findings (footprint evidence); `0`: it logs them",
     .read_by = "`TrackerOptions::from_env`: C ABI, CLI (`--strict`)"},
    {.id = Var::kLogLevel,
     .name = "CAPALLOC_LOG_LEVEL",
     .kind = Kind::kChoice,
     .choices = kLogLevels,
     .default_value = "warn",
     .meaning = "the library's log level (`warn`: findings and errors only; the CLI's own "
                "default is `error`, since it prints findings itself)",
     .read_by = "`log_level_from_env`: the logger, C ABI, CLI (`--log-level`)"},
    {.id = Var::kLibrary,
     .name = "CAPALLOC_LIBRARY",
     .kind = Kind::kPath,
     .meaning = "the `libcapalloc.so` the Python package loads when `install()` or `load()` is "
                "given no path; a path that names no file is an error (unset: the install "
                "prefix's `lib/libcapalloc.so`, then the loader's)",
     .read_by = "`python/capalloc`"},
    {.id = Var::kBackendPath,
     .name = "CAPALLOC_BACKEND_PATH",
     .kind = Kind::kPath,
     .meaning = "colon-separated directories where the GPU backend and scenario plugins "
                "(`libcapalloc_backend_cuda.so`, ...) are looked for; when set, nowhere else "
                "(unset: the directory that holds `libcapalloc.so`)",
     .read_by = "`make_runtime` (libcapalloc)"},
    {.id = Var::kCublasLibrary,
     .name = "CAPALLOC_CUBLAS_LIBRARY",
     .kind = Kind::kPath,
     .default_value = "libcublas.so.13",
     .meaning = "the cuBLAS library the GEMM benchmark loads with dlopen",
     .read_by = "`capalloc_bench_gemm_cuda`"},
    {.id = Var::kOraclePrograms,
     .name = "CAPALLOC_ORACLE_PROGRAMS",
     .kind = Kind::kNumber,
     .min = 1,
     .max = kOracleLimit,
     .default_value = "10000",
     .meaning = "how many random capture programs the differential oracle checks",
     .read_by = "`oracle_property_test`"},
    {.id = Var::kOracleSeed,
     .name = "CAPALLOC_ORACLE_SEED",
     .kind = Kind::kNumber,
     .min = 0,
     .max = std::numeric_limits<std::uint64_t>::max(),
     .default_value = "1",
     .meaning = "the oracle's seed",
     .read_by = "`oracle_property_test`"},
    {.id = Var::kOracleFirst,
     .name = "CAPALLOC_ORACLE_FIRST",
     .kind = Kind::kNumber,
     .min = 0,
     .max = kOracleLimit,
     .default_value = "0",
     .meaning = "the oracle's first program number (to rerun one failure)",
     .read_by = "`oracle_property_test`"},
    {.id = Var::kStacks,
     .name = "CAPALLOC_STACKS",
     .kind = Kind::kChoice,
     .choices = kOnOff,
     .default_value = "0",
     .meaning = "`1`: record each allocation's call stack for the retention audit "
                "(`live_since`), at the cost of one unwind per allocation",
     .read_by = "`AllocatorOptions::from_env`: C ABI, CLI"},
    {.id = Var::kTrace,
     .name = "CAPALLOC_TRACE",
     .kind = Kind::kPath,
     .meaning = "write the event trace (`docs/trace.md`) of each allocator created from the "
                "environment to this file (a second allocator of the process: `path.2`, ...)",
     .read_by = "`AllocatorOptions::from_env`: C ABI, CLI"},
    {.id = Var::kTorchReplay,
     .name = "CAPALLOC_TORCH_REPLAY",
     .kind = Kind::kPath,
     .meaning = "the script `capalloc bench` replays traces through PyTorch's caching allocator "
                "with (unset: the source tree's `tools/trace/torch_replay.py`)",
     .read_by = "`capalloc bench` (its `torch` column)"},
}};

constexpr bool table_in_enum_order() {
  for (std::size_t i = 0; i < kTable.size(); ++i) {
    if (static_cast<std::size_t>(kTable[i].id) != i) return false;
  }
  return true;
}
static_assert(table_in_enum_order(), "kTable must list the variables in the order of Var");

// The unchecked number: no sign, digits only, no overflow.
std::string number_problem(std::string_view text, std::uint64_t& out) {
  if (text.empty()) return "is empty";
  if (text.front() == '-') return "is negative";
  const char* const end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data(), end, out, 10);
  if (ec == std::errc::result_out_of_range) return "is too large";
  if (ec != std::errc() || ptr != end) return "is not a whole decimal number";
  return {};
}

}  // namespace

std::span<const Variable> variables() { return kTable; }

const Variable& variable(Var id) { return kTable[static_cast<std::size_t>(id)]; }

std::string accepted(const Variable& v) {
  switch (v.kind) {
    case Kind::kChoice: {
      std::string s = "one of ";
      for (std::size_t i = 0; i < v.choices.size(); ++i) {
        if (i > 0) s += ", ";
        s += v.choices[i];
      }
      return s;
    }
    case Kind::kNumber: {
      std::string s = absl::StrCat(v.power_of_two ? "a power of two" : "an integer", " from ",
                                   v.min, " to ", v.max);
      if (!v.unit.empty()) absl::StrAppend(&s, " (", std::string(v.unit), ")");
      return s;
    }
    case Kind::kPath:
      return "a file path";
  }
  return {};
}

std::string problem(const Variable& v, std::string_view text) {
  switch (v.kind) {
    case Kind::kChoice:
      for (std::string_view c : v.choices) {
        if (text == c) return {};
      }
      return "is not an accepted value";
    case Kind::kNumber: {
      std::uint64_t n = 0;
      if (std::string p = number_problem(text, n); !p.empty()) return p;
      if (n < v.min) return "is too small";
      if (n > v.max) return "is too large";
      if (v.power_of_two && !std::has_single_bit(n)) return "is not a power of two";
      return {};
    }
    case Kind::kPath:
      return {};
  }
  return {};
}

absl::Status check(const Variable& v, std::string_view text) {
  const std::string p = problem(v, text);
  if (p.empty()) return absl::OkStatus();
  // The value is the caller's bytes: escaped, so that a stray newline or
  // control character shows in the message instead of acting on the terminal.
  return absl::InvalidArgumentError(absl::StrCat(std::string(v.name), "='", absl::CHexEscape(absl::string_view(text.data(), text.size())),
                                                 "' ", p, "; accepted: ", accepted(v)));
}

absl::StatusOr<std::uint64_t> parse_number(const Variable& v, std::string_view text) {
  if (v.kind != Kind::kNumber) {
    return absl::InvalidArgumentError(absl::StrCat(std::string(v.name), " is not a number"));
  }
  if (absl::Status s = check(v, text); !s.ok()) return s;
  std::uint64_t n = 0;
  number_problem(text, n);
  return n;
}

std::string raw(Var id) {
  const char* value = std::getenv(std::string(variable(id).name).c_str());
  return value != nullptr ? std::string(value) : std::string();
}

bool is_set(Var id) { return !raw(id).empty(); }

absl::StatusOr<std::string> get_choice(Var id) {
  const Variable& v = variable(id);
  std::string value = raw(id);
  if (value.empty()) return std::string(v.default_value);
  if (absl::Status s = check(v, value); !s.ok()) return s;
  return value;
}

absl::StatusOr<std::uint64_t> get_number(Var id) {
  const Variable& v = variable(id);
  const std::string value = raw(id);
  return parse_number(v, value.empty() ? v.default_value : std::string_view(value));
}

std::string get_text(Var id) {
  std::string value = raw(id);
  return value.empty() ? std::string(variable(id).default_value) : value;
}

}  // namespace capalloc::config
