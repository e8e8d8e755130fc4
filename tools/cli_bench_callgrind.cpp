// tools/cli_bench_callgrind.cpp: `capalloc bench --callgrind TRACE...`:
// instructions per operation, which a noisy machine does not disturb.
//
// Each allocator's replay child runs under `valgrind --tool=callgrind
// --toggle-collect=*counted_replay_pass*`: the warm-up pass and all set-up
// run uncollected, and the measured pass is counted without clocks, each
// operation through the out-of-line counted_alloc / counted_free
// (tools/trace/replay.hpp). Reported per allocator:
//   Ir per pair   every instruction of the measured pass (the loop included)
//                 over (alloc + free operations) / 2
//   Ir per alloc  counted_alloc's inclusive cost over the allocations (from
//                 callgrind_annotate --inclusive=yes; the call into it included)
//   Ir per free   likewise, counted_free over the frees
// Instructions in the kernel (mmap, munmap) are not counted by callgrind.
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>

#include <nlohmann/json.hpp>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/strings/ascii.h"
#include "tools/cli.hpp"
#include "tools/cli_bench.hpp"

namespace capalloc::cli::bench {

namespace {

using Json = nlohmann::ordered_json;

// The "totals:" (or "summary:") line of a callgrind output file: Ir.
double callgrind_total(const std::string& file) {
  std::ifstream in(file);
  std::string line;
  double total = std::nan("");
  while (std::getline(in, line)) {
    for (const char* key : {"totals:", "summary:"}) {
      if (line.rfind(key, 0) == 0) {
        double v = 0;
        if (absl::SimpleAtod(absl::StripAsciiWhitespace(line.substr(std::string(key).size())), &v)) {
          total = v;
        }
      }
    }
  }
  return total;
}

// The inclusive Ir of the first function whose line contains `name`, from
// callgrind_annotate's output.
double inclusive_cost(const std::string& annotated, const std::string& name) {
  for (absl::string_view line : absl::StrSplit(annotated, '\n')) {
    if (line.find(name) == absl::string_view::npos) continue;
    line = absl::StripLeadingAsciiWhitespace(line);
    const std::string number = absl::StrReplaceAll(line.substr(0, line.find(' ')), {{",", ""}});
    double v = 0;
    if (absl::SimpleAtod(number, &v)) return v;
  }
  return std::nan("");
}

Json measure_one(const AllocatorSetup& setup, const std::string& path, const trace::Trace& trace,
                 const std::string& dir) {
  Json r = {{"allocator", setup.name}};
  const std::string out_file = absl::StrCat(dir, "/callgrind.", setup.name, ".out");
  auto line = run_replay_child(setup, path, /*counted=*/true,
                               {"valgrind", "--tool=callgrind", "--callgrind-out-file=" + out_file,
                                "--toggle-collect=*counted_replay_pass*"});
  if (!line.ok()) {
    std::remove(out_file.c_str());  // what valgrind wrote before the replay failed
    r["status"] = "failed";
    r["reason"] = std::string(line.status().message());
    return r;
  }
  const double total = callgrind_total(out_file);
  auto annotated = trace::run_child({"callgrind_annotate", "--inclusive=yes", out_file}, {});
  const bool split = annotated.ok() && annotated->exit_code == 0;
  if (!split) {
    r["note"] = absl::StrCat("callgrind_annotate did not run (",
                             absl::StripAsciiWhitespace(annotated.ok()
                                                            ? absl::string_view(annotated->err)
                                                            : annotated.status().message()),
                             "): no split into allocations and frees");
  }
  const std::string text = split ? annotated->out : std::string();
  const double allocs = static_cast<double>(trace.allocs), frees = static_cast<double>(trace.frees);
  auto finite = [](double v) { return std::isfinite(v) ? Json(v) : Json(nullptr); };
  r["status"] = "ok";
  r["instructions"] = finite(total);
  r["ir_per_pair"] = finite(total / (static_cast<double>(trace.operations()) / 2));
  r["ir_per_alloc"] = finite(inclusive_cost(text, "counted_alloc<") / allocs);
  r["ir_per_free"] = finite(inclusive_cost(text, "counted_free<") / frees);
  std::remove(out_file.c_str());
  return r;
}

}  // namespace

int callgrind_command(const std::vector<std::string>& trace_paths,
                      const std::vector<trace::Trace>& traces,
                      const std::vector<std::string>& allocators, bool json) {
  char dir_template[] = "/tmp/capalloc-callgrind-XXXXXX";
  const char* dir = mkdtemp(dir_template);
  if (dir == nullptr) return fail(absl::InternalError("mkdtemp failed"));
  Json out = {{"format", "capalloc.bench.callgrind/1"}, {"traces", Json::array()}};
  bool failed = false;
  for (std::size_t i = 0; i < traces.size(); ++i) {
    const trace::Trace& trace = traces[i];
    Json t = {{"path", trace_paths[i]}, {"operations", trace.operations()},
              {"allocs", trace.allocs}, {"frees", trace.frees}, {"results", Json::array()}};
    double capalloc_pair = std::nan("");
    for (const std::string& name : allocators) {
      const AllocatorSetup setup = setup_allocator(name);
      Json r = {{"allocator", name}};
      if (!setup.unavailable.empty()) {
        r["status"] = "skipped";
        r["reason"] = setup.unavailable;
      } else if (setup.gpu) {
        r["status"] = "skipped";
        r["reason"] = "a GPU allocator: callgrind counts no device work";
      } else if (trace.has_captures() && name != "capalloc") {
        r["status"] = "skipped";
        r["reason"] = "a trace with captures replays through capalloc only";
      } else {
        if (!json) std::fprintf(stderr, "capalloc bench --callgrind: %s on %s\n", name.c_str(), trace_paths[i].c_str());
        r = measure_one(setup, trace_paths[i], trace, dir);
        if (r["status"] == "failed") {
          std::fprintf(stderr, "capalloc bench: %s\n", r["reason"].get<std::string>().c_str());
          failed = true;
        }
        if (name == "capalloc" && r["ir_per_pair"].is_number()) capalloc_pair = r["ir_per_pair"].get<double>();
      }
      t["results"].push_back(r);
    }
    for (Json& r : t["results"]) {
      if (r["status"] == "ok" && r["ir_per_pair"].is_number() && std::isfinite(capalloc_pair)) {
        r["pair_vs_capalloc"] = r["ir_per_pair"].get<double>() / capalloc_pair;
      }
    }
    out["traces"].push_back(t);
  }
  rmdir(dir);
  if (json) {
    std::printf("%s\n", json_text(out, 2).c_str());
    return failed ? 1 : 0;
  }
  auto num = [](const Json& r, const char* key) {
    return r.contains(key) && r[key].is_number() ? absl::StrFormat("%.0f", r[key].get<double>())
                                                 : std::string("n/a");
  };
  for (const Json& t : out["traces"]) {
    std::printf("\n%s: %llu operations, instructions counted by callgrind in the measured pass "
                "(after a warm-up pass)\n  %-10s %12s %12s %12s %12s\n",
                t["path"].get<std::string>().c_str(),
                static_cast<unsigned long long>(t["operations"].get<std::uint64_t>()), "allocator",
                "Ir per pair", "Ir per alloc", "Ir per free", "vs capalloc");
    for (const Json& r : t["results"]) {
      if (r["status"] != "ok") {
        std::printf("  %-10s %s: %s\n", r["allocator"].get<std::string>().c_str(),
                    r["status"].get<std::string>().c_str(), r["reason"].get<std::string>().c_str());
        continue;
      }
      std::printf("  %-10s %12s %12s %12s %11sx\n", r["allocator"].get<std::string>().c_str(),
                  num(r, "ir_per_pair").c_str(), num(r, "ir_per_alloc").c_str(),
                  num(r, "ir_per_free").c_str(),
                  r.contains("pair_vs_capalloc")
                      ? absl::StrFormat("%.2f", r["pair_vs_capalloc"].get<double>()).c_str()
                      : "n/a");
      if (r.contains("note")) std::printf("    %s\n", r["note"].get<std::string>().c_str());
    }
  }
  return failed ? 1 : 0;
}

}  // namespace capalloc::cli::bench
