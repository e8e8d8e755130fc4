// capture/graph_order.hpp: the order a graph's replays respect, as the alias
// rule asks it: "does every replay run node a before node b?".
//
// Built from the runtime's edges (DeviceRuntime::graph_dependencies), or,
// where the runtime gives none, from capture order taken as the only order (a
// chain: each node before every later one), which is labelled so in
// findings. Nodes are named by position, the index GraphWrite::position uses.
//
// Cost: a chain (each node depending on the one before it alone, as one
// stream's capture is) answers by comparing positions. Otherwise a graph
// of up to kDenseLimit nodes keeps, per node, the set of its
// ancestors as a bitset (n^2/8 bytes: 2 MiB at the limit) and answers in
// O(1); a larger one answers by a walk of its edges (O(nodes + edges) per
// question).
#ifndef CAPALLOC_CAPTURE_GRAPH_ORDER_HPP_
#define CAPALLOC_CAPTURE_GRAPH_ORDER_HPP_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "capalloc/runtime.hpp"

namespace capalloc::detail {

class GraphOrder {
 public:
  static constexpr std::size_t kDenseLimit = 4096;

  // Capture order as the only order: node a is before node b iff a < b.
  static GraphOrder capture_order();
  // The order of the runtime's edges. Errors (kInvalidArgument): an edge to a
  // node that does not exist, a node depending on itself, or a cycle.
  static absl::StatusOr<GraphOrder> from_edges(GraphDependencies dependencies);

  // Whether the order comes from the graph's edges (else: capture order).
  bool from_edges() const { return from_edges_; }
  // Nodes the edges name (0 for capture order).
  std::size_t node_count() const { return depends_on_.size(); }
  // True when every replay runs node a before node b: a path of edges leads
  // from a to b. Never for a == b. Positions the edges do not name (beyond
  // the node count) fall back to capture order.
  bool before(std::size_t a, std::size_t b) const;
  // True when neither runs before the other in every replay (a != b).
  bool unordered(std::size_t a, std::size_t b) const {
    return a != b && !before(a, b) && !before(b, a);
  }
  // One path of edges from a to b (a first, b last); empty when
  // !before(a, b). Capture order's path is {a, b}.
  std::vector<std::size_t> path(std::size_t a, std::size_t b) const;

 private:
  bool walk_before(std::size_t a, std::size_t b) const;

  bool from_edges_ = false;
  bool chain_ = false;  // node i depends on node i - 1 alone (i > 0)
  GraphDependencies depends_on_;
  std::size_t words_ = 0;                  // 64-bit words per ancestor set
  std::vector<std::uint64_t> ancestors_;   // dense: node i's set at [i * words_]
};

}  // namespace capalloc::detail

#endif  // CAPALLOC_CAPTURE_GRAPH_ORDER_HPP_
