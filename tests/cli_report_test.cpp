// The `capalloc` CLI's report, audit and trace handling run as a program
// (cli_test): the break test of issue 13 found a missing directory reported
// as a permission problem, a large trace making a 30 MB page, control
// characters of tags printed raw, and an unwritable CAPALLOC_TRACE stopping
// the allocator.
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "cli_test_support.hpp"
#include "test_support.hpp"

namespace {

using capalloc::testing::capalloc_cli;
using capalloc::testing::Run;
using Catch::Contains;

// A fresh directory for one test case.
std::filesystem::path scratch(const std::string& name) {
  const auto dir = std::filesystem::temp_directory_path() /
                   absl::StrCat("capalloc_cli_report_", name, "_", ::getpid());
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

std::string write(const std::filesystem::path& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
  return path.string();
}

const std::string kHeader = "{\"format\": \"capalloc.trace/1\", \"source\": \"test\"}\n";

std::size_t count_of(const std::string& text, const std::string& what) {
  std::size_t n = 0;
  for (auto at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

}  // namespace

TEST_CASE("cli: report and --report name a missing directory, and say why a write failed",
          "[cli][report]") {
  const auto dir = scratch("paths");
  const std::string trace =
      write(dir / "t.jsonl", kHeader + "{\"op\":\"alloc\",\"id\":1,\"size\":8,\"stream\":0,"
                                       "\"addr\":\"0x1000\"}\n");
  const std::string missing = (dir / "missing").string();

  const Run no_dir = capalloc_cli({"report", trace, "-o", missing + "/sub/report.html"});
  CHECK_RUN(no_dir, 1);
  CHECK_THAT(no_dir.err, Contains("NOT_FOUND"));
  CHECK_THAT(no_dir.err, Contains("the directory '" + missing + "' does not exist"));
  CHECK_THAT(no_dir.err, !Contains("PERMISSION_DENIED"));

  const Run is_dir = capalloc_cli({"report", trace, "-o", dir.string()});
  CHECK_RUN(is_dir, 1);
  CHECK_THAT(is_dir.err, Contains("it is a directory"));

  if (::geteuid() != 0) {  // root writes anywhere
    const auto locked = dir / "locked";
    std::filesystem::create_directory(locked);
    std::filesystem::permissions(locked, std::filesystem::perms::owner_read |
                                             std::filesystem::perms::owner_exec);
    const Run denied = capalloc_cli({"report", trace, "-o", (locked / "r.html").string()});
    CHECK_RUN(denied, 1);
    CHECK_THAT(denied.err, Contains("PERMISSION_DENIED"));
    CHECK_THAT(denied.err, Contains("Permission denied"));
    std::filesystem::permissions(locked, std::filesystem::perms::owner_all);
  }

  // --report DIR: DIR itself is created; a missing parent is an error, said
  // before any work runs.
  const Run arms_missing =
      capalloc_cli({"arms", "--arm", "B", "--runtime", "host", "--report", missing + "/sub"});
  CHECK_RUN(arms_missing, 1);
  CHECK_THAT(arms_missing.err, Contains("the directory '" + missing + "' does not exist"));
  CHECK_THAT(arms_missing.out, !Contains("arm B"));
  const Run gemm_file = capalloc_cli({"gemm-scenario", "--runtime", "host", "--report", trace});
  CHECK_RUN(gemm_file, 1);
  CHECK_THAT(gemm_file.err, Contains("a file of that name exists"));
  const Run arms_new =
      capalloc_cli({"arms", "--arm", "B", "--runtime", "host", "--report", missing});
  CHECK_RUN(arms_new, 0);
  CHECK(std::filesystem::exists(std::filesystem::path(missing) / "arm-B.html"));
  std::filesystem::remove_all(dir);
}

TEST_CASE("cli: report bounds the page of a large trace and keeps every finding's blocks",
          "[cli][report]") {
  const auto dir = scratch("large");
  // 60,000 blocks of 4 KiB, 64 live at a time, and in the middle a small,
  // short-lived victim and writer with a finding between them: neither is
  // among the largest or longest-lived.
  constexpr int kBlocks = 60000;
  constexpr std::uint64_t kVictim = 900001;
  constexpr std::uint64_t kWriter = 900002;
  std::string text = kHeader;
  std::uint64_t t = 0;
  for (int i = 1; i <= kBlocks; ++i) {
    absl::StrAppendFormat(&text,
                          "{\"op\":\"alloc\",\"t\":%d,\"id\":%d,\"size\":4096,\"stream\":0,"
                          "\"tag\":\"churn\",\"addr\":\"0x%x\"}\n",
                          t++, i, 0x10000000 + (i % 64) * 4096);
    if (i > 64) absl::StrAppendFormat(&text, "{\"op\":\"free\",\"t\":%d,\"id\":%d}\n", t++, i - 64);
    if (i == kBlocks / 2) {
      absl::StrAppendFormat(&text,
                            "{\"op\":\"alloc\",\"t\":%d,\"id\":%d,\"size\":256,\"stream\":0,"
                            "\"tag\":\"victim\",\"addr\":\"0x20000000\"}\n"
                            "{\"op\":\"free\",\"t\":%d,\"id\":%d}\n"
                            "{\"op\":\"alloc\",\"t\":%d,\"id\":%d,\"size\":256,\"stream\":0,"
                            "\"tag\":\"writer\",\"addr\":\"0x20000000\"}\n"
                            "{\"op\":\"finding\",\"t\":%d,\"severity\":\"hazard\","
                            "\"addr\":\"0x20000000\",\"size\":256,\"graph\":1,\"victim\":%d,"
                            "\"writer\":%d}\n"
                            "{\"op\":\"free\",\"t\":%d,\"id\":%d}\n",
                            t, kVictim, t + 1, kVictim, t + 2, kWriter, t + 3, kVictim, kWriter,
                            t + 4, kWriter);
      t += 5;
    }
  }
  const std::string trace = write(dir / "large.jsonl", text);
  REQUIRE(std::filesystem::file_size(trace) > 7u << 20);

  auto check_page = [&](const std::string& page, std::uintmax_t bound) {
    const std::uintmax_t size = std::filesystem::file_size(page);
    INFO(page << ": " << size << " bytes");
    CHECK(size < bound);
    std::ifstream in(page);
    const std::string html((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    // The finding, and both blocks it involves, are still in the page.
    CHECK(count_of(html, "\"op\":\"finding\"") == 1);
    CHECK_THAT(html, Contains(absl::StrCat("\"id\":", kVictim, ",\"size\":256")));
    CHECK_THAT(html, Contains(absl::StrCat("\"id\":", kWriter, ",\"size\":256")));
    // What was left out is said and summarized.
    CHECK_THAT(html, Contains("\"omitted\":{\"blocks\":"));
    CHECK_THAT(html, Contains("are not drawn"));
  };
  const std::string page = (dir / "large.html").string();
  const Run bounded = capalloc_cli({"report", trace, "-o", page});
  CHECK_RUN(bounded, 0);
  CHECK_THAT(bounded.out, Contains("left out of the drawing (--max-blocks 10000)"));
  check_page(page, 3u << 20);  // the default keeps the page under 3 MB

  const std::string small = (dir / "small.html").string();
  const Run fewer = capalloc_cli({"report", trace, "-o", small, "--max-blocks", "100"});
  CHECK_RUN(fewer, 0);
  check_page(small, 200u << 10);
  std::filesystem::remove_all(dir);
}

TEST_CASE("cli: audit escapes a tag's control characters in text, and JSON-escapes them in JSON",
          "[cli]") {
  const auto dir = scratch("escape");
  const std::string trace = write(
      dir / "t.jsonl",
      kHeader +
          "{\"op\":\"alloc\",\"id\":1,\"size\":8,\"stream\":0,\"tag\":\"a\\nb\\u001b[31mc\\t\\\\\"}\n"
          // A release of no memory names no address (docs/trace.md): accepted.
          "{\"op\":\"release\",\"t\":5,\"stream\":0}\n{\"op\":\"release_done\",\"t\":6}\n");
  const Run text = capalloc_cli({"audit", "--trace", trace});
  CHECK_RUN(text, 0);
  CHECK_THAT(text.out, Contains("a\\nb\\x1b[31mc\\t\\\\"));
  CHECK(text.out.find('\x1b') == std::string::npos);
  CHECK(count_of(text.out, "\n") == 2);  // the summary and the one group: no forged line
  const Run json = capalloc_cli({"audit", "--trace", trace, "--json"});
  CHECK_RUN(json, 0);
  CHECK_THAT(json.out, Contains("\"a\\nb\\u001b[31mc\\t\\\\\""));
  const Run bad_release = capalloc_cli(
      {"audit", "--trace", write(dir / "bad.jsonl", kHeader + "{\"op\":\"release\",\"addr\":7}\n")});
  CHECK_RUN(bad_release, 1);
  CHECK_THAT(bad_release.err, Contains(":2: release with a non-string \"addr\""));
  std::filesystem::remove_all(dir);
}

TEST_CASE("cli: an unwritable CAPALLOC_TRACE is reported and the allocator works untraced",
          "[cli]") {
  const Run r = capalloc_cli({"arms", "--arm", "B", "--runtime", "host"},
                             {{"CAPALLOC_TRACE", "/nonexistent-dir/trace.jsonl"}});
  CHECK_RUN(r, 0);
  CHECK_THAT(r.err, Contains("cannot create the trace file '/nonexistent-dir/trace.jsonl'"));
  CHECK_THAT(r.err, Contains("runs without an event trace"));
}

// Break test 13, item 7: `report` and `audit --trace` disagreed on the same
// file (a UTF-8 byte order mark; a free of an unknown id or an alloc of a
// live one); an invalid escape was "not a JSON object"; a snapshot of an
// unknown version was "without a devices array".
TEST_CASE("cli: report and audit --trace agree on a trace's reader rules, and say why JSON is invalid",
          "[cli]") {
  const auto dir = scratch("agree");
  const std::string out = (dir / "page.html").string();
  const std::string alloc = "{\"op\": \"alloc\", \"id\": 1, \"size\": 64, \"addr\": \"0x1000\"}\n";
  SECTION("a byte order mark is accepted by both") {
    const std::string file = write(dir / "bom.jsonl", "\xEF\xBB\xBF" + kHeader + alloc);
    CHECK_RUN(capalloc_cli({"audit", "--trace", file}), 0);
    CHECK_RUN(capalloc_cli({"report", file, "-o", out}), 0);
  }
  SECTION("a free of an id that is not live, or an alloc of one that is, is refused by both") {
    const std::vector<std::pair<std::string, std::string>> cases = {
        {kHeader + alloc + "{\"op\": \"free\", \"id\": 7}\n", ":3: free of id 7, which is not live"},
        {kHeader + alloc + alloc, ":3: alloc of id 1, which is live"},
        {kHeader + "{\"op\": \"alloc\", \"size\": 8}\n", ":2: alloc without an unsigned integer \"id\""},
        {kHeader + alloc + "{\"op\": \"free\"}\n", ":3: free without an unsigned integer \"id\""},
        {kHeader + "{\"op\": \"alloc\", \"id\": 2, \"size\": 0}\n", ":2: alloc without a \"size\" above 0"},
        {kHeader + "{\"op\": \"alloc\", \"id\": 2}\n", ":2: alloc without a \"size\" above 0"},
    };
    for (const auto& [text, message] : cases) {
      const std::string file = write(dir / "ids.jsonl", text);
      INFO(message);
      const Run audit = capalloc_cli({"audit", "--trace", file});
      CHECK_RUN(audit, 1);
      CHECK_THAT(audit.err, Contains(message));
      const Run report = capalloc_cli({"report", file, "-o", out});
      CHECK_RUN(report, 1);
      CHECK_THAT(report.err, Contains(message));
    }
  }
  SECTION("an invalid escape is invalid JSON, with the parser's reason") {
    const std::string file =
        write(dir / "escape.jsonl", kHeader + "{\"op\": \"alloc\", \"tag\": \"\\ud800\"}\n");
    for (const Run& r : {capalloc_cli({"audit", "--trace", file}),
                         capalloc_cli({"report", file, "-o", out})}) {
      CHECK_RUN(r, 1);
      CHECK_THAT(r.err, Contains(":2: invalid JSON (") && Contains("surrogate"));
    }
  }
  SECTION("a snapshot of an unknown version names its schema") {
    const std::string file =
        write(dir / "snap.json", "{\"schema\": \"capalloc.snapshot/99\", \"devices\": []}");
    const Run r = capalloc_cli({"report", file, "-o", out});
    CHECK_RUN(r, 1);
    CHECK_THAT(r.err, Contains("unknown snapshot schema version \"capalloc.snapshot/99\""));
  }
  std::filesystem::remove_all(dir);
}

// A probe of 2026-12-06 aborted report and audit on inputs their readers
// took: a number too large for a double, members of the wrong type in a
// snapshot drawn with a bounded trace, JSON nested 100,000 deep (the page's
// writer recursed per level), and an endless device.
TEST_CASE("cli: report and audit refuse or take odd JSON without aborting", "[cli]") {
  const auto dir = scratch("odd_json");
  const std::string out = (dir / "page.html").string();
  SECTION("a number too large for a double is invalid JSON to both") {
    const std::string file = write(
        dir / "overflow.jsonl", kHeader + "{\"op\": \"alloc\", \"id\": 1, \"size\": 8, \"t\": 1e400}\n");
    for (const Run& r : {capalloc_cli({"audit", "--trace", file}),
                         capalloc_cli({"report", file, "-o", out})}) {
      CHECK_RUN(r, 1);
      CHECK_THAT(r.err, Contains(":2: invalid JSON (number overflow"));
    }
  }
  SECTION("a snapshot's members of the wrong type are passed over when the page is bounded") {
    const std::string trace = write(
        dir / "t.jsonl", kHeader + "{\"op\": \"alloc\", \"id\": 1, \"size\": 8}\n"
                                   "{\"op\": \"alloc\", \"id\": 2, \"size\": 8}\n");
    for (const std::string snapshot :
         {"{\"schema\": \"capalloc.snapshot/4\", \"devices\": [1, null, \"x\"]}",
          "{\"schema\": \"capalloc.snapshot/4\", \"devices\": [], \"findings\": 7}",
          "{\"schema\": \"capalloc.snapshot/4\", \"devices\": [], \"findings\": [{\"reuse_chain\": [1]}]}",
          "{\"schema\": \"capalloc.snapshot/4\", \"devices\": [{\"pools\": [{\"segments\": "
          "[{\"blocks\": [{\"state\": 5}]}]}]}]}",
          "{\"schema\": \"capalloc.snapshot/4\", \"devices\": [], \"audit\": {\"groups\": [1]}}"}) {
      INFO(snapshot);
      const std::string file = write(dir / "s.json", snapshot);
      CHECK_RUN(capalloc_cli({"report", trace, file, "--max-blocks", "1", "-o", out}), 0);
    }
  }
  SECTION("JSON nested far deeper than any snapshot or trace is refused") {
    const std::string deep = std::string(100000, '[') + std::string(100000, ']');
    const std::string snapshot = write(
        dir / "deep.json", "{\"schema\": \"capalloc.snapshot/4\", \"devices\": [], \"x\": " + deep + "}");
    const std::string trace =
        write(dir / "deep.jsonl", kHeader + "{\"op\": \"alloc\", \"id\": 1, \"size\": 8, \"x\": " + deep + "}\n");
    for (const std::string& file : {snapshot, trace}) {
      const Run r = capalloc_cli({"report", file, "-o", out});
      CHECK_RUN(r, 1);
      CHECK_THAT(r.err, Contains("JSON nested 100001 levels deep"));
    }
  }
  SECTION("a device is not read") {
    const Run r = capalloc_cli({"report", "/dev/zero", "-o", out});
    CHECK_RUN(r, 1);
    CHECK_THAT(r.err, Contains("/dev/zero: not a regular file"));
  }
  std::filesystem::remove_all(dir);
}
