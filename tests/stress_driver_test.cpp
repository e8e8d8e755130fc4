// The property driver behind `capalloc stress` (tools/stress): it passes on
// short seeded runs, single- and multi-threaded, and its shrinker turns a
// failing program into a small reproduction.
#include <catch2/catch.hpp>

#include <set>

#include "tools/stress/stress_driver.hpp"

using namespace capalloc::stress;

TEST_CASE("the same seed generates the same program", "[stress]") {
  const Program a = generate(11, 500), b = generate(11, 500), c = generate(12, 500);
  REQUIRE(a.size() == 500);
  bool same = true, differs = false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    same = same && describe(a[i]) == describe(b[i]);
    differs = differs || describe(a[i]) != describe(c[i]);
  }
  CHECK(same);
  CHECK(differs);
}

TEST_CASE("neighbouring seeds generate unrelated programs, not one program shifted",
          "[stress]") {
  // Seeds 1, 2 and 77 once drew one random stream from starts one draw
  // apart: the same draws in the same order, so each seed ran nearly the
  // same operations as the next (20,000 operations of seeds 1, 2 and 77
  // gave 6,389 frees each). Each operation's `pick` is 32 bits of its first
  // draw: programs from unrelated streams share almost none.
  const Program a = generate(1, 2000), b = generate(2, 2000);
  std::set<std::uint32_t> picks;
  for (const Op& op : a) picks.insert(op.pick);
  std::size_t shared = 0;
  for (const Op& op : b) shared += picks.count(op.pick);
  CHECK(shared < 10);
}

TEST_CASE("short seeded runs pass every check", "[stress]") {
  for (std::uint64_t seed : {1, 2, 3}) {
    const StressReport report = run_single(seed, 20000, {});
    INFO("seed " << seed << ": " << (report.failure ? report.failure->message : "passed"));
    REQUIRE_FALSE(report.failure.has_value());
    CHECK(report.counters.ops == 20000);
    // Every operation was followed by a CheckInvariants(), plus the final one.
    CHECK(report.counters.invariant_checks == 20001);
    CHECK(report.counters.invalid_calls_checked > 0);
    CHECK(report.counters.graphs > 0);
    CHECK(report.counters.replays > 0);
    CHECK(report.counters.ooms > 0);
    for (std::size_t k = 0; k < kOpKinds; ++k) {
      INFO(op_kind_name(static_cast<OpKind>(k)));
      CHECK(report.counters.per_kind[k] > 0);
    }
  }
}

TEST_CASE("two threads on one allocator pass every check", "[stress]") {
  const StressReport report = run_threads(5, 20000, 2, {});
  INFO((report.failure ? report.failure->message : "passed"));
  REQUIRE_FALSE(report.failure.has_value());
  CHECK(report.counters.ops == 20000);
  CHECK(report.counters.graphs > 0);
}

TEST_CASE("the shrinker reduces an injected failure to the operations it needs", "[stress]") {
  // The checker fails on an allocation made while 3 blocks are live: the
  // smallest program that shows it is 4 operations, the last an allocation.
  ExecOptions options;
  options.inject_failure = [](const Op& op, std::size_t live) -> std::optional<std::string> {
    if (op.kind == OpKind::kAlloc && live >= 3) return "an allocation with 3 blocks live";
    return std::nullopt;
  };
  const Program program = generate(7, 3000);
  const std::optional<Failure> failure = run_program(program, options);
  REQUIRE(failure.has_value());
  CHECK(failure->message.find("injected") != std::string::npos);
  const ShrinkResult shrunk = shrink(program, options, *failure, 600);
  REQUIRE(shrunk.program.size() == 4);
  CHECK(shrunk.program.back().kind == OpKind::kAlloc);
  CHECK(shrunk.failure.op_index == 3);
  // The reproduction still fails, and reads as one line per operation.
  CHECK(run_program(shrunk.program, options).has_value());
  const std::string text = format_reproduction(shrunk);
  CHECK(text.find("4 operations") != std::string::npos);
  CHECK(text.find("alloc ") != std::string::npos);
}

TEST_CASE("a program with no failure runs clean", "[stress]") {
  Counters counters;
  CHECK_FALSE(run_program(generate(9, 2000), {}, &counters).has_value());
  CHECK(counters.ops == 2000);
}
