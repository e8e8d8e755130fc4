// gpu_graph_scan.hpp: the graph walk behind GpuRuntime<Api>'s graph_writes
// and graph_dependencies (gpu_graph_impl.hpp describes the record it builds):
// inspected writes of a graph's nodes in GraphGetNodes order, child graphs
// walked at their parent's position, and the graph's ordering edges by node
// index. Templates over an API traits type (gpu_api.hpp).
#ifndef CAPALLOC_RUNTIME_GPU_GRAPH_SCAN_HPP_
#define CAPALLOC_RUNTIME_GPU_GRAPH_SCAN_HPP_

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "capalloc/runtime.hpp"
#include "common/status_macros.hpp"
#include "runtime/gpu_api.hpp"
#include "runtime/gpu_native.hpp"

namespace capalloc::detail::gpu {

// How deep graph_writes follows child graphs (they nest rarely, never deeply).
inline constexpr int kMaxChildGraphDepth = 8;

// The bytes a memset node writes: `height` rows of `width` elements, `pitch`
// bytes apart.
template <class MemsetParams>
MemorySpan memset_destination(const MemsetParams& p) {
  const std::size_t row = p.width * p.elementSize;
  const std::size_t bytes = p.height <= 1 ? row : p.pitch * (p.height - 1) + row;
  return {p.dst, bytes};
}

// The bytes a memcpy node writes into linear memory: from dstPos in the
// pitched destination, `extent` (width in bytes) rows and slices. Copies into
// arrays write no allocator memory: an empty span.
template <class Memcpy3DParms>
MemorySpan memcpy_destination(const Memcpy3DParms& p) {
  if (p.dstArray != nullptr || p.dstPtr.ptr == nullptr) return {};
  const std::size_t width = p.extent.width;
  const std::size_t height = std::max<std::size_t>(p.extent.height, 1);
  const std::size_t depth = std::max<std::size_t>(p.extent.depth, 1);
  const std::size_t pitch = p.dstPtr.pitch != 0 ? p.dstPtr.pitch : width;
  const std::size_t slice = pitch * std::max<std::size_t>(p.dstPtr.ysize, height);
  const std::size_t offset = p.dstPos.z * slice + p.dstPos.y * pitch + p.dstPos.x;
  if (width == 0) return {};
  return {static_cast<const char*>(p.dstPtr.ptr) + offset,
          (depth - 1) * slice + (height - 1) * pitch + width};
}

// What one walk of a graph found besides its writes.
template <class Api>
struct GraphScan {
  const absl::flat_hash_set<typename Api::GraphNode>* covered = nullptr;
  std::size_t uncovered_kernels = 0;
  std::size_t inspected_kernels = 0;
  std::size_t skipped = 0;  // nodes that may write and could not be read
  std::string first_skip;   // why the first of them was skipped
};

template <class Api>
void note_skip(GraphScan<Api>& scan, std::string why) {
  if (scan.skipped++ == 0) scan.first_skip = std::move(why);
}

// The nodes of `graph` in GraphGetNodes order.
template <class Api>
absl::StatusOr<std::vector<typename Api::GraphNode>> graph_nodes(typename Api::Graph graph) {
  std::size_t count = 0;
  if (const typename Api::Error e = Api::GraphGetNodes(graph, nullptr, &count);
      e != Api::kSuccess) {
    return native_error<Api>(e, absl::StrCat(Api::kName, "GraphGetNodes(count)"));
  }
  std::vector<typename Api::GraphNode> nodes(count);
  if (count != 0) {
    if (const typename Api::Error e = Api::GraphGetNodes(graph, nodes.data(), &count);
        e != Api::kSuccess) {
      return native_error<Api>(e, absl::StrCat(Api::kName, "GraphGetNodes"));
    }
    nodes.resize(count);
  }
  return nodes;
}

// Appends the inspected writes of `graph`'s nodes to `out`. `parent` is the
// position of the child-graph node that embeds `graph`, if any.
template <class Api>
absl::Status scan_graph(typename Api::Graph graph, const std::size_t* parent, int depth,
                        GraphScan<Api>& scan, std::vector<GraphWrite>& out) {
  CAPALLOC_ASSIGN_OR_RETURN(const std::vector<typename Api::GraphNode> nodes,
                            graph_nodes<Api>(graph));
  for (std::size_t index = 0; index < nodes.size(); ++index) {
    const typename Api::GraphNode node = nodes[index];
    const std::size_t position = parent != nullptr ? *parent : index;
    typename Api::NodeType type{};
    if (const typename Api::Error e = Api::GraphNodeGetType(node, &type); e != Api::kSuccess) {
      note_skip(scan, native_message<Api>(e, absl::StrCat(Api::kName, "GraphNodeGetType")));
      continue;
    }
    switch (Api::classify_node(type)) {
      case GpuNodeKind::kKernel: {
        if (scan.covered != nullptr && scan.covered->contains(node)) break;
        ++scan.uncovered_kernels;
        std::vector<std::uintptr_t> pointers;
        if (absl::Status s = Api::read_kernel_pointer_params(node, pointers); !s.ok()) {
          note_skip(scan, std::string(s.message()));
          break;
        }
        ++scan.inspected_kernels;
        for (std::uintptr_t p : pointers) {
          out.push_back(GraphWrite{.span = {reinterpret_cast<const void*>(p), 1},
                                   .position = position,
                                   .op = "kernel",
                                   .evidence = WriteEvidence::kInspected,
                                   .mode = AccessMode::kTouch});
        }
        break;
      }
      case GpuNodeKind::kMemset: {
        typename Api::MemsetParams params{};
        if (const typename Api::Error e = Api::GraphMemsetNodeGetParams(node, &params);
            e != Api::kSuccess) {
          note_skip(scan,
                    native_message<Api>(e, absl::StrCat(Api::kName, "GraphMemsetNodeGetParams")));
          break;
        }
        out.push_back(
            GraphWrite{.span = memset_destination(params), .position = position, .op = "memset",
                       .evidence = WriteEvidence::kInspected});
        break;
      }
      case GpuNodeKind::kMemcpy: {
        typename Api::Memcpy3DParms params{};
        if (const typename Api::Error e = Api::GraphMemcpyNodeGetParams(node, &params);
            e != Api::kSuccess) {
          note_skip(scan,
                    native_message<Api>(e, absl::StrCat(Api::kName, "GraphMemcpyNodeGetParams")));
          break;
        }
        if (const MemorySpan span = memcpy_destination(params); span.bytes != 0) {
          out.push_back(GraphWrite{.span = span, .position = position, .op = "memcpy",
                                   .evidence = WriteEvidence::kInspected});
        }
        break;
      }
      case GpuNodeKind::kChildGraph: {
        typename Api::Graph child = nullptr;
        if (depth >= kMaxChildGraphDepth) {
          note_skip(scan, absl::StrFormat("child graphs nest deeper than %d", kMaxChildGraphDepth));
          break;
        }
        if (const typename Api::Error e = Api::GraphChildGraphNodeGetGraph(node, &child);
            e != Api::kSuccess) {
          note_skip(scan, native_message<Api>(
                              e, absl::StrCat(Api::kName, "GraphChildGraphNodeGetGraph")));
          break;
        }
        CAPALLOC_RETURN_IF_ERROR(scan_graph<Api>(child, &position, depth + 1, scan, out));
        break;
      }
      case GpuNodeKind::kOpaqueWriter:
        note_skip(scan, absl::StrFormat("a graph node of type %d writes where this runtime "
                                        "cannot read",
                                        static_cast<int>(type)));
        break;
      case GpuNodeKind::kNoDeviceWrite:
        break;
    }
  }
  return absl::OkStatus();
}

// The accesses of `graph`: `declared` first (launches through launch_kernel,
// whose kernel nodes are then not inspected), then every other node's.
template <class Api>
absl::StatusOr<std::vector<GraphWrite>> accesses_of(
    typename Api::Graph graph, const std::vector<GraphWrite>& declared,
    const absl::flat_hash_set<typename Api::GraphNode>* covered, std::string_view name) {
  std::vector<GraphWrite> writes = declared;
  GraphScan<Api> scan{.covered = covered};
  CAPALLOC_RETURN_IF_ERROR(scan_graph<Api>(graph, nullptr, 0, scan, writes));
  // One node that may write and could not be read makes the list incomplete:
  // a record built from the others would miss that node's clobbers, so the
  // tracker falls back to footprint writes for the whole graph. (Before the
  // first GPU run this fell back only when no kernel at all was inspected.)
  if (scan.skipped > 0) {
    return absl::UnimplementedError(absl::StrFormat(
        "graph_writes(%s): %d node(s) may write memory the %s runtime cannot read back "
        "(first: %s; %d of %d uncovered kernel node(s) inspected); use footprint writes",
        name, scan.skipped, Api::kName, scan.first_skip, scan.inspected_kernels,
        scan.uncovered_kernels));
  }
  std::stable_sort(writes.begin(), writes.end(), [](const GraphWrite& a, const GraphWrite& b) {
    return a.position < b.position;
  });
  return writes;
}

// The edges of `graph` by GraphGetNodes index, as graph_writes numbers nodes.
template <class Api>
absl::StatusOr<GraphDependencies> dependencies_of(typename Api::Graph graph,
                                                  std::string_view name) {
  using Node = typename Api::GraphNode;
  CAPALLOC_ASSIGN_OR_RETURN(const std::vector<Node> nodes, graph_nodes<Api>(graph));
  absl::flat_hash_map<Node, std::size_t> position;
  for (std::size_t i = 0; i < nodes.size(); ++i) position.emplace(nodes[i], i);
  std::vector<std::pair<Node, Node>> edges;
  if (const typename Api::Error e = Api::graph_edges(graph, edges); e != Api::kSuccess) {
    return native_error<Api>(e, absl::StrCat(Api::kName, "GraphGetEdges"));
  }
  std::vector<std::vector<std::size_t>> lists(nodes.size());
  for (const auto& [from, to] : edges) {
    const auto f = position.find(from);
    const auto t = position.find(to);
    if (f == position.end() || t == position.end()) {
      return absl::InternalError(absl::StrFormat(
          "graph_dependencies(%s): an edge names a node GraphGetNodes did not list", name));
    }
    lists[t->second].push_back(f->second);
  }
  return GraphDependencies::from_lists(lists);
}

}  // namespace capalloc::detail::gpu

#endif  // CAPALLOC_RUNTIME_GPU_GRAPH_SCAN_HPP_
