// tests/fault_injection/sweep.cpp: the fault injection test's sweep
// (tests/fault_injection_test.cpp): a scenario run once without faults, to
// count its runtime calls, then once per fault point, each run checked.
#include <catch2/catch.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "capalloc/runtime.hpp"
#include "fault_injection/harness.hpp"

namespace capalloc::fault_test {
namespace {

// Whether capalloc documents a failure of this call, in the run, as one it
// absorbs; the label of the documented behaviour, checked here, or nullopt.
// `op` is the random sequence's operation that absorbed it (null for the
// scenarios, which give no operation).
std::optional<std::string> absorbed(const InjectedFault& f, const Harness& h,
                                    const Harness::Absorbed* op) {
  // Allocator: "kResourceExhausted when the device is out of memory after
  // the cache was released and the request retried once".
  if (f.category == FaultCategory::kReserve &&
      f.status.code() == absl::StatusCode::kResourceExhausted) {
    if (h.retries == 0) return std::nullopt;
    return "reserve out of memory: retried after releasing the cache";
  }
  // Pending frees are polled, never waited for: a failed query is an event
  // not yet complete, polled again (allocator/pending_frees.cpp).
  if (f.method == "query_event") return "query_event: polled again";
  // A segment the runtime fails to release stays cached and is released
  // again later; the harness checked that the allocator still counts it and
  // that teardown released it.
  if (f.method == "release") return "release: segment kept, released again later";
  // A free deferred during a capture gets its events once the captures are
  // over, from whichever call polls next; if that fails the free stays
  // deferred and the next poll tries again (allocator/pending_frees.cpp).
  // Only the random sequence frees blocks used on other streams; a free's
  // own events are its error (deallocate reports it, the block left
  // allocated), and SplitKGemm's are its run()'s.
  if ((f.method == "record_event" || f.method == "create_event") && op != nullptr && !op->frees) {
    return "event of a deferred free: the free stays deferred, retried at the next poll";
  }
  return std::nullopt;
}

struct SweepTotals {
  std::map<std::string, int> points;      // by category
  std::map<std::string, int> outcomes;    // reached / absorbed: ... / teardown / not fired
  int runs = 0;
  int failures = 0;
};

// One run with `plan`; every check, with the fault's story on failure.
void run_point(const char* scenario_name, Scenario scenario, const FaultPlan& plan,
               SweepTotals& totals, std::uint64_t clean_count, bool deterministic) {
  const auto start = std::chrono::steady_clock::now();
  Harness h(plan);
  const absl::Status status = scenario(h);
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  h.rt->set_phase(kDone);
  const std::vector<InjectedFault> injected = h.rt->injected();
  ++totals.runs;
  std::vector<std::string> problems = h.problems;
  std::string outcome;

  // The first fault in a run decides (with a sticky plan, a teardown's
  // faults may be followed by the next world's); else the first at all.
  const InjectedFault* fault = injected.empty() ? nullptr : &injected.front();
  for (const InjectedFault& f : injected) {
    if (f.phase == kRun) {
      fault = &f;
      break;
    }
  }
  if (injected.size() > plan.count) problems.push_back("more faults injected than planned");
  if (fault == nullptr) {
    // The category made fewer calls this time: in the random sequence,
    // event polls depend on timing, and with them which cached blocks are
    // reusable, hence the reservations and releases.
    outcome = "not fired";
    if (plan.nth <= clean_count && deterministic) {
      problems.push_back(absl::StrFormat("call #%d of %d in the clean run was not made", plan.nth,
                                         clean_count));
    }
    if (!status.ok()) problems.push_back("failed with no fault: " + status.ToString());
  } else if (fault->phase == kRun) {
    if (!status.ok()) {
      outcome = "reached the caller";
      if (!absl::StrContains(status.message(), "injected fault")) {
        problems.push_back("the scenario's error does not carry the injected fault: " +
                           status.ToString());
      }
    } else if (scenario == random_scenario) {
      // Attributed per operation: the operations that absorbed a fault.
      for (const Harness::Absorbed& a : h.absorbed_in_ops) {
        if (auto label = absorbed(a.fault, h, &a)) {
          outcome = "absorbed: " + *label;
        } else {
          problems.push_back(absl::StrCat(a.what, " succeeded although ", a.fault.call,
                                          " failed: the failure did not reach the caller"));
        }
      }
      if (h.absorbed_in_ops.empty()) problems.push_back("fault injected outside any operation");
    } else if (auto label = absorbed(*fault, h, nullptr)) {
      outcome = "absorbed: " + *label;
    } else {
      problems.push_back("the scenario succeeded: the failure did not reach the caller");
    }
    if (status.ok() && !h.mismatches.empty()) {
      problems.push_back("an absorbed fault changed the results: " +
                         absl::StrJoin(h.mismatches, "; "));
    }
  } else {
    // In a teardown: no caller is left to tell; the scenario's result stands.
    outcome = "in teardown";
    if (!status.ok()) {
      problems.push_back("a teardown fault failed the scenario: " + status.ToString());
    }
    if (!h.mismatches.empty()) {
      problems.push_back("a teardown fault changed the results: " +
                         absl::StrJoin(h.mismatches, "; "));
    }
  }

  // Nothing held after teardown, but what failed releases in the teardown
  // itself left: each held resource must be one a release or destroy failed
  // on there, when nobody was left to retry it.
  std::vector<std::string> leaked;
  std::size_t left_by_teardown = 0;
  for (const auto& [kind, handle] : h.rt->held()) {
    const bool named = std::any_of(injected.begin(), injected.end(), [&](const InjectedFault& f) {
      return f.phase != kRun && f.held == kind && f.handle == handle;
    });
    if (named) {
      ++left_by_teardown;
    } else {
      leaked.push_back(absl::StrFormat("%d:%#x", static_cast<int>(kind), handle));
    }
  }
  if (!leaked.empty()) {
    problems.push_back(absl::StrCat("after teardown the runtime still holds ",
                                    h.rt->describe_outstanding(), " (",
                                    h.rt->outstanding().describe(), ")"));
  } else if (left_by_teardown > 0) {
    outcome += " (left held: what its failed release named)";
  }

  ++totals.outcomes[outcome];
  if (std::getenv("FAULT_SWEEP_VERBOSE") != nullptr) {
    std::printf("%s | %.0f ms | %s #%d x%d | %s | %s | %s\n", scenario_name, ms,
                plan.category ? std::string(fault_category_name(*plan.category)).c_str() : "any",
                static_cast<int>(plan.nth), static_cast<int>(plan.count),
                fault ? fault->call.c_str() : "-", fault ? fault->phase.c_str() : "-",
                outcome.c_str());
  }
  if (!problems.empty()) {
    ++totals.failures;
    const std::string story = absl::StrFormat(
        "%s, %s call #%d%s: %s\nscenario returned: %s\nproblems:\n  %s", scenario_name,
        plan.category ? std::string(fault_category_name(*plan.category)) : "any", plan.nth,
        absl::StrCat(plan.code ? absl::StrCat(" (code ", absl::StatusCodeToString(*plan.code), ")")
                               : "",
                     plan.count > 1 ? absl::StrCat(" and the ", plan.count - 1, " after it") : ""),
        fault ? absl::StrCat(fault->call, " in the ", fault->phase) : "not fired",
        status.ToString(), absl::StrJoin(problems, "\n  "));
    FAIL_CHECK(story);
  }
}

// The N to sweep for a category with `count` calls: all of them up to
// `cap`, else `cap` spread evenly, first and last included.
std::vector<std::uint64_t> sample(std::uint64_t count, std::uint64_t cap) {
  std::vector<std::uint64_t> ns;
  if (count <= cap) {
    for (std::uint64_t n = 1; n <= count; ++n) ns.push_back(n);
    return ns;
  }
  if (cap == 1) return {1};
  for (std::uint64_t i = 0; i < cap; ++i) ns.push_back(1 + i * (count - 1) / (cap - 1));
  ns.erase(std::unique(ns.begin(), ns.end()), ns.end());
  return ns;
}

}  // namespace

// FAULT_SWEEP_CAP=<n> sweeps up to n points per category instead
// (0: every call); a variant of a category (reserve has three) counts apart.
void sweep(const char* name, Scenario scenario, std::uint64_t cap, bool deterministic) {
  if (const char* env = std::getenv("FAULT_SWEEP_CAP"); env != nullptr && *env != '\0') {
    cap = std::strtoull(env, nullptr, 10);
    if (cap == 0) cap = ~std::uint64_t{0};
  }
  // FAULT_SWEEP_COUNT=<k> fails k calls in a row from each point (a
  // sticky error) instead of one.
  const std::uint64_t sticky = std::max<std::uint64_t>(env_or("FAULT_SWEEP_COUNT", 1), 1);
  // The allocator logs the releases that fail (as it should): hundreds of
  // lines here, all expected.
  const std::string level = capalloc::log_level_from_env().value_or("warn");
  capalloc::set_log_level("off").IgnoreError();
  struct RestoreLevel {
    std::string level;
    ~RestoreLevel() { capalloc::set_log_level(level).IgnoreError(); }
  } restore{level};
  const auto start = std::chrono::steady_clock::now();
  // The clean run: no fault, every check, and the counts.
  Harness clean(FaultPlan{});
  const absl::Status status = scenario(clean);
  {
    INFO(name << " without faults: " << status.ToString() << "\n  "
              << absl::StrJoin(clean.problems, "\n  ") << absl::StrJoin(clean.mismatches, "\n  "));
    REQUIRE(status.ok());
    REQUIRE(clean.problems.empty());
    REQUIRE(clean.mismatches.empty());
    REQUIRE(clean.absorbed_in_ops.empty());
    REQUIRE(clean.rt->outstanding().none());
  }
  const auto counts = clean.rt->calls();

  SweepTotals totals;
  std::vector<std::string> per_category;
  for (FaultCategory c : capalloc::detail::kAllFaultCategories) {
    const std::uint64_t count = counts[static_cast<std::size_t>(c)];
    // Reserve three times: out of memory (which the allocator retries
    // once), out of memory on the retry too, and an error it does not retry.
    std::vector<FaultPlan> variants = {FaultPlan{.category = c, .count = sticky}};
    if (c == FaultCategory::kReserve) {
      variants.push_back(FaultPlan{.category = c, .count = std::max<std::uint64_t>(sticky, 2)});
      variants.push_back(
          FaultPlan{.category = c, .count = sticky, .code = absl::StatusCode::kInternal});
    }
    int points = 0;
    for (FaultPlan plan : variants) {
      for (std::uint64_t n : sample(count, cap)) {
        plan.nth = n;
        run_point(name, scenario, plan, totals, count, deterministic);
        ++points;
      }
    }
    totals.points[std::string(fault_category_name(c))] = points;
    per_category.push_back(
        absl::StrFormat("%s %d/%d", fault_category_name(c), points, count));
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::vector<std::string> outcomes;
  for (const auto& [outcome, n] : totals.outcomes) {
    outcomes.push_back(absl::StrCat(n, " ", outcome));
  }
  WARN(absl::StrFormat(
      "fault injection, %s: %d fault points swept in %.1f s (swept/calls per category: %s); "
      "outcomes: %s; %d failing",
      name, totals.runs, seconds, absl::StrJoin(per_category, ", "),
      absl::StrJoin(outcomes, ", "), totals.failures));
}

}  // namespace capalloc::fault_test
