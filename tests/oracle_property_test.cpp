// oracle_property_test.cpp: the tracker's verdicts against what replay
// really does to memory (issue 9's differential oracle): random capture
// programs on 1 to 4 forked streams, each graph replayed in every order that
// makes one writing node as late as its edges allow (oracle/replay_check.hpp
// says how harm is measured), and named programs that must show harm.
//
// CAPALLOC_ORACLE_PROGRAMS (default 10000) and CAPALLOC_ORACLE_SEED (default
// 1) set the run, CAPALLOC_ORACLE_FIRST the first program's number; a failure
// prints how to rerun it alone, and a shrunk program.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "capalloc/runtime.hpp"
#include "common/config.hpp"
#include "oracle/program.hpp"
#include "oracle/replay_check.hpp"
#include "test_support.hpp"

using namespace capalloc::oracle;

namespace {

// The run's size from CAPALLOC_ORACLE_* (common/config.hpp: unset means the
// default, an invalid value fails the test naming the variable).
std::uint64_t env_number(capalloc::config::Var id) {
  auto n = capalloc::config::get_number(id);
  if (!n.ok()) FAIL(n.status().ToString());
  return *n;
}

bool fails(const Program& q) {
  auto r = check_program(q);
  return r.ok() && !r->empty();
}

}  // namespace

TEST_CASE("random capture programs: every verdict agrees with the replay", "[oracle]") {
  capalloc::set_log_level("off").IgnoreError();
  using capalloc::config::Var;
  const std::uint64_t programs = env_number(Var::kOraclePrograms);
  const std::uint64_t seed = env_number(Var::kOracleSeed);
  // CAPALLOC_ORACLE_FIRST: the first program's number (to rerun one failure).
  const std::uint64_t first = env_number(Var::kOracleFirst);
  const auto start = std::chrono::steady_clock::now();
  OracleStats total;
  for (std::uint64_t k = first; k < first + programs; ++k) {
    std::mt19937_64 rng(seed * 1000003 + k);
    const Program p = generate(rng);
    OracleStats stats;
    auto verdict = check_program(p, &stats);
    REQUIRE_OK(verdict.status());
    if (!verdict->empty()) {
      const Program small = shrink(p, fails);
      FAIL("program " << k << " (CAPALLOC_ORACLE_SEED=" << seed << " CAPALLOC_ORACLE_FIRST=" << k
           << " CAPALLOC_ORACLE_PROGRAMS=1): the verdict disagrees "
           "with the replay:\n" << *verdict << "shrunk program:\n" << describe(small)
           << "its disagreement:\n" << *check_program(small));
    }
    total.add(stats);
    if ((k - first + 1) % 50000 == 0) {
      std::printf("oracle: %llu programs agree so far (%.0f s)\n",
                  static_cast<unsigned long long>(k - first + 1),
                  std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
      std::fflush(stdout);
    }
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  // The programs must exercise harm, or agreement proves nothing.
  std::printf("oracle: %llu programs (seed %llu) in %.1f s, %llu graphs, %llu replays, %llu "
              "harmed (graph, block) pairs, %llu findings, all agreeing with their replays\n",
              static_cast<unsigned long long>(programs), static_cast<unsigned long long>(seed),
              seconds, static_cast<unsigned long long>(total.graphs),
              static_cast<unsigned long long>(total.replays),
              static_cast<unsigned long long>(total.harmed),
              static_cast<unsigned long long>(total.findings));
  std::printf("oracle: findings by severity: %s\n", total.severities().c_str());
  for (const auto& [evidence, n] : total.by_evidence) {
    const std::uint64_t unconfirmed =
        total.unconfirmed.contains(evidence) ? total.unconfirmed.at(evidence) : 0;
    std::printf("oracle: %s evidence: %llu findings, %llu not borne out by any replay "
                "(possible)\n",
                evidence.c_str(), static_cast<unsigned long long>(n),
                static_cast<unsigned long long>(unconfirmed));
  }
  std::printf("oracle: %llu harmed pairs in native captures that allocate nothing (never seen "
              "by capalloc; not checked)\n",
              static_cast<unsigned long long>(total.unseen_harm));
  if (programs >= 100) CHECK(total.harmed * 10 >= programs);
}

// Named programs through the same oracle, each through the tracker
// (declared evidence) and natively (inspected: the kernels carry only their
// parameter buffers, so every access is a touch of unknown mode): each must
// agree with its replays, and show harm where it should.
namespace {

Op alloc(int b, std::size_t floats, int s = 0) { return {OpKind::kAlloc, b, 0, floats, s, 0}; }
Op free_(int b, int s = 0) { return {OpKind::kFree, b, 0, 0, s, 0}; }
Op write(int b, std::size_t lo, std::size_t hi, int s = 0) { return {OpKind::kWrite, b, lo, hi, s, 0}; }
Op read(int b, std::size_t lo, std::size_t hi, int s = 0) { return {OpKind::kRead, b, lo, hi, s, 0}; }
Op update(int b, std::size_t lo, std::size_t hi, int s = 0) { return {OpKind::kUpdate, b, lo, hi, s, 0}; }
Op memset_(int b, std::size_t lo, std::size_t hi, int s = 0) { return {OpKind::kMemset, b, lo, hi, s, 0}; }
Op join(int from, int to) { return {OpKind::kJoin, 0, 0, 0, from, to}; }

CaptureProgram capture(bool shared, int streams, std::vector<Op> ops) {
  return {.shared_pool = shared, .route = Route::kTracker, .streams = streams, .ops = std::move(ops)};
}

struct Named {
  const char* name;
  Program program;
  bool harm;  // whether the replays must show harm
};

// vLLM style: 50 graphs (one per batch size) in one shared pool, each with a
// transient and an output, only the outputs kept. A later graph's output
// lands in the part of an earlier graph's transient its own output left.
Program shared_pool_of_50() {
  Program p;
  for (int k = 0; k < 50; ++k) {
    p.captures.push_back(capture(true, 1, {alloc(2 * k, 512), write(2 * k, 0, 512), free_(2 * k),
                                           alloc(2 * k + 1, 256), write(2 * k + 1, 0, 256)}));
  }
  return p;
}

std::vector<Named> named_programs() {
  return {
      {"a victim read between a clobber and its own rewrite",
       {{}, {capture(false, 1, {alloc(0, 256), write(0, 0, 256), free_(0), alloc(1, 256),
                                read(1, 0, 256), write(1, 0, 256)})}, {}, {}},
       true},
      {"a graph input freed after the capture and reused (stale read)",
       {{256}, {capture(false, 1, {alloc(1, 256), read(0, 0, 256)})}, {0}, {256}}, true},
      {"an eager block written by a graph, freed and reused",
       {{256}, {capture(false, 1, {alloc(1, 256), write(0, 0, 256)})}, {0}, {256}}, true},
      {"seed 003 arm A: a transient's write over a block left live",
       {{}, {capture(true, 1, {alloc(0, 256), write(0, 0, 256), free_(0), alloc(1, 256)})}, {}, {}},
       true},
      {"an update of a block another graph clobbers",
       {{}, {capture(true, 1, {alloc(0, 256), write(0, 0, 256), free_(0)}),
             capture(true, 1, {alloc(1, 256), update(1, 0, 256)})}, {}, {}},
       true},
      {"a graph's own output on a transient freed earlier in the capture",
       {{}, {capture(false, 1, {alloc(0, 256), write(0, 0, 256), free_(0), alloc(1, 256),
                                write(1, 0, 256), read(1, 0, 256)})}, {}, {}},
       false},
      {"a block allocated in the capture and updated in place on a freed transient's address",
       {{}, {capture(false, 1, {alloc(0, 256), write(0, 0, 256), free_(0), alloc(1, 256),
                                update(1, 0, 256)})}, {}, {}},
       true},
      {"partial and disjoint writes: exact overlap ranges",
       {{}, {capture(false, 1, {alloc(0, 2048), write(0, 0, 64), memset_(0, 1024, 1100), free_(0),
                                alloc(1, 2048), write(1, 32, 1050)})}, {}, {}},
       true},
      {"a side stream's write after a free without record_stream, captured first",
       {{}, {capture(false, 2, {alloc(0, 256), join(0, 1), write(0, 0, 256, 1), free_(0),
                                alloc(1, 256), write(1, 0, 256)})}, {}, {}},
       true},
      {"a side stream's write after a free without record_stream, captured last",
       {{}, {capture(false, 2, {alloc(0, 256), join(0, 1), free_(0), alloc(1, 256),
                                write(1, 0, 256)})}, {}, {}},
       false},
      {"unordered branches: one writes a transient, the other the block on its address",
       {{}, {capture(false, 3, {alloc(0, 512), join(0, 1), join(0, 2), memset_(0, 0, 512, 1),
                                free_(0), alloc(1, 512), write(1, 0, 512, 0), read(1, 0, 512, 2)})},
        {}, {}},
       true},
      {"the same branches joined before the free",
       {{}, {capture(false, 2, {alloc(0, 512), join(0, 1), memset_(0, 0, 512, 1), join(1, 0),
                                free_(0), alloc(1, 512), write(1, 0, 512)})}, {}, {}},
       false},
      {"seed 003 arm B: the block allocated before the capture is clean",
       {{256}, {capture(true, 1, {alloc(1, 256), write(1, 0, 256), free_(1), write(0, 0, 256)})},
        {}, {}},
       false},
      {"50 graphs sharing one pool, vLLM style, only outputs kept", shared_pool_of_50(), true},
      {"a fork/join capture whose transient lives on the side stream",
       {{}, {capture(false, 2, {join(0, 1), alloc(0, 256, 1), write(0, 0, 256, 1), free_(0, 1),
                                join(1, 0), alloc(1, 256), write(1, 0, 256)})}, {}, {}},
       false},
      {"separate private pools never alias",
       {{}, {capture(false, 1, {alloc(0, 256), write(0, 0, 256), free_(0)}),
             capture(false, 1, {alloc(1, 256), write(1, 0, 256)})}, {}, {}},
       false},
  };
}

}  // namespace

TEST_CASE("the oracle sees the harm of named programs and agrees with their verdicts",
          "[oracle]") {
  capalloc::set_log_level("off").IgnoreError();
  for (const Named& n : named_programs()) {
    for (const Route route : {Route::kTracker, Route::kNative}) {
      Program p = n.program;
      for (CaptureProgram& c : p.captures) c.route = route;
      INFO(n.name << (route == Route::kTracker ? " (declared)" : " (native: inspected)") << "\n"
                  << describe(p));
      OracleStats stats;
      auto verdict = check_program(p, &stats);
      REQUIRE_OK(verdict.status());
      CHECK(*verdict == "");
      CHECK((stats.harmed > 0) == n.harm);
      if (n.harm) CHECK(stats.findings > 0);
      if (!n.harm && route == Route::kTracker) CHECK(stats.findings == 0);
      std::printf("oracle named: %-90s %-9s harmed %llu, findings %llu (%s), unconfirmed %llu\n",
                  n.name, route == Route::kTracker ? "declared" : "native",
                  static_cast<unsigned long long>(stats.harmed),
                  static_cast<unsigned long long>(stats.findings), stats.severities().c_str(),
                  static_cast<unsigned long long>(stats.unconfirmed.empty()
                                                      ? 0
                                                      : stats.unconfirmed.begin()->second));
    }
  }
}
