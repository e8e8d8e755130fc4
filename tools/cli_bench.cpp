// tools/cli_bench.cpp: `capalloc bench TRACE... [--json] [--repetitions N]
// [--allocators LIST] [--callgrind]`, trace replays side by side
// (docs/performance.md).
//
// Each replay runs in a child process, the hidden `capalloc bench-replay`
// (tools/trace/replay.hpp): capalloc through its C ABI on the host runtime,
// the naive baseline, and glibc's malloc or one preloaded into the child
// (LD_PRELOAD) so that it is the whole process's malloc. A repetition is a
// round: one fresh child per allocator, in an order rotated each round, each
// doing a warm-up pass and one measured pass. Figures per trace and
// allocator:
//   ns/op median  the median over rounds of the median batch of the round's
//                 measured pass (a batch: 256 consecutive alloc/free
//                 operations, its time over its operations); robust to the
//                 preemptions of a shared machine, which hit few batches
//   ns/op p99     the 99th percentile of the batches of every round
//   mean          the median over rounds of the pass's time over its
//                 operations (every preemption included)
//   cpu           the same with the replaying thread's CPU time
//                 (CLOCK_THREAD_CPUTIME_ID), which preemption does not add to
//   vs capalloc   the median over rounds of (this allocator's batch median) /
//                 (capalloc's in the same round)
//   peak reserved / peak requested: capalloc's reserved_bytes_peak (its
//                 stats) and the naive baseline's page-rounded live bytes,
//                 over the trace's own peak of live bytes; n/a for mallocs.
// A trace with captures runs through capalloc only, which reports its cost
// inside against outside captures and what the capture events took.
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <thread>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_join.h"
#include "common/config.hpp"
#include "tools/cli.hpp"
#include "tools/cli_bench.hpp"
#include "tools/trace/cuda_async_backend.hpp"
#include "tools/trace/replay.hpp"

#ifndef CAPALLOC_LIBRARY_ARCHITECTURE
#define CAPALLOC_LIBRARY_ARCHITECTURE ""
#endif
#ifndef CAPALLOC_BUILD_TYPE
#define CAPALLOC_BUILD_TYPE ""
#endif

namespace capalloc::cli::bench {

using Json = nlohmann::ordered_json;

namespace {

// The GPU allocators: whether this machine can run them, and how.
AllocatorSetup setup_gpu_allocator(AllocatorSetup setup) {
  setup.gpu = true;
  if (setup.name == "capalloc-cuda") {
    setup.runtime = "cuda";
    auto runtime = make_runtime("cuda");
    if (!runtime.ok()) {
      setup.unavailable = absl::StrCat("no CUDA device: ", runtime.status().message());
    } else if ((*runtime)->device_count() == 0) {
      setup.unavailable = "no CUDA device";
    }
  } else if (setup.name == "cudaMallocAsync") {
    setup.unavailable = trace::CudaAsyncBackend::available();
  } else if (setup.name == "torch") {
    // The source tree's script, unless CAPALLOC_TORCH_REPLAY names another
    // (the GPU bundle's check runs from a copy of the tree elsewhere).
    const std::string script = config::is_set(config::Var::kTorchReplay)
                                   ? config::get_text(config::Var::kTorchReplay)
                                   : std::string(CAPALLOC_TORCH_REPLAY);
    setup.command = {"python3", script};
    if (access(script.c_str(), R_OK) != 0) {
      setup.unavailable = absl::StrCat(script, " not found");
    } else {
      auto check = trace::run_child({"python3", script, "--check"}, {});
      if (!check.ok()) {
        setup.unavailable = std::string(check.status().message());
      } else if (check->exit_code != 0) {
        setup.unavailable = std::string(absl::StripAsciiWhitespace(check->err));
      }
    }
  }
  return setup;
}

}  // namespace

AllocatorSetup setup_allocator(const std::string& name) {
  AllocatorSetup setup{.name = name};
  if (name == "capalloc-cuda" || name == "cudaMallocAsync" || name == "torch") {
    return setup_gpu_allocator(std::move(setup));
  }
  static const std::map<std::string, std::string> kLibraries = {
      {"jemalloc", "libjemalloc.so.2"},
      {"mimalloc", "libmimalloc.so.2"},
      {"tcmalloc", "libtcmalloc_minimal.so.4"}};
  setup.host_malloc = name != "capalloc" && name != "naive";
  const auto library = kLibraries.find(name);
  if (library == kLibraries.end()) return setup;
  std::vector<std::string> dirs;
  if (std::string(CAPALLOC_LIBRARY_ARCHITECTURE).size() > 0) {
    dirs.push_back(absl::StrCat("/usr/lib/", CAPALLOC_LIBRARY_ARCHITECTURE));
  }
  for (const char* dir : {"/usr/lib64", "/usr/lib", "/usr/local/lib"}) dirs.push_back(dir);
  for (const std::string& dir : dirs) {
    const std::string path = absl::StrCat(dir, "/", library->second);
    if (access(path.c_str(), R_OK) == 0) {
      setup.preload = path;
      return setup;
    }
  }
  setup.unavailable = absl::StrCat(library->second, " not found in ", absl::StrJoin(dirs, ", "),
                                   " (scripts/install-deps.sh installs it)");
  return setup;
}

absl::StatusOr<std::string> run_replay_child(const AllocatorSetup& allocator,
                                             const std::string& trace_path, bool counted,
                                             const std::vector<std::string>& wrapper) {
  // The child gets the path whole: a relative one beginning with '-' would
  // read as an option there.
  std::error_code ec;
  const std::filesystem::path absolute = std::filesystem::absolute(trace_path, ec);
  const std::string child_path = ec ? trace_path : absolute.string();
  std::vector<std::string> argv = wrapper;
  if (!allocator.command.empty()) {
    argv.insert(argv.end(), allocator.command.begin(), allocator.command.end());
    argv.push_back(child_path);
  } else {
    for (const std::string& a : {trace::self_executable(), std::string("bench-replay"), child_path,
                                 std::string("--allocator"), allocator.name}) {
      argv.push_back(a);
    }
    if (counted) argv.push_back("--counted");
  }
  std::map<std::string, std::optional<std::string>> env = {
      {"CAPALLOC_RUNTIME", allocator.runtime},
      {"CAPALLOC_LOG_LEVEL", "error"},
      {"LD_PRELOAD", std::nullopt},
      // tcmalloc reports every allocation over 1 GiB on stderr otherwise.
      {"TCMALLOC_LARGE_ALLOC_REPORT_THRESHOLD", "1099511627776"}};
  if (!allocator.preload.empty()) env["LD_PRELOAD"] = allocator.preload;
  auto child = trace::run_child(argv, env);
  if (!child.ok()) return child.status();
  const std::string where = absl::StrCat(allocator.name, " on ", trace_path);
  if (child->exit_code != 0) {
    return absl::InternalError(absl::StrCat(where, ": the replay exited with ", child->exit_code,
                                            ": ", child->err));
  }
  const std::size_t start = child->out.rfind("\n{");
  const std::string line = child->out.substr(start == std::string::npos ? 0 : start + 1);
  const Json result = Json::parse(line, nullptr, false);
  if (result.is_discarded() || !result.is_object()) {
    return absl::InternalError(absl::StrCat(where, ": the replay printed no result: ", child->out,
                                            child->err));
  }
  // The replay must have run on the allocator it is reported for.
  const std::string library = result.value("malloc_library", "");
  const std::string expected = !allocator.preload.empty() ? allocator.preload
                               : allocator.host_malloc   ? std::string("libc.so")
                                                         : std::string();
  if (!expected.empty() && library.find(expected) == std::string::npos) {
    return absl::InternalError(absl::StrCat(where, ": malloc came from ", library, ", not ", expected));
  }
  return line;
}

namespace {

double percentile(std::vector<double> values, double p) {
  if (values.empty()) return std::nan("");
  std::sort(values.begin(), values.end());
  const auto rank = static_cast<std::size_t>(std::ceil(p / 100.0 * static_cast<double>(values.size())));
  return values[std::min(values.size() - 1, rank == 0 ? 0 : rank - 1)];
}
double median(const std::vector<double>& values) {
  if (values.empty()) return std::nan("");
  std::vector<double> v = values;
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

// What the rounds of one allocator on one trace measured.
struct Runs {
  AllocatorSetup setup;
  std::string skipped;  // why it does not run on this trace ("" when it does)
  std::string error;
  std::vector<double> ns_per_op;  // per round: the median batch
  std::vector<double> mean;       // per round: the pass's time over its operations
  std::vector<double> cpu;        // per round: the pass's CPU time over its operations
  std::vector<double> batches;    // every round's batch means, pooled
  std::vector<double> inside, outside, capture_begin_ms, capture_end_ms, replay_us, destroy_ms;
  std::int64_t peak_reserved = -1;
  std::string malloc_library;
  Json pools = Json::array();
};

void absorb(Runs& runs, const Json& result) {
  const Json& pass = result["pass"];
  const double ops_out = pass["ops_outside"].get<double>(), ops_in = pass["ops_inside"].get<double>();
  const double ns_out = pass["ns_outside"].get<double>(), ns_in = pass["ns_inside"].get<double>();
  runs.mean.push_back((ns_out + ns_in) / std::max(1.0, ops_out + ops_in));
  runs.cpu.push_back(pass["cpu_ns"].get<double>() / std::max(1.0, ops_out + ops_in));
  std::vector<double> round_batches;
  for (const Json& b : pass["batch_ns_per_op"]) round_batches.push_back(b.get<double>());
  runs.ns_per_op.push_back(median(round_batches));
  if (ops_in > 0) runs.inside.push_back(ns_in / ops_in);
  if (ops_out > 0) runs.outside.push_back(ns_out / ops_out);
  auto per = [&](const char* event, double scale, std::vector<double>& into) {
    const Json& cost = pass[event];
    if (cost["count"].get<double>() > 0) into.push_back(cost["ns"].get<double>() / scale);
  };
  per("capture_begin", 1e6, runs.capture_begin_ms);
  per("capture_end", 1e6, runs.capture_end_ms);
  per("graph_destroy", 1e6, runs.destroy_ms);
  if (pass["replay"]["count"].get<double>() > 0) {
    runs.replay_us.push_back(pass["replay"]["ns"].get<double>() / 1e3 /
                             pass["replay"]["count"].get<double>());
  }
  for (const Json& b : pass["batch_ns_per_op"]) runs.batches.push_back(b.get<double>());
  if (result.contains("stats")) {
    runs.peak_reserved =
        std::max(runs.peak_reserved, result["stats"]["reserved_bytes_peak"].get<std::int64_t>());
  }
  if (result.contains("pools")) runs.pools = result["pools"];
  runs.malloc_library = result.value("malloc_library", "");
}

// A progress bar on stderr, only when stderr is a terminal.
class Progress {
 public:
  explicit Progress(std::size_t total) : total_(total), shown_(isatty(STDERR_FILENO) && total > 1) {}
  void step(const std::string& what) {
    if (!shown_) return;
    constexpr int kWidth = 30;
    const int filled = static_cast<int>(kWidth * done_ / total_);
    std::fprintf(stderr, "\r\033[Kcapalloc bench [%s%s] %zu/%zu %s", std::string(filled, '#').c_str(),
                 std::string(kWidth - filled, '.').c_str(), done_, total_, what.c_str());
    std::fflush(stderr);
    ++done_;
  }
  ~Progress() {
    if (shown_) std::fprintf(stderr, "\r\033[K");
  }

 private:
  std::size_t total_, done_ = 0;
  bool shown_;
};

std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0) {
      const std::size_t colon = line.find(':');
      if (colon != std::string::npos) return line.substr(line.find_first_not_of(' ', colon + 1));
    }
  }
  return "unknown";
}

Json machine_json() {
  return {{"nproc", sysconf(_SC_NPROCESSORS_ONLN)}, {"cpu", cpu_model()},
          {"compiler", __VERSION__}, {"build_type", CAPALLOC_BUILD_TYPE}};
}

Json number_or_null(double v) { return std::isfinite(v) ? Json(v) : Json(nullptr); }

std::string fmt(double v, int decimals = 1) {
  return std::isfinite(v) ? absl::StrFormat("%.*f", decimals, v) : std::string("n/a");
}

std::string bytes_text(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (bytes >= 1024 && u < 4) {
    bytes /= 1024;
    ++u;
  }
  return absl::StrFormat("%.2f %s", bytes, units[u]);
}


struct BenchFlags {
  std::vector<std::string> traces;
  std::vector<std::string> allocators = kAllocators;
  int repetitions = 5;
  bool json = false;
  bool callgrind = false;
};

// The rounds of every allocator on one trace.
std::vector<Runs> measure(const std::string& path, const trace::Trace& trace,
                          const std::vector<std::string>& allocators, int repetitions,
                          Progress& progress) {
  std::vector<Runs> all;
  for (const std::string& name : allocators) {
    Runs runs{.setup = setup_allocator(name)};
    if (!runs.setup.unavailable.empty()) {
      runs.skipped = runs.setup.unavailable;
    } else if (trace.has_captures() && name != "capalloc") {
      runs.skipped = "a trace with captures replays through capalloc only";
    }
    all.push_back(std::move(runs));
  }
  for (int round = 0; round < repetitions; ++round) {
    for (std::size_t k = 0; k < all.size(); ++k) {
      Runs& runs = all[(k + static_cast<std::size_t>(round)) % all.size()];
      if (!runs.skipped.empty() || !runs.error.empty()) continue;
      progress.step(absl::StrCat(trace.name.substr(trace.name.rfind('/') + 1), " ", runs.setup.name));
      auto line = run_replay_child(runs.setup, path, /*counted=*/false, {});
      if (!line.ok()) {
        runs.error = std::string(line.status().message());
        continue;
      }
      absorb(runs, Json::parse(*line));
    }
  }
  return all;
}

// Median over rounds of this allocator's figure over capalloc's in the same
// round (NaN when either is missing); `figure` is Runs::ns_per_op (batch
// medians) or Runs::cpu.
double ratio_to_capalloc(const Runs& runs, const std::vector<Runs>& all,
                         std::vector<double> Runs::*figure = &Runs::ns_per_op) {
  const Runs* capalloc = nullptr;
  for (const Runs& r : all)
    if (r.setup.name == "capalloc") capalloc = &r;
  if (capalloc == nullptr || (capalloc->*figure).size() != (runs.*figure).size()) return std::nan("");
  std::vector<double> ratios;
  for (std::size_t i = 0; i < (runs.*figure).size(); ++i) {
    ratios.push_back((runs.*figure)[i] / (capalloc->*figure)[i]);
  }
  return median(ratios);
}

// The host malloc with the smallest median of `figure`, and capalloc's ratio
// to it.
void fastest_host(const std::vector<Runs>& all, std::vector<double> Runs::*figure,
                  const char* name_key, const char* ratio_key, Json& summary) {
  const Runs* fastest = nullptr;
  for (const Runs& runs : all) {
    if (!runs.setup.host_malloc || (runs.*figure).empty()) continue;
    if (fastest == nullptr || median(runs.*figure) < median(fastest->*figure)) fastest = &runs;
  }
  if (fastest == nullptr) return;
  summary[name_key] = fastest->setup.name;
  summary[ratio_key] = number_or_null(1.0 / ratio_to_capalloc(*fastest, all, figure));
}

Json trace_json(const std::string& path, const trace::Trace& trace, const std::vector<Runs>& all) {
  Json t = {{"path", path},
            {"source", trace.source},
            {"operations", trace.operations()},
            {"allocs", trace.allocs},
            {"frees", trace.frees},
            {"peak_requested_bytes", trace.peak_requested_bytes},
            {"captures", trace.captures},
            {"replays", trace.replays}};
  Json results = Json::array();
  const double requested = static_cast<double>(trace.peak_requested_bytes);
  for (const Runs& runs : all) {
    Json r = {{"allocator", runs.setup.name}};
    if (!runs.skipped.empty() || !runs.error.empty()) {
      r["status"] = runs.error.empty() ? "skipped" : "failed";
      r["reason"] = runs.error.empty() ? runs.skipped : runs.error;
      results.push_back(r);
      continue;
    }
    const double ns = median(runs.ns_per_op);
    r["status"] = "ok";
    r["malloc_library"] = runs.malloc_library;
    r["repetitions"] = runs.ns_per_op.size();
    r["ns_per_op_median"] = number_or_null(ns);
    r["ns_per_op_p99"] = number_or_null(percentile(runs.batches, 99));
    r["ns_per_op_mean"] = number_or_null(median(runs.mean));
    r["cpu_ns_per_op"] = number_or_null(median(runs.cpu));
    r["ns_per_op_rounds"] = runs.ns_per_op;
    r["time_vs_capalloc"] = number_or_null(ratio_to_capalloc(runs, all));
    if (runs.peak_reserved >= 0) {
      r["peak_reserved_bytes"] = runs.peak_reserved;
      r["peak_reserved_over_requested"] =
          number_or_null(static_cast<double>(runs.peak_reserved) / requested);
    } else {
      r["peak_reserved_bytes"] = nullptr;
      r["peak_reserved_over_requested"] = nullptr;
    }
    if (trace.has_captures()) {
      const double inside = median(runs.inside), outside = median(runs.outside);
      r["captures"] = {{"ns_per_op_inside", number_or_null(inside)},
                       {"ns_per_op_outside", number_or_null(outside)},
                       {"inside_over_outside", number_or_null(inside / outside)},
                       {"capture_begin_ms_total", number_or_null(median(runs.capture_begin_ms))},
                       {"capture_end_ms_total", number_or_null(median(runs.capture_end_ms))},
                       {"replay_us_each", number_or_null(median(runs.replay_us))},
                       {"graph_destroy_ms_total", number_or_null(median(runs.destroy_ms))},
                       {"pools", runs.pools}};
    }
    results.push_back(r);
  }
  t["results"] = results;
  Json summary = Json::object();
  double capalloc_ns = std::nan(""), naive_ratio = std::nan("");
  for (const Runs& runs : all) {
    if (runs.setup.name == "capalloc" && !runs.ns_per_op.empty()) capalloc_ns = median(runs.ns_per_op);
    if (runs.setup.name == "naive" && !runs.ns_per_op.empty()) naive_ratio = ratio_to_capalloc(runs, all);
  }
  fastest_host(all, &Runs::ns_per_op, "fastest_host_allocator", "capalloc_over_fastest", summary);
  fastest_host(all, &Runs::cpu, "fastest_host_allocator_by_cpu", "capalloc_over_fastest_by_cpu",
               summary);
  summary["naive_over_capalloc"] = number_or_null(naive_ratio);
  summary["capalloc_ns_per_op"] = number_or_null(capalloc_ns);
  t["summary"] = summary;
  return t;
}

void print_trace(const Json& t) {
  const std::string source = t["source"].get<std::string>();
  std::printf("\n%s%s: %s operations (%s allocs, %s frees), peak requested %s",
              t["path"].get<std::string>().c_str(),
              source.empty() ? "" : absl::StrCat(" (", source, ")").c_str(),
              std::to_string(t["operations"].get<std::uint64_t>()).c_str(),
              std::to_string(t["allocs"].get<std::uint64_t>()).c_str(),
              std::to_string(t["frees"].get<std::uint64_t>()).c_str(),
              bytes_text(t["peak_requested_bytes"].get<double>()).c_str());
  if (t["captures"].get<std::uint64_t>() > 0) {
    std::printf(", %llu captures, %llu replays",
                static_cast<unsigned long long>(t["captures"].get<std::uint64_t>()),
                static_cast<unsigned long long>(t["replays"].get<std::uint64_t>()));
  }
  std::printf("\n  %-10s %13s %11s %10s %10s %12s %24s\n", "allocator", "ns/op median",
              "ns/op p99", "mean", "cpu", "vs capalloc", "peak reserved/requested");
  auto num = [](const Json& v, int decimals) {
    return v.is_number() ? fmt(v.get<double>(), decimals) : std::string("n/a");
  };
  for (const Json& r : t["results"]) {
    const std::string name = r["allocator"].get<std::string>();
    if (r["status"] != "ok") {
      std::printf("  %-10s %s: %s\n", name.c_str(), r["status"].get<std::string>().c_str(),
                  r["reason"].get<std::string>().c_str());
      continue;
    }
    std::printf("  %-10s %13s %11s %10s %10s %11sx %24s\n", name.c_str(),
                num(r["ns_per_op_median"], 1).c_str(), num(r["ns_per_op_p99"], 1).c_str(),
                num(r["ns_per_op_mean"], 1).c_str(), num(r["cpu_ns_per_op"], 1).c_str(),
                num(r["time_vs_capalloc"], 2).c_str(),
                num(r["peak_reserved_over_requested"], 3).c_str());
    if (r.contains("captures")) {
      const Json& c = r["captures"];
      std::printf("  capalloc inside captures %s ns/op, outside %s ns/op (inside/outside %sx); "
                  "capture_end %s ms in all, capture_begin %s ms, replay %s us each, "
                  "graph_destroy %s ms\n",
                  num(c["ns_per_op_inside"], 1).c_str(), num(c["ns_per_op_outside"], 1).c_str(),
                  num(c["inside_over_outside"], 2).c_str(), num(c["capture_end_ms_total"], 2).c_str(),
                  num(c["capture_begin_ms_total"], 2).c_str(), num(c["replay_us_each"], 2).c_str(),
                  num(c["graph_destroy_ms_total"], 2).c_str());
      for (const Json& pool : c["pools"]) {
        std::printf("  graph pool \"%s\": peak reserved %s\n", pool["name"].get<std::string>().c_str(),
                    bytes_text(pool["reserved_bytes_peak"].get<double>()).c_str());
      }
    }
  }
  const Json& s = t["summary"];
  if (s.contains("fastest_host_allocator")) {
    std::printf("  capalloc / fastest host allocator: %sx by ns/op median (%s), %sx by cpu (%s)\n",
                num(s["capalloc_over_fastest"], 2).c_str(),
                s["fastest_host_allocator"].get<std::string>().c_str(),
                num(s["capalloc_over_fastest_by_cpu"], 2).c_str(),
                s["fastest_host_allocator_by_cpu"].get<std::string>().c_str());
  }
  if (s["naive_over_capalloc"].is_number()) {
    std::printf("  naive / capalloc: %sx\n", num(s["naive_over_capalloc"], 1).c_str());
  }
}

int bench_command(const BenchFlags& flags) {
  std::vector<trace::Trace> traces;
  for (const std::string& path : flags.traces) {
    // Each replay reads the trace again, in a process of its own: a pipe
    // would be empty (or block) for all but the first reader.
    std::error_code ec;
    if (!std::filesystem::is_regular_file(path, ec)) {
      return fail(absl::InvalidArgumentError(absl::StrCat(
          path, ": not a regular file (a pipe or a device?): each allocator's replay reads the "
                "trace again in a process of its own; save it to a file first")));
    }
    auto t = trace::read_trace(path);
    if (!t.ok()) return fail(t.status());
    if (t->operations() == 0) {
      return fail(absl::InvalidArgumentError(absl::StrCat(
          path, ": no alloc or free to replay (a time per operation needs operations)")));
    }
    traces.push_back(*std::move(t));
  }
  if (flags.callgrind) return callgrind_command(flags.traces, traces, flags.allocators, flags.json);
  std::size_t runs_total = 0;
  for (const trace::Trace& t : traces) {
    runs_total += static_cast<std::size_t>(flags.repetitions) *
                  (t.has_captures() ? 1 : flags.allocators.size());
  }
  Json out = {{"format", "capalloc.bench/1"},
              {"repetitions", flags.repetitions},
              {"warmups", 1},
              {"batch_ops", trace::kBatchOps},
              {"machine", machine_json()}};
  Json trace_list = Json::array();
  bool failed = false;
  {
    Progress progress(runs_total);
    for (std::size_t i = 0; i < traces.size(); ++i) {
      const std::vector<Runs> all =
          measure(flags.traces[i], traces[i], flags.allocators, flags.repetitions, progress);
      for (const Runs& runs : all) {
        if (!runs.error.empty()) {
          std::fprintf(stderr, "capalloc bench: %s\n", runs.error.c_str());
          failed = true;
        }
      }
      trace_list.push_back(trace_json(flags.traces[i], traces[i], all));
    }
  }
  out["traces"] = trace_list;
  if (flags.json) {
    std::printf("%s\n", json_text(out, 2).c_str());
  } else {
    const Json& m = out["machine"];
    std::printf("capalloc bench: %d repetition(s), each allocator in a fresh process (a warm-up "
                "pass, then one measured pass); %lld CPUs, %s, %s, %s build\n",
                flags.repetitions, static_cast<long long>(m["nproc"].get<std::int64_t>()),
                m["cpu"].get<std::string>().c_str(), m["compiler"].get<std::string>().c_str(),
                m["build_type"].get<std::string>().c_str());
    std::printf("ns/op median: over repetitions, of each pass's median %u-operation batch; p99: "
                "over the batches of every pass; mean: of each pass's wall time, cpu: of its "
                "thread CPU time, per operation; vs capalloc: median over repetitions of the "
                "ratio of batch medians\n",
                trace::kBatchOps);
    for (const Json& t : out["traces"]) print_trace(t);
  }
  if (std::string(CAPALLOC_BUILD_TYPE) != "Release") {
    std::fprintf(stderr, "capalloc bench: note: this is a %s build; measure a Release build\n",
                 std::string(CAPALLOC_BUILD_TYPE).empty() ? "non-Release" : CAPALLOC_BUILD_TYPE);
  }
  return failed ? 1 : 0;
}

}  // namespace

}  // namespace capalloc::cli::bench

namespace capalloc::cli {

void add_bench_command(CLI::App& app, Runner& run) {
  CLI::App* command = app.add_subcommand(
      "bench", "replays allocation traces (docs/trace.md) through capalloc, a naive baseline "
               "and the host mallocs, side by side (docs/performance.md)");
  auto flags = std::make_shared<bench::BenchFlags>();
  command->add_option("traces", flags->traces, "trace files (capalloc.trace/1, JSON Lines)")
      ->required()
      ->check(CLI::ExistingFile);
  command->add_flag("--json", flags->json, "one JSON document instead of the tables");
  command->add_option("--repetitions", flags->repetitions,
                      "rounds: each allocator replays each trace once per round, in a fresh process")
      ->check(CLI::Range(1, 1000))
      ->capture_default_str();
  // One comma-separated value: a space-separated list would swallow the
  // traces that follow the option.
  command->add_option("--allocators", flags->allocators, "comma-separated, from: capalloc, naive, "
                      "glibc, jemalloc, mimalloc, tcmalloc, capalloc-cuda, cudaMallocAsync, torch")
      ->delimiter(',')
      ->allow_extra_args(false)
      ->check(CLI::IsMember(bench::kAllocators))
      ->capture_default_str();
  command->add_flag("--callgrind", flags->callgrind,
                    "instead of timing: instructions per operation under valgrind --tool=callgrind, "
                    "collecting the measured pass only");
  command->callback([flags, &run] {
    // One row per allocator: a name given twice would measure it twice and
    // print a ratio of capalloc against itself that is not 1.
    for (std::size_t i = 0; i < flags->allocators.size(); ++i) {
      for (std::size_t j = 0; j < i; ++j) {
        if (flags->allocators[i] == flags->allocators[j]) {
          throw CLI::ValidationError("--allocators",
                                     "'" + flags->allocators[i] + "' is named twice");
        }
      }
    }
    run = [flags] { return bench::bench_command(*flags); };
  });

  // The child each replay runs in; not listed in --help.
  CLI::App* replay = app.add_subcommand("bench-replay", "one replay of `capalloc bench`")->group("");
  auto options = std::make_shared<trace::ReplayOptions>();
  replay->add_option("trace", options->trace_path)->required();
  replay->add_option("--allocator", options->allocator)
      ->required()
      ->check(CLI::IsMember(bench::kAllocators));
  replay->add_flag("--counted", options->counted);
  replay->add_option("--warmups", options->warmups)->check(CLI::Range(0, 100));
  replay->callback([options, &run] {
    run = [options] {
      auto result = trace::run_replay(*options);
      if (!result.ok()) return fail(result.status());
      std::printf("%s\n", bench::json_text(*result).c_str());
      return 0;
    };
  });
}

}  // namespace capalloc::cli
