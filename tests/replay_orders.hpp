// tests/replay_orders.hpp: replay orders for the host runtime's
// HostRuntimeOptions::replay_order, as the tests that prove verdicts against
// replays use them: capture order, or one node run as late as the graph's
// edges allow (so that each possible last writer gets its turn).
#ifndef CAPALLOC_TESTS_REPLAY_ORDERS_HPP_
#define CAPALLOC_TESTS_REPLAY_ORDERS_HPP_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "capalloc/runtime.hpp"

namespace capalloc::testing {

// Every node that does not depend on `late` (in capture order), then `late`,
// then the nodes that do: an order the edges allow, with `late` as late as
// they let it run. No `late`: capture order.
inline std::vector<std::size_t> late_order(const std::vector<std::vector<std::size_t>>& deps,
                                           std::optional<std::size_t> late) {
  const std::size_t n = deps.size();
  std::vector<bool> after(n, false);
  if (late && *late < n) {
    after[*late] = true;
    // Edges point to earlier positions, so one pass in capture order finds
    // every node with a path from `late`.
    for (std::size_t i = *late + 1; i < n; ++i) {
      for (std::size_t d : deps[i]) after[i] = after[i] || after[d];
    }
  }
  std::vector<std::size_t> out;
  out.reserve(n);
  for (std::size_t i = 0; i < n; ++i) {
    if (!after[i]) out.push_back(i);
  }
  for (std::size_t i = 0; i < n; ++i) {
    if (after[i]) out.push_back(i);
  }
  return out;
}

// The nodes `early` depends on (in capture order), then `early`, then every
// other node in capture order: an order the edges allow, with `early` as
// early as they let it run (so a reader reads before every write it need not
// follow).
inline std::vector<std::size_t> early_order(const std::vector<std::vector<std::size_t>>& deps,
                                            std::size_t early) {
  const std::size_t n = deps.size();
  if (early >= n) return late_order(deps, std::nullopt);
  std::vector<bool> before(n, false);
  std::vector<std::size_t> stack{early};
  while (!stack.empty()) {
    const std::size_t at = stack.back();
    stack.pop_back();
    for (std::size_t d : deps[at]) {
      if (!before[d]) {
        before[d] = true;
        stack.push_back(d);
      }
    }
  }
  std::vector<std::size_t> out;
  out.reserve(n);
  for (std::size_t i = 0; i < n; ++i) {
    if (before[i]) out.push_back(i);
  }
  out.push_back(early);
  for (std::size_t i = 0; i < n; ++i) {
    if (!before[i] && i != early) out.push_back(i);
  }
  return out;
}

// A seeded random order the edges allow: at each step, any node whose
// dependencies have all run may go next.
inline std::vector<std::size_t> random_order(const std::vector<std::vector<std::size_t>>& deps,
                                             std::uint64_t seed) {
  const std::size_t n = deps.size();
  std::vector<std::size_t> waiting(n, 0);
  std::vector<std::vector<std::size_t>> dependents(n);
  for (std::size_t i = 0; i < n; ++i) {
    waiting[i] = deps[i].size();
    for (std::size_t d : deps[i]) dependents[d].push_back(i);
  }
  std::vector<std::size_t> ready, out;
  for (std::size_t i = 0; i < n; ++i) {
    if (waiting[i] == 0) ready.push_back(i);
  }
  std::uint64_t state = seed * 0x9E3779B97F4A7C15ull + 1;
  while (!ready.empty()) {
    state ^= state << 13;
    state ^= state >> 7;
    state ^= state << 17;
    const std::size_t pick = static_cast<std::size_t>(state % ready.size());
    const std::size_t node = ready[pick];
    ready.erase(ready.begin() + static_cast<std::ptrdiff_t>(pick));
    out.push_back(node);
    for (std::size_t d : dependents[node]) {
      if (--waiting[d] == 0) ready.push_back(d);
    }
  }
  return out;
}

// Which order the next replays take; shared with the runtime's option.
struct ReplayOrder {
  std::optional<std::size_t> late;     // run this node as late as possible
  std::optional<std::size_t> early;    // or this one as early as possible
  std::optional<std::uint64_t> random;  // or a random order from this seed

  std::vector<std::size_t> order(const std::vector<std::vector<std::size_t>>& deps) const {
    if (random) return random_order(deps, *random);
    return early ? early_order(deps, *early) : late_order(deps, late);
  }
};

// Host runtime options whose replays follow `control`.
inline HostRuntimeOptions ordered_host_options(std::shared_ptr<ReplayOrder> control) {
  HostRuntimeOptions options;
  options.replay_order = [control](const GraphDependencies& deps) {
    return control->order(deps.lists());
  };
  return options;
}

}  // namespace capalloc::testing

#endif  // CAPALLOC_TESTS_REPLAY_ORDERS_HPP_
