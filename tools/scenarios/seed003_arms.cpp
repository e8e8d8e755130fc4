// tools/scenarios/seed003_arms.cpp: see seed003_arms.hpp. The arm functions
// mirror the seed's arm_a .. arm_d line by line; comments quote its Python.
#include "tools/scenarios/seed003_arms.hpp"

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status_macros.hpp"
#include "capalloc/allocator.hpp"
#include "tools/scenarios/kernels.hpp"
#include "tools/scenarios/scenario_world.hpp"

namespace capalloc::scenarios {

namespace {

constexpr std::size_t N = kArmElements;
constexpr std::size_t kBytes = N * sizeof(float);
constexpr std::size_t kScalarBytes = sizeof(float);

// One arm's world (scenario_world.hpp) and the seed's tensor operations.
class ArmWorld : public ScenarioWorld {
 public:
  static absl::StatusOr<std::unique_ptr<ArmWorld>> create(std::shared_ptr<DeviceRuntime> rt,
                                                          const ArmsOptions& options) {
    auto w = std::unique_ptr<ArmWorld>(new ArmWorld());
    CAPALLOC_RETURN_IF_ERROR(w->open(std::move(rt), options));
    return w;
  }
  ~ArmWorld() { release_work(); }

  // torch.empty(n) on `stream`; kept until the arm ends unless freed.
  absl::StatusOr<float*> empty(std::size_t bytes, StreamHandle stream, std::string_view tag,
                               Lifetime lifetime = Lifetime::kTransient) {
    CAPALLOC_ASSIGN_OR_RETURN(void* p, alloc(bytes, stream, tag, lifetime));
    return static_cast<float*>(p);
  }
  absl::Status launch(StreamHandle stream, KernelLaunch k) {
    return rt_->launch_kernel(stream, std::move(k));
  }
  // torch.full((N,), value)
  absl::StatusOr<float*> full(float value, std::string_view tag) {
    CAPALLOC_ASSIGN_OR_RETURN(float* p, empty(kBytes, kDefaultStream, tag));
    CAPALLOC_RETURN_IF_ERROR(launch(kDefaultStream, fill_kernel(p, N, value)));
    return p;
  }
  // T = src * factor; sink = T.sum(), both on `stream` (inside a capture).
  absl::StatusOr<std::pair<float*, float*>> scaled_and_sum(float* src, float factor,
                                                           std::string_view tag,
                                                           std::string_view sum_tag) {
    CAPALLOC_ASSIGN_OR_RETURN(float* t, empty(kBytes, side_, tag));
    CAPALLOC_RETURN_IF_ERROR(launch(side_, scale_kernel(t, src, N, factor)));
    CAPALLOC_ASSIGN_OR_RETURN(float* sum, empty(kScalarBytes, side_, sum_tag));
    CAPALLOC_RETURN_IF_ERROR(launch(side_, sum_kernel(sum, t, N)));
    return std::make_pair(t, sum);
  }

  // WS.fill_(CANARY); g.replay() x times; then count what is no longer canary.
  absl::StatusOr<ReplayOutcome> replay(int graph_number, GraphHandle graph, int times, float* ws) {
    ReplayOutcome out;
    out.graph = graph_number;
    out.times = times;
    CAPALLOC_RETURN_IF_ERROR(launch(kDefaultStream, fill_kernel(ws, N, kCanary)));
    CAPALLOC_RETURN_IF_ERROR(rt_->synchronize_stream(kDefaultStream));
    for (int i = 0; i < times; ++i) {
      bool refused = false;
      absl::Status s = replay_once(graph, refused);
      if (refused) {
        out.refused = true;
        out.refusal = std::string(s.message());
        break;
      }
      CAPALLOC_RETURN_IF_ERROR(s);
    }
    CAPALLOC_RETURN_IF_ERROR(rt_->synchronize_stream(kDefaultStream));
    std::vector<float> host(N);
    CAPALLOC_RETURN_IF_ERROR(rt_->memcpy_async(host.data(), ws, kBytes, kDefaultStream));
    CAPALLOC_RETURN_IF_ERROR(rt_->synchronize_stream(kDefaultStream));
    out.clobbered = static_cast<std::uint64_t>(
        std::count_if(host.begin(), host.end(), [](float v) { return v != kCanary; }));
    out.value = host[0];
    return out;
  }

 private:
  ArmWorld() = default;
};

void append(std::vector<Finding>& to, std::vector<Finding> from) {
  for (Finding& f : from) to.push_back(std::move(f));
}

// Findings whose graph is `label`, optionally of one severity, naming WS.
bool flagged(const std::vector<Finding>& findings, std::string_view label,
             const Severity* severity = nullptr) {
  return std::any_of(findings.begin(), findings.end(), [&](const Finding& f) {
    return f.graph_label == label && f.victim.tag == "WS" &&
           (severity == nullptr || f.severity == *severity);
  });
}

// Checks one observation against the expectation, noting a mismatch.
template <typename T>
void expect(ArmResult& r, const std::string& what, const T& seen, const T& wanted) {
  if (!(seen == wanted)) {
    r.mismatches.push_back(absl::StrFormat("%s: expected %s, saw %s", what,
                                           absl::FormatStreamed(wanted),
                                           absl::FormatStreamed(seen)));
  }
}

void expect_replay(ArmResult& r, const ReplayOutcome& o, bool refused, std::uint64_t clobbered,
                   double value) {
  const std::string g = absl::StrFormat("graph %d replay", o.graph);
  expect(r, absl::StrCat(g, " refused"), o.refused, refused);
  expect(r, absl::StrCat(g, " clobbered"), o.clobbered, clobbered);
  expect(r, absl::StrCat(g, " WS[0]"), o.value, value);
}

const Severity kHazard = Severity::kHazard;

absl::StatusOr<ArmResult> arm_a(ArmWorld& w, bool strict) {
  ArmResult r{.arm = 'A', .title = "allocate during capture (status quo)",
              .alias_question = "T.ptr == WS.ptr"};
  // pool, g, s = graph_pool_handle(), CUDAGraph(), Stream(); src = full(N, 3.0)
  CAPALLOC_ASSIGN_OR_RETURN(PoolHandle pool, w.pool());
  CAPALLOC_ASSIGN_OR_RETURN(float* src, w.full(3.0f, "src"));
  float* t_ptr = nullptr;
  float* ws = nullptr;
  CAPALLOC_ASSIGN_OR_RETURN(CaptureResult g, w.capture(pool, "A.g", [&]() -> absl::Status {
    // T = src * 2.0; t_ptr = T.data_ptr(); sink = T.sum(); del T; WS = empty(N)
    CAPALLOC_ASSIGN_OR_RETURN(auto t_sink, w.scaled_and_sum(src, 2.0f, "T", "sink"));
    t_ptr = t_sink.first;
    CAPALLOC_RETURN_IF_ERROR(w.del(t_sink.first));
    CAPALLOC_ASSIGN_OR_RETURN(ws, w.empty(kBytes, w.side(), "WS"));
    return absl::OkStatus();
  }));
  r.alias = t_ptr == ws;
  r.findings_before_replay = g.new_findings;
  CAPALLOC_ASSIGN_OR_RETURN(ReplayOutcome o, w.replay(1, g.graph, 1, ws));
  r.replays.push_back(o);
  r.expectation = strict ? "alias; flagged before replay; strict mode refuses the replay, WS intact"
                         : "alias; flagged before replay; replay leaves 262144/262144 = 6.0 in WS";
  expect(r, "alias", r.alias, true);
  expect(r, "A.g flagged as hazard", flagged(r.findings_before_replay, "A.g", &kHazard), true);
  if (strict) {
    expect_replay(r, o, true, 0, kCanary);
  } else {
    expect_replay(r, o, false, N, 6.0);
  }
  return r;
}

absl::StatusOr<ArmResult> arm_b(ArmWorld& w, bool) {
  ArmResult r{.arm = 'B', .title = "allocate before capture (the fix)",
              .alias_question = "T.ptr == WS.ptr"};
  CAPALLOC_ASSIGN_OR_RETURN(PoolHandle pool, w.pool());
  CAPALLOC_ASSIGN_OR_RETURN(float* src, w.full(3.0f, "src"));
  // WS = torch.empty(N) BEFORE capture
  CAPALLOC_ASSIGN_OR_RETURN(float* ws, w.empty(kBytes, kDefaultStream, "WS"));
  float* t_ptr = nullptr;
  CAPALLOC_ASSIGN_OR_RETURN(CaptureResult g, w.capture(pool, "B.g", [&]() -> absl::Status {
    CAPALLOC_ASSIGN_OR_RETURN(auto t_sink, w.scaled_and_sum(src, 2.0f, "T", "sink"));
    t_ptr = t_sink.first;
    return w.del(t_sink.first);
  }));
  r.alias = t_ptr == ws;
  r.findings_before_replay = g.new_findings;
  // for _ in range(5): g.replay()
  CAPALLOC_ASSIGN_OR_RETURN(ReplayOutcome o, w.replay(1, g.graph, 5, ws));
  r.replays.push_back(o);
  r.expectation = "no alias; no finding; 5 replays leave 0/262144 clobbered";
  expect(r, "alias", r.alias, false);
  expect(r, "findings", r.findings_before_replay.size(), std::size_t{0});
  expect_replay(r, o, false, 0, kCanary);
  return r;
}

absl::StatusOr<ArmResult> arm_c(ArmWorld& w, bool strict) {
  ArmResult r{.arm = 'C', .title = "can a later graph steal a live block?",
              .alias_question = "U.ptr == WS.ptr (graph 2 got WS's address)"};
  CAPALLOC_ASSIGN_OR_RETURN(PoolHandle pool, w.pool());
  CAPALLOC_ASSIGN_OR_RETURN(float* src, w.full(3.0f, "src"));
  float* ws = nullptr;
  CAPALLOC_ASSIGN_OR_RETURN(CaptureResult g1, w.capture(pool, "C.g1", [&]() -> absl::Status {
    CAPALLOC_ASSIGN_OR_RETURN(auto t_sink, w.scaled_and_sum(src, 2.0f, "T", "s1"));
    CAPALLOC_RETURN_IF_ERROR(w.del(t_sink.first));
    CAPALLOC_ASSIGN_OR_RETURN(ws, w.empty(kBytes, w.side(), "WS"));  // held alive from here on
    return absl::OkStatus();
  }));
  float* u_ptr = nullptr;
  CAPALLOC_ASSIGN_OR_RETURN(CaptureResult g2, w.capture(pool, "C.g2", [&]() -> absl::Status {
    CAPALLOC_ASSIGN_OR_RETURN(auto u_sink, w.scaled_and_sum(src, 7.0f, "U", "s2"));
    u_ptr = u_sink.first;
    return w.del(u_sink.first);
  }));
  r.alias = u_ptr == ws;
  append(r.findings_before_replay, g1.new_findings);
  append(r.findings_before_replay, g2.new_findings);
  CAPALLOC_ASSIGN_OR_RETURN(ReplayOutcome o2, w.replay(2, g2.graph, 1, ws));
  r.replays.push_back(o2);
  // The seed's table adds: "graph 1's replay writes it".
  CAPALLOC_ASSIGN_OR_RETURN(ReplayOutcome o1, w.replay(1, g1.graph, 1, ws));
  r.replays.push_back(o1);
  r.expectation = strict ? "graph 2 does not get WS's address; graph 1 flagged, graph 2 clean; "
                           "graph 2's replay leaves WS alone; graph 1's replay refused"
                         : "graph 2 does not get WS's address; graph 1 flagged, graph 2 clean; "
                           "graph 2's replay leaves WS alone; graph 1's replay writes it (6.0)";
  expect(r, "alias", r.alias, false);
  expect(r, "C.g1 flagged as hazard", flagged(r.findings_before_replay, "C.g1", &kHazard), true);
  expect(r, "C.g2 flagged", flagged(r.findings_before_replay, "C.g2"), false);
  expect_replay(r, o2, false, 0, kCanary);
  if (strict) {
    expect_replay(r, o1, true, 0, kCanary);
  } else {
    expect_replay(r, o1, false, N, 6.0);
  }
  return r;
}

absl::StatusOr<ArmResult> arm_d(ArmWorld& w, bool strict) {
  ArmResult r{.arm = 'D', .title = "cross-capture (closest to vLLM)",
              .alias_question = "T.ptr == WS.ptr (graph 1's T, graph 2's WS)"};
  CAPALLOC_ASSIGN_OR_RETURN(PoolHandle pool, w.pool());
  CAPALLOC_ASSIGN_OR_RETURN(float* src, w.full(3.0f, "src"));
  float* t_ptr = nullptr;
  CAPALLOC_ASSIGN_OR_RETURN(CaptureResult g1, w.capture(pool, "D.g1", [&]() -> absl::Status {
    CAPALLOC_ASSIGN_OR_RETURN(auto t_sink, w.scaled_and_sum(src, 2.0f, "T", "s1"));
    t_ptr = t_sink.first;
    return w.del(t_sink.first);
  }));
  float* ws = nullptr;
  CAPALLOC_ASSIGN_OR_RETURN(CaptureResult g2, w.capture(pool, "D.g2", [&]() -> absl::Status {
    CAPALLOC_ASSIGN_OR_RETURN(auto v_sink, w.scaled_and_sum(src, 5.0f, "V", "s2"));
    CAPALLOC_RETURN_IF_ERROR(w.del(v_sink.first));
    CAPALLOC_ASSIGN_OR_RETURN(ws, w.empty(kBytes, w.side(), "WS"));
    return absl::OkStatus();
  }));
  r.alias = t_ptr == ws;
  append(r.findings_before_replay, g1.new_findings);
  append(r.findings_before_replay, g2.new_findings);
  CAPALLOC_ASSIGN_OR_RETURN(ReplayOutcome o1, w.replay(1, g1.graph, 1, ws));
  r.replays.push_back(o1);
  CAPALLOC_ASSIGN_OR_RETURN(ReplayOutcome o2, w.replay(2, g2.graph, 1, ws));
  r.replays.push_back(o2);
  // No graph writes WS (graph 2 only allocates it), so nothing restores it
  // after either replay: both findings are hazards.
  r.expectation =
      strict ? "alias; graph 1 and graph 2 flagged as hazards (no graph writes WS): strict "
               "mode refuses both replays and WS keeps the canary"
             : "alias; graph 1 and graph 2 flagged as hazards; replay graph 1 -> 6.0, "
               "graph 2 -> 15.0";
  expect(r, "alias", r.alias, true);
  expect(r, "D.g1 flagged as hazard", flagged(r.findings_before_replay, "D.g1", &kHazard), true);
  expect(r, "D.g2 flagged as hazard", flagged(r.findings_before_replay, "D.g2", &kHazard), true);
  if (strict) {
    expect_replay(r, o1, true, 0, kCanary);
    expect_replay(r, o2, true, 0, kCanary);
  } else {
    expect_replay(r, o1, false, N, 6.0);
    expect_replay(r, o2, false, N, 15.0);
  }
  return r;
}

}  // namespace

absl::StatusOr<ArmResult> run_arm(char arm, std::shared_ptr<DeviceRuntime> runtime,
                                  ArmsOptions options) {
  CAPALLOC_ASSIGN_OR_RETURN(auto world, ArmWorld::create(std::move(runtime), options));
  absl::StatusOr<ArmResult> result;
  switch (arm) {
    case 'A':
      result = arm_a(*world, options.strict);
      break;
    case 'B':
      result = arm_b(*world, options.strict);
      break;
    case 'C':
      result = arm_c(*world, options.strict);
      break;
    case 'D':
      result = arm_d(*world, options.strict);
      break;
    default:
      return absl::InvalidArgumentError(absl::StrFormat("no arm '%c': arms are A, B, C, D", arm));
  }
  if (!result.ok()) return result.status();
  CAPALLOC_RETURN_IF_ERROR(world->allocator().CheckInvariants());
  result->expected_match = result->mismatches.empty();
  return result;
}

absl::StatusOr<FixResult> run_fix(std::shared_ptr<DeviceRuntime> runtime, ArmsOptions options) {
  options.recorder = nullptr;  // the fix's two worlds are not drawn
  FixResult r;
  {
    // Arm A with WS requested as persistent inside the capture: refused.
    CAPALLOC_ASSIGN_OR_RETURN(auto w, ArmWorld::create(runtime, options));
    CAPALLOC_ASSIGN_OR_RETURN(PoolHandle pool, w->pool());
    CAPALLOC_ASSIGN_OR_RETURN(float* src, w->full(3.0f, "src"));
    CAPALLOC_ASSIGN_OR_RETURN(CaptureResult g, w->capture(pool, "fix.refused", [&]() -> absl::Status {
      CAPALLOC_ASSIGN_OR_RETURN(auto t_sink, w->scaled_and_sum(src, 2.0f, "T", "sink"));
      CAPALLOC_RETURN_IF_ERROR(w->del(t_sink.first));
      auto ws = w->empty(kBytes, w->side(), "WS", Lifetime::kPersistent);
      r.persistent_refused = absl::IsFailedPrecondition(ws.status());
      r.refusal = std::string(ws.status().message());
      return absl::OkStatus();
    }));
    (void)g;
    CAPALLOC_RETURN_IF_ERROR(w->allocator().CheckInvariants());
  }
  {
    // Arm A with WS preallocated during warmup: the capture only get()s it.
    CAPALLOC_ASSIGN_OR_RETURN(auto w, ArmWorld::create(runtime, options));
    CAPALLOC_ASSIGN_OR_RETURN(PoolHandle pool, w->pool());
    CAPALLOC_ASSIGN_OR_RETURN(float* src, w->full(3.0f, "src"));
    CAPALLOC_RETURN_IF_ERROR(w->cache().preallocate(0, "WS", kBytes).status());
    float* ws = nullptr;
    CAPALLOC_ASSIGN_OR_RETURN(CaptureResult g, w->capture(pool, "fix.preallocated", [&]() -> absl::Status {
      CAPALLOC_ASSIGN_OR_RETURN(auto t_sink, w->scaled_and_sum(src, 2.0f, "T", "sink"));
      CAPALLOC_RETURN_IF_ERROR(w->del(t_sink.first));
      CAPALLOC_ASSIGN_OR_RETURN(void* p, w->cache().get(0, "WS"));
      ws = static_cast<float*>(p);
      return absl::OkStatus();
    }));
    r.preallocated_findings = g.new_findings;
    CAPALLOC_ASSIGN_OR_RETURN(r.preallocated, w->replay(1, g.graph, 5, ws));
    CAPALLOC_RETURN_IF_ERROR(w->allocator().CheckInvariants());
  }
  if (!r.persistent_refused) r.mismatches.push_back("persistent WS in capture was not refused");
  if (r.refusal.find("preallocate") == std::string::npos) {
    r.mismatches.push_back("the refusal does not name the fix (preallocate)");
  }
  if (!r.preallocated_findings.empty()) r.mismatches.push_back("preallocated WS was flagged");
  if (r.preallocated.clobbered != 0) r.mismatches.push_back("preallocated WS was clobbered");
  r.expected_match = r.mismatches.empty();
  return r;
}

}  // namespace capalloc::scenarios
