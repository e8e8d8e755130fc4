// Regression tests for field report 003 (../shared/seeds/003_86a9d742a31ae316.txt):
// the four arms of its pure-PyTorch script, replayed on the host runtime with
// capalloc as the allocator. Each test pins both the seed's replay numbers
// and the tracker's verdict at capture end, before any replay.
#include "test_support.hpp"
#include "tools/scenarios/seed003_arms.hpp"

using namespace capalloc;
using capalloc::scenarios::ArmResult;
using capalloc::scenarios::kArmElements;
using capalloc::scenarios::kCanary;

namespace {

ArmResult run(char arm, bool strict = false) {
  auto result = scenarios::run_arm(arm, capalloc::testing::host_runtime(), {.strict = strict});
  REQUIRE_OK(result);
  for (const std::string& m : result->mismatches) UNSCOPED_INFO("mismatch: " << m);
  return *result;
}

bool flagged(const ArmResult& r, std::string_view graph, Severity severity) {
  for (const Finding& f : r.findings_before_replay) {
    if (f.graph_label == graph && f.victim.tag == "WS" && f.severity == severity) return true;
  }
  return false;
}

}  // namespace

TEST_CASE("seed 003 arm A: allocation during capture aliases T and is flagged before replay",
          "[seed003][arms]") {
  const ArmResult r = run('A');
  CHECK(r.alias);
  CHECK(flagged(r, "A.g", Severity::kHazard));
  REQUIRE(r.replays.size() == 1);
  CHECK(r.replays[0].clobbered == kArmElements);  // 262144 / 262144
  CHECK(r.replays[0].value == 6.0);                // T's result: src * 2
  CHECK(r.expected_match);
}

TEST_CASE("seed 003 arm B: allocation before capture is clean over 5 replays", "[seed003][arms]") {
  const ArmResult r = run('B');
  CHECK_FALSE(r.alias);
  CHECK(r.findings_before_replay.empty());
  REQUIRE(r.replays.size() == 1);
  CHECK(r.replays[0].times == 5);
  CHECK(r.replays[0].clobbered == 0);
  CHECK(r.replays[0].value == kCanary);
  CHECK(r.expected_match);
}

TEST_CASE("seed 003 arm C: a later graph cannot take a live block and graph 1 is flagged",
          "[seed003][arms]") {
  const ArmResult r = run('C');
  CHECK_FALSE(r.alias);  // graph 2 does not get WS's address
  CHECK(flagged(r, "C.g1", Severity::kHazard));
  for (const Finding& f : r.findings_before_replay) CHECK(f.graph_label != "C.g2");
  REQUIRE(r.replays.size() == 2);
  CHECK(r.replays[0].graph == 2);
  CHECK(r.replays[0].clobbered == 0);  // graph 2's replay leaves WS alone
  CHECK(r.replays[1].graph == 1);
  CHECK(r.replays[1].clobbered == kArmElements);  // graph 1's replay writes it
  CHECK(r.expected_match);
}

TEST_CASE("seed 003 arm D: cross-capture alias in a shared pool, both graphs write WS",
          "[seed003][arms]") {
  const ArmResult r = run('D');
  CHECK(r.alias);
  // WS is no graph's output (graph 2 only allocates it): nothing restores it,
  // so graph 1's clobber is a hazard too, not another graph's output.
  CHECK(flagged(r, "D.g1", Severity::kHazard));
  CHECK(flagged(r, "D.g2", Severity::kHazard));
  REQUIRE(r.replays.size() == 2);
  CHECK(r.replays[0].value == 6.0);   // replay graph 1 -> graph 1's T
  CHECK(r.replays[1].value == 15.0);  // replay graph 2 -> graph 2's V
  CHECK(r.replays[0].clobbered == kArmElements);
  CHECK(r.replays[1].clobbered == kArmElements);
  CHECK(r.expected_match);
}

TEST_CASE("seed 003 in strict mode: the replay guard refuses every hazard and WS survives",
          "[seed003][arms][strict]") {
  for (char arm : {'A', 'B', 'C', 'D'}) {
    INFO("arm " << arm);
    const ArmResult r = run(arm, /*strict=*/true);
    CHECK(r.expected_match);
  }
  const ArmResult a = run('A', true);
  REQUIRE(a.replays.size() == 1);
  CHECK(a.replays[0].refused);
  CHECK(a.replays[0].clobbered == 0);
}

TEST_CASE("seed 003 fix: persistent WS in capture is refused and preallocated WS stays intact",
          "[seed003][fix]") {
  auto fix = scenarios::run_fix(capalloc::testing::host_runtime());
  REQUIRE_OK(fix);
  CHECK(fix->persistent_refused);
  CHECK_THAT(fix->refusal, Catch::Contains("WS") && Catch::Contains("preallocate") &&
                               Catch::Contains("capture"));
  CHECK(fix->preallocated_findings.empty());
  CHECK(fix->preallocated.times == 5);
  CHECK(fix->preallocated.clobbered == 0);
  CHECK(fix->expected_match);
}
