// capture_tracker_test.cpp: the capture tracker's verdicts (DESIGN.md section
// 5) on the host runtime, beyond the four arms of seed 003: several graphs
// sharing one graph pool, a capture forked onto a second stream, graph
// outputs overwritten by another graph (the lower severity that lets strict
// mode run vLLM-style pools), strict mode refusing a hazardous replay, the
// footprint fallback when a runtime cannot list a graph's writes, a graph
// that rewrites its own output (not a finding), and the findings' JSON.
// Every finding asserted here is also checked against the replay it predicts
// where that is cheap: the host runtime replays faithfully, so a finding that
// says "WS will hold T's data" can be proven by replaying.
#include <algorithm>
#include <cctype>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "capture_test_support.hpp"
#include "forwarding_runtime.hpp"
#include "tools/scenarios/kernels.hpp"

using namespace capalloc;
using namespace capalloc::testing;
using capalloc::scenarios::fill_kernel;
using capalloc::scenarios::scale_kernel;
using capalloc::scenarios::sum_kernel;

namespace {

constexpr std::size_t N = 4096;  // floats per tensor: 16 KiB, a multiple of the granularity
constexpr std::size_t kBytes = N * sizeof(float);
constexpr float kCanary = 1234.5f;

// The findings of graph `label` with this victim and writer (by tag).
std::vector<Finding> matching(const std::vector<Finding>& findings, std::string_view label,
                              std::string_view victim, std::string_view writer) {
  std::vector<Finding> out;
  for (const Finding& f : findings) {
    if (f.graph_label == label && f.victim.tag == victim && f.writer.tag == writer) {
      out.push_back(f);
    }
  }
  return out;
}

// The write of `record` made by kernel `op` (there is exactly one here);
// the record also lists the kernels' reads (mode kRead), which this skips.
RecordedWrite write_by(const WriteRecord& record, std::string_view op) {
  std::vector<RecordedWrite> found;
  for (const RecordedWrite& w : record.writes) {
    if (w.op == op && w.mode != capalloc::AccessMode::kRead) found.push_back(w);
  }
  REQUIRE(found.size() == 1);
  return found[0];
}

// How many of a record's accesses have `mode`.
std::size_t count_mode(const WriteRecord& record, capalloc::AccessMode mode) {
  return static_cast<std::size_t>(std::count_if(
      record.writes.begin(), record.writes.end(),
      [mode](const RecordedWrite& w) { return w.mode == mode; }));
}

// Seed 003 arm A: T = src * 2 and sink = T.sum() in the capture, del T, then
// WS allocated at T's address and left live: each replay writes T over WS.
struct ArmA {
  float* src = nullptr;
  float* t = nullptr;
  float* ws = nullptr;
  std::uint64_t t_seq = 0;
  CaptureId capture = 0;
  CaptureResult result;
};

ArmA arm_a(World& w) {
  ArmA a;
  a.src = w.tensor(N, kDefaultStream, "src");
  w.run_now(fill_kernel(a.src, N, 3.0f));
  a.result = w.capture(kDefaultPool, "A.g", [&] {
    a.t = w.tensor(N, w.side, "T");
    a.t_seq = w.seq(a.t);
    w.launch(w.side, scale_kernel(a.t, a.src, N, 2.0f));
    float* sink = w.tensor(1, w.side, "sink");
    w.launch(w.side, sum_kernel(sink, a.t, N));
    w.free(a.t);
    a.ws = w.tensor(N, w.side, "WS");
  }, &a.capture);
  REQUIRE(a.ws == a.t);  // the alias the whole arm is about
  return a;
}

}  // namespace

TEST_CASE("three graphs in one shared pool: findings exactly where an escaped block is written",
          "[capture][shared-pool]") {
  World w;
  const PoolHandle pool = *w.alloc->create_graph_pool(0);
  float* src = w.tensor(N, kDefaultStream, "src");
  w.run_now(fill_kernel(src, N, 3.0f));

  // g1 frees its transient T1; its output s1 escapes, written only by g1.
  float *t1 = nullptr, *s1 = nullptr;
  std::uint64_t t1_seq = 0;
  CaptureId id1 = 0;
  const CaptureResult g1 = w.capture(pool, "g1", [&] {
    t1 = w.tensor(N, w.side, "T1");
    t1_seq = w.seq(t1);
    w.launch(w.side, scale_kernel(t1, src, N, 2.0f));
    s1 = w.tensor(1, w.side, "s1");
    w.launch(w.side, sum_kernel(s1, t1, N));
    w.free(t1);
  }, &id1);
  CHECK(g1.new_findings.empty());

  // g2 reuses T1's memory for U, frees U, and leaves OUT2 live there: g2
  // writes OUT2's range through U (same graph: hazard) and so does g1
  // through T1. No graph writes OUT2 (g2 only allocates it), so nothing
  // restores it after g1's replay either: a hazard too, not the lower
  // severity of another graph's output (that case is tested below).
  float *u = nullptr, *s2 = nullptr, *out2 = nullptr;
  std::uint64_t u_seq = 0;
  CaptureId id2 = 0;
  const CaptureResult g2 = w.capture(pool, "g2", [&] {
    u = w.tensor(N, w.side, "U");
    u_seq = w.seq(u);
    w.launch(w.side, scale_kernel(u, src, N, 3.0f));
    s2 = w.tensor(1, w.side, "s2");
    w.launch(w.side, sum_kernel(s2, u, N));
    w.free(u);
    out2 = w.tensor(N, w.side, "OUT2");
  }, &id2);
  REQUIRE(u == t1);
  REQUIRE(out2 == t1);
  REQUIRE(g2.new_findings.size() == 2);
  const auto same_graph = matching(g2.new_findings, "g2", "OUT2", "U");
  REQUIRE(same_graph.size() == 1);
  CHECK(same_graph[0].severity == Severity::kHazard);
  CHECK(same_graph[0].overlap.ptr == out2);
  CHECK(same_graph[0].overlap.bytes == kBytes);
  const auto other_graph = matching(g2.new_findings, "g1", "OUT2", "T1");
  REQUIRE(other_graph.size() == 1);
  CHECK(other_graph[0].severity == Severity::kHazard);
  CHECK_THAT(other_graph[0].severity_reason, Catch::Contains("no graph writes the victim"));
  CHECK(other_graph[0].graph == g1.graph);
  CHECK(other_graph[0].victim.capture == id2);

  // g3 frees V where no block is live afterwards and writes its own output.
  float *v = nullptr, *out3 = nullptr;
  std::uint64_t v_seq = 0;
  const CaptureResult g3 = w.capture(pool, "g3", [&] {
    v = w.tensor(N, w.side, "V");
    v_seq = w.seq(v);
    w.launch(w.side, scale_kernel(v, src, N, 4.0f));
    out3 = w.tensor(1, w.side, "OUT3");
    w.launch(w.side, sum_kernel(out3, v, N));
    w.free(v);
  });
  CHECK(g3.new_findings.empty());
  CHECK(w.tracker->check_graph(g3.graph)->empty());
  CHECK(w.tracker->check().size() == 2);  // on demand: the same two, nothing new

  // One pool served all three captures: 7 allocations, 3 frees, 4 live.
  const AllocatorStats ps = *w.alloc->pool_stats(pool);
  CHECK(ps.allocations == 7);
  CHECK(ps.frees == 3);
  CHECK(ps.allocated_blocks.current == 4);
  CHECK(ps.segments.current == 1);
  for (const void* p : {static_cast<const void*>(s1), static_cast<const void*>(s2),
                        static_cast<const void*>(out2), static_cast<const void*>(out3)}) {
    CHECK(w.alloc->block_info(p)->pool == pool);
  }
  CHECK(w.alloc->block_info(s1)->capture == id1);
  CHECK(w.alloc->block_info(src)->pool == kDefaultPool);

  // Each record ties a write to the block it went through, even where
  // several blocks occupied the same address in turn.
  const WriteRecord r1 = *w.tracker->write_record(g1.graph);
  const WriteRecord r2 = *w.tracker->write_record(g2.graph);
  const WriteRecord r3 = *w.tracker->write_record(g3.graph);
  for (const WriteRecord* r : {&r1, &r2, &r3}) {
    CHECK(r->pool == pool);
    CHECK(r->precision == WriteEvidence::kDeclared);
    CHECK(count_mode(*r, capalloc::AccessMode::kWrite) == 2);  // scale's and sum's outputs
    CHECK(count_mode(*r, capalloc::AccessMode::kRead) == 2);   // scale reads src, sum reads T
    for (const RecordedWrite& rw : r->writes) CHECK(rw.writer.sequence != 0);
  }
  CHECK(r1.capture == id1);
  CHECK(write_by(r1, "scale").writer.sequence == t1_seq);
  CHECK(write_by(r1, "scale").span.ptr == t1);
  CHECK(write_by(r1, "scale").span.bytes == kBytes);
  CHECK(write_by(r1, "sum").writer.sequence == w.seq(s1));
  CHECK(write_by(r1, "sum").span.bytes == sizeof(float));
  CHECK(write_by(r2, "scale").writer.sequence == u_seq);  // not T1's, not OUT2's
  CHECK(write_by(r2, "sum").writer.sequence == w.seq(s2));
  CHECK(write_by(r3, "scale").writer.sequence == v_seq);
  CHECK(write_by(r3, "sum").writer.sequence == w.seq(out3));
  REQUIRE_OK(w.alloc->CheckInvariants());
}

TEST_CASE("a workspace allocated on a forked stream comes from the capture's pool and is tracked",
          "[capture][fork]") {
  World w;
  const PoolHandle pool = *w.alloc->create_graph_pool(0);
  const StreamHandle origin = w.side;
  const StreamHandle fork = w.stream();
  const EventHandle forked = *w.rt->create_event(0);
  const EventHandle joined = *w.rt->create_event(0);
  float* src = w.tensor(N, kDefaultStream, "src");
  w.run_now(fill_kernel(src, N, 3.0f));

  auto began = w.tracker->begin_capture(0, origin, {.pool = pool, .label = "forked"});
  REQUIRE_OK(began);
  const CaptureId id = *began;
  // The fork stream joins the capture by waiting on an event of the origin.
  REQUIRE_OK(w.rt->record_event(forked, origin));
  REQUIRE_OK(w.rt->stream_wait_event(fork, forked));
  CHECK(w.rt->capture_info(fork)->id == id);
  float* t = w.tensor(N, fork, "T");
  w.launch(fork, scale_kernel(t, src, N, 2.0f));
  float* sink = w.tensor(1, fork, "sink");
  w.launch(fork, sum_kernel(sink, t, N));
  w.free(t);
  float* ws = w.tensor(N, fork, "WS");  // the lazily created workspace
  REQUIRE(ws == t);
  const BlockInfo info = *w.alloc->block_info(ws);
  CHECK(info.pool == pool);
  CHECK(info.capture == id);
  CHECK(info.stream == fork);
  REQUIRE_OK(w.rt->record_event(joined, fork));
  REQUIRE_OK(w.rt->stream_wait_event(origin, joined));
  auto done = w.tracker->end_capture(origin);
  REQUIRE_OK(done);
  CHECK(w.rt->capture_info(fork)->status == CaptureStatus::kNone);

  const WriteRecord r = *w.tracker->write_record(done->graph);
  CHECK(r.capture == id);
  CHECK(r.pool == pool);
  CHECK(write_by(r, "scale").writer.tag == "T");
  REQUIRE(done->new_findings.size() == 1);
  const Finding& f = done->new_findings[0];
  CHECK(f.victim.tag == "WS");
  CHECK(f.writer.tag == "T");
  CHECK(f.severity == Severity::kHazard);
  CHECK(f.capture == id);

  // And the replay does what the finding says.
  w.run_now(fill_kernel(ws, N, kCanary));
  w.replay(done->graph);
  CHECK(all_equal(w.read(ws, N), 6.0f));
  REQUIRE_OK(w.rt->destroy_event(forked));
  REQUIRE_OK(w.rt->destroy_event(joined));
}

TEST_CASE("another graph overwriting a graph output is cross-graph severity and strict mode replays it",
          "[capture][strict]") {
  World w;
  const PoolHandle pool = *w.alloc->create_graph_pool(0);
  float* src = w.tensor(N, kDefaultStream, "src");
  w.run_now(fill_kernel(src, N, 3.0f));
  float* t = nullptr;
  const CaptureResult producer = w.capture(pool, "producer", [&] {
    t = w.tensor(N, w.side, "T");
    w.launch(w.side, scale_kernel(t, src, N, 2.0f));
    float* s = w.tensor(1, w.side, "s");
    w.launch(w.side, sum_kernel(s, t, N));
    w.free(t);
  });
  float* out = nullptr;
  CaptureId consumer_id = 0;
  const CaptureResult consumer = w.capture(pool, "consumer", [&] {
    out = w.tensor(N, w.side, "OUT");
    w.launch(w.side, fill_kernel(out, N, 5.0f));  // writes its own output: no finding for itself
  }, &consumer_id);
  REQUIRE(out == t);
  CHECK(producer.new_findings.empty());
  REQUIRE(consumer.new_findings.size() == 1);
  const Finding& f = consumer.new_findings[0];
  CHECK(f.graph == producer.graph);
  CHECK(f.severity == Severity::kCrossGraphOutput);
  CHECK(f.victim.tag == "OUT");
  CHECK(f.victim.capture == consumer_id);
  CHECK(f.writer.tag == "T");
  for (const Finding& g : w.tracker->check()) CHECK(g.severity != Severity::kHazard);

  // vLLM reads OUT before the next replay, so strict mode must not refuse.
  w.tracker->set_strict(true);
  w.replay(consumer.graph);
  CHECK(all_equal(w.read(out, N), 5.0f));
  w.replay(producer.graph);
  CHECK(all_equal(w.read(out, N), 6.0f));  // the overwrite is real, just expected
}

TEST_CASE("strict mode refuses a hazardous replay and leaves the victim intact", "[capture][strict]") {
  World w;
  const ArmA a = arm_a(w);
  REQUIRE(a.result.new_findings.size() == 1);
  CHECK(a.result.new_findings[0].severity == Severity::kHazard);

  w.tracker->set_strict(true);
  w.run_now(fill_kernel(a.ws, N, kCanary));
  const absl::Status refused = w.tracker->replay(a.result.graph, kDefaultStream);
  CHECK(refused.code() == absl::StatusCode::kFailedPrecondition);
  CHECK_THAT(std::string(refused.message()), Catch::Contains("'WS'"));
  CHECK_THAT(std::string(refused.message()), Catch::Contains("strict"));
  REQUIRE_OK(w.rt->synchronize_stream(kDefaultStream));
  CHECK(all_equal(w.read(a.ws, N), kCanary));

  // Strict off: the replay runs and clobbers WS with T's value, 3 * 2.
  w.tracker->set_strict(false);
  w.replay(a.result.graph);
  CHECK(all_equal(w.read(a.ws, N), 6.0f));
}

namespace {

// Forwards everything to a real runtime but cannot list a graph's writes (as
// the PyTorch plug-in, which sees only malloc and free): the tracker must
// fall back to footprint records.
class NoGraphWritesRuntime final : public capalloc::testing::ForwardingRuntime<DeviceRuntime> {
 public:
  using ForwardingRuntime::ForwardingRuntime;
  int graph_writes_calls = 0;

  absl::StatusOr<std::vector<GraphWrite>> graph_writes(GraphHandle) override {
    ++graph_writes_calls;
    return absl::UnimplementedError("graph_writes: this runtime cannot list a graph's writes");
  }
};

}  // namespace

TEST_CASE("without a list of graph writes the tracker falls back to footprint evidence",
          "[capture][footprint]") {
  auto runtime = std::make_shared<NoGraphWritesRuntime>(host_runtime());
  World w(runtime);
  const ArmA a = arm_a(w);
  CHECK(runtime->graph_writes_calls > 0);

  // One footprint write per block allocated in the capture: T, sink, WS.
  const WriteRecord r = *w.tracker->write_record(a.result.graph);
  CHECK(r.precision == WriteEvidence::kFootprint);
  REQUIRE(r.writes.size() == 3);
  for (const RecordedWrite& rw : r.writes) {
    CHECK(rw.evidence == WriteEvidence::kFootprint);
    CHECK(rw.op == "footprint");
    CHECK(rw.span.ptr == rw.writer.ptr);
  }

  // WS is flagged through T's footprint; sink and WS's own footprint are not.
  const auto ws = matching(a.result.new_findings, "A.g", "WS", "T");
  REQUIRE(ws.size() == 1);
  CHECK(ws[0].evidence == WriteEvidence::kFootprint);
  // Footprint evidence cannot say what the graph writes: `possible`, and
  // ranges marked as upper bounds.
  CHECK(ws[0].severity == Severity::kPossible);
  CHECK_THAT(ws[0].severity_reason, Catch::Contains("footprint evidence only"));
  CHECK_FALSE(ws[0].ranges_exact);
  CHECK(ws[0].writer.sequence == a.t_seq);
  CHECK(a.result.new_findings.size() == 1);
  CHECK(w.tracker->check().size() == 1);
}

// Issue 9: `possible` findings make strict mode refuse only when asked
// (CAPALLOC_STRICT=possible, set_strict_possible).
TEST_CASE("strict mode refuses a footprint finding only when asked to refuse possible ones",
          "[capture][footprint][strict]") {
  auto runtime = std::make_shared<NoGraphWritesRuntime>(host_runtime());
  World w(runtime);
  const ArmA a = arm_a(w);
  REQUIRE(w.tracker->check().size() == 1);
  w.tracker->set_strict(true);
  REQUIRE_OK(w.tracker->replay(a.result.graph, kDefaultStream));  // possible: replayed
  REQUIRE_OK(w.rt->synchronize_stream(kDefaultStream));
  w.tracker->set_strict_possible(true);
  CHECK(w.tracker->replay(a.result.graph, kDefaultStream).code() ==
        absl::StatusCode::kFailedPrecondition);
  ::setenv("CAPALLOC_STRICT", "possible", 1);
  auto options = TrackerOptions::from_env();
  REQUIRE_OK(options);
  CHECK(options->strict);
  CHECK(options->strict_possible);
  ::setenv("CAPALLOC_STRICT", "sometimes", 1);
  CHECK(TrackerOptions::from_env().status().code() == absl::StatusCode::kInvalidArgument);
  ::unsetenv("CAPALLOC_STRICT");
}

TEST_CASE("a graph that rewrites its own output at a reused address is not flagged",
          "[capture][own-output]") {
  World w;
  // T written and freed; OUT takes T's address and the graph fills all of
  // OUT afterwards: a replay ends with OUT's own data there.
  float *t = nullptr, *out = nullptr;
  const CaptureResult whole = w.capture(kDefaultPool, "whole", [&] {
    t = w.tensor(N, w.side, "T");
    w.launch(w.side, fill_kernel(t, N, 1.0f));
    w.free(t);
    out = w.tensor(N, w.side, "OUT");
    w.launch(w.side, fill_kernel(out, N, 2.0f));
  });
  REQUIRE(out == t);
  CHECK(whole.new_findings.empty());
  CHECK(w.tracker->check_graph(whole.graph)->empty());
  w.run_now(fill_kernel(out, N, kCanary));
  w.replay(whole.graph);
  CHECK(all_equal(w.read(out, N), 2.0f));

  // The control: OUT2 rewritten only in its first half keeps T2's data in the
  // second half after a replay, and that is a finding.
  float *t2 = nullptr, *out2 = nullptr;
  const CaptureResult half = w.capture(kDefaultPool, "half", [&] {
    t2 = w.tensor(N, w.side, "T2");
    w.launch(w.side, fill_kernel(t2, N, 1.0f));
    w.free(t2);
    out2 = w.tensor(N, w.side, "OUT2");
    w.launch(w.side, fill_kernel(out2, N / 2, 2.0f));
  });
  REQUIRE(out2 == t2);
  REQUIRE(half.new_findings.size() == 1);
  CHECK(half.new_findings[0].victim.tag == "OUT2");
  CHECK(half.new_findings[0].writer.tag == "T2");
  w.run_now(fill_kernel(out2, N, kCanary));
  w.replay(half.graph);
  const std::vector<float> got = w.read(out2, N);
  CHECK(got[0] == 2.0f);
  CHECK(got[N - 1] == 1.0f);
}

namespace {

// Just enough JSON to prove findings_to_json's output parses: a value
// parser that, for the top-level array, collects each object's keys.
struct MiniJson {
  std::string_view s;
  std::size_t i = 0;

  void ws() {
    while (i < s.size() && std::isspace(static_cast<unsigned char>(s[i]))) ++i;
  }
  bool lit(std::string_view word) {
    if (s.substr(i, word.size()) != word) return false;
    i += word.size();
    return true;
  }
  bool str(std::string* out) {
    if (!lit("\"")) return false;
    while (i < s.size() && s[i] != '"') {
      if (static_cast<unsigned char>(s[i]) < 0x20) return false;  // must be escaped
      if (s[i] == '\\') ++i;
      if (out != nullptr && i < s.size()) out->push_back(s[i]);
      ++i;
    }
    return lit("\"");
  }
  bool number() {
    const std::size_t begin = i;
    while (i < s.size() && (std::isdigit(static_cast<unsigned char>(s[i])) ||
                            std::string_view("+-.eE").find(s[i]) != std::string_view::npos)) {
      ++i;
    }
    return i > begin;
  }
  bool value(std::vector<std::string>* keys = nullptr) {
    ws();
    if (lit("{")) {
      ws();
      if (lit("}")) return true;
      do {
        ws();
        std::string key;
        if (!str(&key)) return false;
        if (keys != nullptr) keys->push_back(key);
        ws();
        if (!lit(":") || !value()) return false;
        ws();
      } while (lit(","));
      return lit("}");
    }
    if (lit("[")) {
      ws();
      if (lit("]")) return true;
      do {
        if (!value()) return false;
        ws();
      } while (lit(","));
      return lit("]");
    }
    if (i < s.size() && s[i] == '"') return str(nullptr);
    return lit("true") || lit("false") || lit("null") || number();
  }
};

// True when `json` is an array of objects; `keys` gets each object's keys.
bool parse_findings(std::string_view json, std::vector<std::vector<std::string>>& keys) {
  MiniJson p{json};
  p.ws();
  if (!p.lit("[")) return false;
  p.ws();
  if (!p.lit("]")) {
    do {
      p.ws();
      if (p.i >= json.size() || json[p.i] != '{') return false;
      keys.emplace_back();
      if (!p.value(&keys.back())) return false;
      p.ws();
    } while (p.lit(","));
    if (!p.lit("]")) return false;
  }
  p.ws();
  return p.i == json.size();
}

}  // namespace

TEST_CASE("check and findings_to_json name the reuse chain in allocation order",
          "[capture][json]") {
  World w;
  const ArmA a = arm_a(w);
  const std::vector<Finding> all = w.tracker->check();
  REQUIRE(all.size() == 1);
  const Finding& f = all[0];
  CHECK(f.graph == a.result.graph);
  CHECK(f.overlap.ptr == a.ws);
  CHECK(f.overlap.bytes == kBytes);
  CHECK_THAT(f.fix, Catch::Contains("preallocate"));
  // The chain: T (freed in the capture), then WS (live), by sequence.
  REQUIRE(f.reuse_chain.size() == 2);
  CHECK(f.reuse_chain[0].block.sequence == a.t_seq);
  CHECK_FALSE(f.reuse_chain[0].live);
  CHECK(f.reuse_chain[0].freed_in_capture == a.capture);
  CHECK(f.reuse_chain[1].block.tag == "WS");
  CHECK(f.reuse_chain[1].live);
  CHECK(f.reuse_chain[0].block.sequence < f.reuse_chain[1].block.sequence);
  const std::vector<ChainLink> chain = w.tracker->reuse_chain(0, {a.ws, kBytes});
  REQUIRE(chain.size() == 2);
  CHECK(chain[0].block.sequence == a.t_seq);

  const std::string json = findings_to_json(all);
  INFO(json);
  std::vector<std::vector<std::string>> keys;
  REQUIRE(parse_findings(json, keys));
  REQUIRE(keys.size() == 1);
  for (const char* key : {"graph", "severity", "evidence", "writer", "victim", "overlap",
                          "reuse_chain", "fix"}) {
    CHECK(std::find(keys[0].begin(), keys[0].end(), key) != keys[0].end());
  }
  CHECK_THAT(json, Catch::Contains("\"severity\":\"hazard\""));
  CHECK_THAT(json, Catch::Contains("\"evidence\":\"declared\""));
  const std::size_t chain_at = json.find("\"reuse_chain\":[");
  REQUIRE(chain_at != std::string::npos);
  const std::size_t t_at = json.find("\"tag\":\"T\"", chain_at);
  const std::size_t ws_at = json.find("\"tag\":\"WS\"", chain_at);
  REQUIRE(t_at != std::string::npos);
  REQUIRE(ws_at != std::string::npos);
  CHECK(t_at < ws_at);

  // Tags are escaped; no findings is an empty array.
  Finding odd = f;
  odd.victim.tag = "a \"quoted\"\ttag\n";
  std::vector<std::vector<std::string>> odd_keys;
  CHECK(parse_findings(findings_to_json({odd}), odd_keys));
  CHECK(findings_to_json({}) == "[]");

  // Once WS is gone there is nothing left to clobber.
  w.free(a.ws);
  CHECK(w.tracker->check().empty());
  CHECK(w.tracker->check_graph(a.result.graph)->empty());
}

TEST_CASE("JSON output stays valid UTF-8 whatever bytes a tag holds", "[capture][json]") {
  capalloc::testing::World w;
  const std::string bad_tag = std::string("act\xff\xfe") + "\xc3(" + "ok";
  float* p = w.tensor(64, w.side, bad_tag);
  const std::string json = w.tracker->snapshot_json();
  // A strict parser rejects invalid UTF-8; the tag's bad bytes became U+FFFD.
  nlohmann::json parsed;
  REQUIRE_NOTHROW(parsed = nlohmann::json::parse(json));
  CHECK(json.find("act\xef\xbf\xbd") != std::string::npos);
  CHECK(json.find("\xff") == std::string::npos);
  w.free(p);
}

TEST_CASE("the snapshot lists every segment with the blocks tiling it, and each graph's ranges",
          "[capture][json][report]") {
  // What `capalloc report` draws (docs/snapshot.md, version 4): seed 003's
  // arm A, T freed in the capture and WS taking its address.
  capalloc::testing::World w;
  auto pool = w.alloc->create_graph_pool(0);
  REQUIRE_OK(pool);
  float* src = w.tensor(1024, kDefaultStream, "src");
  float* ws = nullptr;
  float* t = nullptr;
  const CaptureResult g = w.capture(*pool, "A.g", [&] {
    t = w.tensor(1024, w.side, "T");
    w.launch(w.side, capalloc::testing::copy_kernel(t, src, 1024));
    w.free(t);
    ws = w.tensor(1024, w.side, "WS");
  });
  REQUIRE(t == ws);
  const nlohmann::json snap = nlohmann::json::parse(w.tracker->snapshot_json());
  CHECK(snap["schema"] == "capalloc.snapshot/4");
  const nlohmann::json& pools = snap["devices"][0]["pools"];
  REQUIRE(pools.size() == 2);
  CHECK(pools[0]["kind"] == "default");
  CHECK(pools[1]["kind"] == "graph");
  CHECK(pools[1]["pool"] == *pool);
  std::size_t allocated = 0;
  std::size_t reserved = 0;
  for (const auto& p : pools) {
    for (const auto& segment : p["segments"]) {
      // The blocks tile the segment: in address order, no gap, no overlap.
      std::uint64_t at = std::stoull(segment["base"].get<std::string>(), nullptr, 16);
      for (const auto& b : segment["blocks"]) {
        CHECK(std::stoull(b["ptr"].get<std::string>(), nullptr, 16) == at);
        at += b["size"].get<std::uint64_t>();
        if (b["state"] == "allocated") {
          ++allocated;
          CHECK(b.contains("sequence"));
        } else {
          CHECK_FALSE(b.contains("sequence"));
        }
      }
      CHECK(at == std::stoull(segment["base"].get<std::string>(), nullptr, 16) +
                      segment["size"].get<std::uint64_t>());
      reserved += segment["size"].get<std::size_t>();
    }
  }
  CHECK(allocated == 2);  // src and WS
  CHECK(static_cast<std::int64_t>(reserved) == w.reserved());
  // The graph's ranges: it reads src and writes T's bytes (now WS's).
  REQUIRE(snap["graphs"].size() == 1);
  const nlohmann::json& ranges = snap["graphs"][0]["ranges"];
  REQUIRE(ranges.size() == snap["graphs"][0]["writes"].get<std::size_t>());
  bool wrote_t = false;
  bool read_src = false;
  for (const auto& r : ranges) {
    const auto begin = std::stoull(r["begin"].get<std::string>(), nullptr, 16);
    wrote_t = wrote_t || (r["mode"] == "write" && begin == reinterpret_cast<std::uintptr_t>(t) &&
                          r["op"] == "copy" && r["through"] == w.seq(ws) - 1);
    read_src = read_src || (r["mode"] == "read" && begin == reinterpret_cast<std::uintptr_t>(src));
  }
  CHECK(wrote_t);
  CHECK(read_src);
  CHECK(snap["findings"].size() == g.new_findings.size());
  w.free(ws);
  w.free(src);
}
