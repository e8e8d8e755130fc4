// tools/cli_audit.cpp: `capalloc audit`, the retention audit from the
// command line.
//
//   capalloc audit [--json] [--no-stacks] [settings]
//       seed 000's retention, played on the allocator: a launch path keeps
//       its last launch's buffers in a cached call state that refers to
//       itself; after the owner drops them, live_since(checkpoint) names the
//       two buffers, their tags and the frames that allocated them. Exit 0
//       when the audit names exactly them.
//   capalloc audit --trace FILE [--since ID] [--json]
//       the blocks an event trace (docs/trace.md; CAPALLOC_TRACE) leaves
//       live at its end, allocated after id ID (default 0: all), by tag,
//       most bytes first: the same question asked of a recorded run.
#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/strings/str_format.h"
#include "capalloc/allocator.hpp"
#include "capalloc/audit.hpp"
#include "tools/cli.hpp"
#include "tools/terminal_text.hpp"
#include "tools/trace/json_error.hpp"

namespace capalloc::cli {

namespace {

struct AuditFlags {
  bool json = false;
  bool no_stacks = false;
  std::string trace;
  std::uint64_t since = 0;
  std::unique_ptr<SettingsFlags> settings;
};

struct Buffer {
  Allocator* allocator = nullptr;
  void* ptr = nullptr;
  ~Buffer() {
    if (ptr != nullptr) allocator->deallocate(ptr).IgnoreError();
  }
};

struct CallState {
  std::shared_ptr<CallState> self;  // the cached state refers to itself
  std::vector<std::shared_ptr<Buffer>> last_arguments;
};

[[gnu::noinline]] std::shared_ptr<Buffer> projection_input(Allocator& a, std::size_t bytes) {
  auto p = a.allocate(bytes, 0, kDefaultStream, {.tag = "vision.proj.input"});
  return std::shared_ptr<Buffer>(new Buffer{&a, p.ok() ? *p : nullptr});
}

[[gnu::noinline]] std::shared_ptr<Buffer> projection_output(Allocator& a, std::size_t bytes) {
  auto p = a.allocate(bytes, 0, kDefaultStream, {.tag = "vision.proj.output"});
  return std::shared_ptr<Buffer>(new Buffer{&a, p.ok() ? *p : nullptr});
}

void print_live(const LiveSince& live) {
  std::printf("live since checkpoint %llu: %llu block(s), %s\n",
              static_cast<unsigned long long>(live.since.sequence),
              static_cast<unsigned long long>(live.blocks),
              absl::StrFormat("%.1f MiB", static_cast<double>(live.bytes) / (1 << 20)).c_str());
  for (const LiveGroup& g : live.groups) {
    // Tags, sites and frames are the caller's bytes: escaped for the terminal.
    std::printf("  %-20s %3llu block(s) %10llu bytes  at %s\n",
                g.tag.empty() ? "<untagged>" : terminal_text(g.tag).c_str(),
                static_cast<unsigned long long>(g.blocks), static_cast<unsigned long long>(g.bytes),
                g.site.empty() ? "<unknown site>" : terminal_text(g.site).c_str());
    for (const LiveBlock& b : g.block_list) {
      std::printf("      block #%llu %p, %zu bytes\n", static_cast<unsigned long long>(b.sequence),
                  b.ptr, b.requested);
    }
    for (std::size_t i = 0; i < g.stack.size() && i < 8; ++i) {
      std::printf("      %s %s\n", i == 0 ? "stack:" : "      ",
                  terminal_text(g.stack[i]).c_str());
    }
  }
}

int demo_command(const AuditFlags& flags, const Settings& settings) {
  auto runtime = make_runtime(settings.runtime);
  if (!runtime.ok()) return fail(runtime.status());
  auto allocator = Allocator::create(*runtime, settings.allocator);
  if (!allocator.ok()) return fail(allocator.status());
  Allocator& a = **allocator;
  if (!flags.no_stacks) a.set_record_stacks(true);
  const AuditCheckpoint cp = a.checkpoint();
  std::shared_ptr<CallState> cache;
  {
    // The owner allocates, launches and drops its buffers; the launch path
    // keeps them in its cached call state.
    auto in = projection_input(a, std::size_t{3} << 20);
    auto out = projection_output(a, std::size_t{5} << 20);
    if (in->ptr == nullptr || out->ptr == nullptr) {
      return fail(absl::ResourceExhaustedError("audit: the demo's buffers could not be allocated"));
    }
    auto state = std::make_shared<CallState>();
    state->self = state;
    state->last_arguments = {in, out};
    cache = state;
  }
  cache.reset();
  const LiveSince live = a.live_since(cp);
  if (flags.json) {
    std::printf("%s\n", live_since_to_json(live).c_str());
  } else {
    std::printf("capalloc audit: seed 000's launch path keeps its last launch's buffers after "
                "the owner dropped them%s\n",
                flags.no_stacks ? "" : " (allocation stacks recorded)");
    print_live(live);
  }
  const bool named = live.blocks == 2 && live.groups.size() == 2 &&
                     live.groups[0].tag == "vision.proj.output" &&
                     live.groups[1].tag == "vision.proj.input";
  if (!flags.json) {
    std::printf("the audit names the two retained buffers: %s\n", named ? "yes" : "NO");
  }
  // The collection that breaks the cycle.
  for (const LiveGroup& g : live.groups) {
    for (const LiveBlock& b : g.block_list) a.deallocate(const_cast<void*>(b.ptr)).IgnoreError();
  }
  return named ? 0 : 1;
}

int trace_command(const AuditFlags& flags) {
  std::ifstream in(flags.trace);
  if (!in) return fail(absl::NotFoundError("audit: cannot read the trace '" + flags.trace + "'"));
  struct Live {
    std::string tag;
    std::uint64_t size = 0;
    std::string addr;
  };
  std::map<std::uint64_t, Live> live;
  std::string line;
  int number = 0;
  bool header = true;
  // The reader rules of docs/trace.md for what this command reads (the
  // header, alloc and free); a line that breaks one is refused, naming it.
  auto refuse = [&](const std::string& why) {
    return fail(absl::InvalidArgumentError(
        absl::StrFormat("audit: %s:%d: %s", flags.trace, number, why)));
  };
  auto id_of = [](const nlohmann::json& j, std::uint64_t& id) {
    if (!j.contains("id") || !j["id"].is_number_unsigned()) return false;
    id = j["id"].get<std::uint64_t>();
    return true;
  };
  while (std::getline(in, line)) {
    ++number;
    const auto first = line.find_first_not_of(" \t\r");
    if (first == std::string::npos || line[first] == '#') continue;
    const nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded()) return refuse("invalid JSON (" + trace::json_error(line) + ")");
    if (!j.is_object()) return refuse("not a JSON object");
    if (header) {
      if (!j.contains("format") || !j["format"].is_string() ||
          j["format"].get<std::string>() != "capalloc.trace/1") {
        return refuse("not a capalloc.trace/1 header (docs/trace.md)");
      }
      header = false;
      continue;
    }
    if (!j.contains("op") || !j["op"].is_string()) return refuse("no \"op\"");
    const std::string op = j["op"].get<std::string>();
    std::uint64_t id = 0;
    if (op == "alloc") {
      if (!id_of(j, id)) return refuse("alloc without an unsigned integer \"id\"");
      if (!j.contains("size") || !j["size"].is_number_unsigned() ||
          j["size"].get<std::uint64_t>() == 0) {
        return refuse("alloc without a \"size\" above 0");
      }
      if (j.contains("tag") && !j["tag"].is_string()) return refuse("alloc with a non-string tag");
      if (j.contains("addr") && !j["addr"].is_string()) return refuse("alloc with a non-string addr");
      if (live.contains(id)) return refuse(absl::StrFormat("alloc of id %d, which is live", id));
      live[id] = Live{j.value("tag", ""), j["size"].get<std::uint64_t>(), j.value("addr", "")};
    } else if (op == "free") {
      if (!id_of(j, id)) return refuse("free without an unsigned integer \"id\"");
      if (live.erase(id) == 0) return refuse(absl::StrFormat("free of id %d, which is not live", id));
    } else if (op == "release" || op == "release_done") {
      // `id` or `addr` when the release names memory; neither when not.
      if (j.contains("id") && !id_of(j, id)) return refuse(op + " with a non-integer \"id\"");
      if (j.contains("addr") && !j["addr"].is_string()) {
        return refuse(op + " with a non-string \"addr\"");
      }
    }
  }
  if (header) return refuse("no capalloc.trace/1 header: an empty file, or not a trace");
  struct Group {
    std::uint64_t blocks = 0, bytes = 0;
    std::vector<std::uint64_t> ids;
  };
  std::map<std::string, Group> groups;
  std::uint64_t blocks = 0, bytes = 0;
  for (const auto& [id, b] : live) {
    if (id <= flags.since) continue;
    Group& g = groups[b.tag];
    ++g.blocks;
    g.bytes += b.size;
    g.ids.push_back(id);
    ++blocks;
    bytes += b.size;
  }
  std::vector<std::pair<std::string, Group>> sorted(groups.begin(), groups.end());
  std::stable_sort(sorted.begin(), sorted.end(),
                   [](const auto& x, const auto& y) { return x.second.bytes > y.second.bytes; });
  if (flags.json) {
    nlohmann::json out = {{"trace", flags.trace}, {"since", flags.since}, {"blocks", blocks},
                          {"bytes", bytes}, {"groups", nlohmann::json::array()}};
    for (const auto& [tag, g] : sorted) {
      out["groups"].push_back({{"tag", tag}, {"blocks", g.blocks}, {"bytes", g.bytes},
                               {"ids", g.ids}});
    }
    std::printf("%s\n", out.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
    return 0;
  }
  std::printf("%s: %llu block(s) allocated after id %llu live at the end, %llu bytes\n",
              terminal_text(flags.trace).c_str(), static_cast<unsigned long long>(blocks),
              static_cast<unsigned long long>(flags.since), static_cast<unsigned long long>(bytes));
  for (const auto& [tag, g] : sorted) {
    std::printf("  %-24s %4llu block(s) %12llu bytes  first id %llu\n",
                tag.empty() ? "<untagged>" : terminal_text(tag).c_str(),
                static_cast<unsigned long long>(g.blocks),
                static_cast<unsigned long long>(g.bytes),
                static_cast<unsigned long long>(g.ids.front()));
  }
  return 0;
}

}  // namespace

void add_audit_command(CLI::App& app, Runner& run) {
  CLI::App* command = app.add_subcommand(
      "audit", "the retention audit: seed 000's retained buffers named by live_since, or the "
               "blocks a trace leaves live (--trace)");
  auto flags = std::make_shared<AuditFlags>();
  command->add_flag("--json", flags->json, "one JSON object instead of text");
  command->add_flag("--no-stacks", flags->no_stacks, "do not record allocation stacks (demo)");
  command->add_option("--trace", flags->trace,
                      "an event trace (docs/trace.md): list what it leaves live instead")
      ->check(CLI::ExistingFile);
  command->add_option("--since", flags->since,
                      "with --trace: only blocks with an id above this one")
      ->check(unsigned_at_most(std::numeric_limits<std::uint64_t>::max()))
      ->capture_default_str();
  flags->settings = std::make_unique<SettingsFlags>(*command, kRuntimeFlag | kLogLevelFlag);
  command->callback([flags, &run] {
    run = [flags] {
      auto settings = flags->settings->start();
      if (!settings.ok()) return usage_error(settings.status());
      if (!flags->trace.empty()) return trace_command(*flags);
      return demo_command(*flags, *settings);
    };
  });
}

}  // namespace capalloc::cli
