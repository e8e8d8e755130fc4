// Regression test for field report 003's aiter scenario
// (../shared/seeds/003_86a9d742a31ae316.txt, "The same thing, in aiter,
// producing a wrong GEMM result"): with a stream-keyed split-K buffer cache
// the later-captured GEMM graph returns 64 wrong outputs per dirty semaphore
// slot; with capalloc's device-keyed, preallocated buffers both graphs are
// right. Host runtime; the numbers are the seed's.
#include "capalloc/gemm.hpp"
#include "test_support.hpp"
#include "tools/scenarios/seed003_gemm.hpp"

using namespace capalloc;
using capalloc::scenarios::GemmArmResult;

namespace {

GemmArmResult run(bool status_quo) {
  auto r = scenarios::run_gemm_arm(status_quo, capalloc::testing::host_runtime());
  REQUIRE_OK(r);
  for (const std::string& m : r->mismatches) UNSCOPED_INFO("mismatch: " << m);
  REQUIRE(r->graphs.size() == 2);
  return *r;
}

}  // namespace

TEST_CASE("seed 003 GEMM status quo: g1 self-heals and g2 returns 64 wrong outputs per dirty slot",
          "[seed003][gemm][scenario]") {
  const GemmArmResult r = run(/*status_quo=*/true);
  const auto& g1 = r.graphs[0];
  const auto& g2 = r.graphs[1];
  CHECK(g1.workspace_aliases_decoy);
  CHECK(g1.wrong_outputs == 0);
  CHECK(g2.sem_slots_dirtied_in_use >= 1);
  CHECK(g2.wrong_outputs == 64 * g2.sem_slots_dirtied_in_use);
  CHECK(g2.total_outputs == 2048);
  // The seed's exact collision: one dirty slot holding the decoy's 4-byte sum,
  // 6.0 * 4194304 = 25165824.0f = 0x4BC00000.
  CHECK(g2.sem_slots_dirtied_in_use == 1);
  CHECK(g2.wrong_outputs == 64);
  CHECK(r.dirty_slot_value == 0x4BC00000u);
  // Flagged before any replay: the buffers sit where the decoy writes.
  REQUIRE_FALSE(r.findings_before_replay.empty());
  bool names_semaphore = false;
  for (const Finding& f : r.findings_before_replay) {
    names_semaphore = names_semaphore || f.victim.tag == "splitk.semaphore";
  }
  CHECK(names_semaphore);
  CHECK(r.expected_match);
}

TEST_CASE("seed 003 GEMM with capalloc: preallocated device-keyed buffers, both graphs right",
          "[seed003][gemm][scenario]") {
  const GemmArmResult r = run(/*status_quo=*/false);
  for (const auto& g : r.graphs) {
    INFO(g.graph);
    CHECK_FALSE(g.workspace_aliases_decoy);
    CHECK(g.sem_slots_dirtied == 0);
    CHECK(g.wrong_outputs == 0);
  }
  CHECK(r.findings_before_replay.empty());
  CHECK(r.expected_match);
}

namespace {

const Finding* decoy_finding_on(const GemmArmResult& r, std::string_view tag) {
  for (const Finding& f : r.findings_before_replay) {
    if (f.graph_label == "decoy" && f.victim.tag == tag) return &f;
  }
  return nullptr;
}

}  // namespace

// Issue 9, class 1: the seed's own failure must not pass strict mode. The
// GEMM graphs read the semaphore before writing it (state), so the decoy's
// clobber of it is a hazard; they write the workspace whole before reading it
// (scratch), so that clobber is the lower severity, with the reason.
TEST_CASE("seed 003 GEMM status quo: the semaphore clobber is a hazard, the workspace's is scratch",
          "[seed003][gemm][scenario][modes]") {
  const GemmArmResult r = run(/*status_quo=*/true);
  const Finding* sem = decoy_finding_on(r, "splitk.semaphore");
  const Finding* ws = decoy_finding_on(r, "splitk.workspace");
  REQUIRE(sem != nullptr);
  REQUIRE(ws != nullptr);
  CHECK(sem->severity == Severity::kHazard);
  CHECK_THAT(sem->severity_reason, Catch::Contains("g2") && Catch::Contains("state"));
  CHECK(ws->severity == Severity::kCrossGraphOutput);
  CHECK_THAT(ws->severity_reason,
             Catch::Contains("g1, g2") && Catch::Contains("writes them whole before reading"));
  CHECK(r.findings_before_replay.size() == 2);
}

TEST_CASE("seed 003 GEMM in strict mode: the decoy's replay is refused and every output is right",
          "[seed003][gemm][scenario][strict]") {
  for (bool status_quo : {true, false}) {
    INFO((status_quo ? "status quo" : "capalloc"));
    auto r = scenarios::run_gemm_arm(status_quo, capalloc::testing::host_runtime(),
                                     {.strict = true});
    REQUIRE_OK(r);
    for (const std::string& m : r->mismatches) UNSCOPED_INFO("mismatch: " << m);
    REQUIRE(r->graphs.size() == 2);
    for (const auto& g : r->graphs) {
      INFO(g.graph);
      CHECK(g.decoy_replay_refused == status_quo);
      CHECK(g.sem_slots_dirtied == 0);
      CHECK(g.wrong_outputs == 0);
    }
    CHECK(r->expected_match);
  }
}
