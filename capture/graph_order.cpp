// capture/graph_order.cpp: see graph_order.hpp.
#include "capture/graph_order.hpp"

#include <algorithm>
#include <deque>

#include "absl/strings/str_format.h"

namespace capalloc::detail {

GraphOrder GraphOrder::capture_order() { return GraphOrder{}; }

namespace {

// One stream's capture: each node depends on the one before it alone.
bool is_chain(const GraphDependencies& edges) {
  const std::size_t n = edges.size();
  if (n != 0 && edges.edge_count() + 1 != n) return false;
  for (std::size_t i = 0; i < n; ++i) {
    const auto d = edges.of(i);
    if (i == 0 ? !d.empty() : d.size() != 1 || d[0] != i - 1) return false;
  }
  return true;
}

}  // namespace

absl::StatusOr<GraphOrder> GraphOrder::from_edges(GraphDependencies dependencies) {
  GraphOrder order;
  order.from_edges_ = true;
  order.depends_on_ = std::move(dependencies);
  const GraphDependencies& edges = order.depends_on_;
  const std::size_t n = edges.size();
  // A chain: a runs before b iff a < b, and neither the sort nor the
  // ancestor sets are needed (the edges stay, for path()).
  order.chain_ = is_chain(edges);
  if (order.chain_) return order;
  // A topological order (Kahn), which also proves there is no cycle. The
  // runtimes list nodes in creation order, which is one already; this does
  // not rely on it. Dependents are kept in one array (node d's at
  // [first[d], first[d + 1])), not a vector per node.
  std::vector<std::size_t> waiting(n, 0);
  std::vector<std::size_t> first(n + 1, 0);
  for (std::size_t i = 0; i < n; ++i) {
    for (std::size_t d : edges.of(i)) {
      if (d >= n || d == i) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "graph order: node %d depends on node %d, which is %s", i, d,
            d == i ? "itself" : absl::StrFormat("not in the graph (%d nodes)", n)));
      }
      ++waiting[i];
      ++first[d + 1];
    }
  }
  for (std::size_t d = 0; d < n; ++d) first[d + 1] += first[d];
  std::vector<std::size_t> dependents(first[n]);
  {
    std::vector<std::size_t> fill(first.begin(), first.end() - 1);
    for (std::size_t i = 0; i < n; ++i) {
      for (std::size_t d : edges.of(i)) dependents[fill[d]++] = i;
    }
  }
  std::vector<std::size_t> topological;
  topological.reserve(n);
  for (std::size_t i = 0; i < n; ++i) {
    if (waiting[i] == 0) topological.push_back(i);
  }
  for (std::size_t next = 0; next < topological.size(); ++next) {
    const std::size_t at = topological[next];
    for (std::size_t k = first[at]; k < first[at + 1]; ++k) {
      if (--waiting[dependents[k]] == 0) topological.push_back(dependents[k]);
    }
  }
  if (topological.size() != n) {
    return absl::InvalidArgumentError(
        absl::StrFormat("graph order: the edges of this %d-node graph form a cycle", n));
  }
  if (n <= kDenseLimit) {
    order.words_ = (n + 63) / 64;
    order.ancestors_.assign(n * order.words_, 0);
    for (std::size_t i : topological) {
      std::uint64_t* mine = &order.ancestors_[i * order.words_];
      for (std::size_t d : edges.of(i)) {
        const std::uint64_t* theirs = &order.ancestors_[d * order.words_];
        for (std::size_t w = 0; w < order.words_; ++w) mine[w] |= theirs[w];
        mine[d / 64] |= std::uint64_t{1} << (d % 64);
      }
    }
  }
  return order;
}

bool GraphOrder::before(std::size_t a, std::size_t b) const {
  if (a == b) return false;
  const std::size_t n = depends_on_.size();
  if (!from_edges_ || chain_ || a >= n || b >= n) return a < b;
  if (words_ != 0) return (ancestors_[b * words_ + a / 64] >> (a % 64)) & 1;
  return walk_before(a, b);
}

bool GraphOrder::walk_before(std::size_t a, std::size_t b) const {
  std::vector<bool> seen(depends_on_.size(), false);
  std::vector<std::size_t> stack{b};
  while (!stack.empty()) {
    const std::size_t at = stack.back();
    stack.pop_back();
    for (std::size_t d : depends_on_.of(at)) {
      if (d == a) return true;
      if (!seen[d]) {
        seen[d] = true;
        stack.push_back(d);
      }
    }
  }
  return false;
}

std::vector<std::size_t> GraphOrder::path(std::size_t a, std::size_t b) const {
  if (!before(a, b)) return {};
  const std::size_t n = depends_on_.size();
  if (!from_edges_ || a >= n || b >= n) return {a, b};
  // Breadth-first from b back along the edges: the shortest path.
  std::vector<std::size_t> next_toward_b(n, n);
  std::deque<std::size_t> queue{b};
  next_toward_b[b] = b;
  while (!queue.empty()) {
    const std::size_t at = queue.front();
    queue.pop_front();
    for (std::size_t d : depends_on_.of(at)) {
      if (next_toward_b[d] != n) continue;
      next_toward_b[d] = at;
      if (d == a) {
        std::vector<std::size_t> out{a};
        for (std::size_t step = a; step != b;) out.push_back(step = next_toward_b[step]);
        return out;
      }
      queue.push_back(d);
    }
  }
  return {};
}

}  // namespace capalloc::detail
