// host_capture.cpp: work submission, stream capture and graphs of the host
// runtime (DESIGN.md §11).
//
// Every kind of work (kernel, memset, memcpy) becomes a GraphNode. On a
// running stream the node is moved into one queued operation, which the
// worker destroys as soon as it has run; on a capturing stream it is appended
// to the capture's node list instead and does not run, with edges to the
// stream's capture dependencies (as CUDA builds them: the stream's previous
// node, plus the points of the events it waited on), and becomes the
// stream's only dependency. end_capture freezes the list and its edges into
// a shared, immutable graph. A replay is one queued operation that holds the
// graph by shared_ptr and runs its nodes one at a time, in capture order or
// in the order HostRuntimeOptions::replay_order picks (any order the edges
// allow), against the addresses they were captured with. An illegal call
// during a capture marks it invalidated, keeping the first cause, which
// end_capture reports.
#include <algorithm>
#include <atomic>
#include <cstring>
#include <type_traits>
#include <utility>

#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "runtime/declared_accesses.hpp"
#include "runtime/host_runtime.hpp"

namespace capalloc::detail {
namespace {

// Process-unique, as CUDA's capture ids are, across runtime instances.
std::atomic<CaptureId> g_next_capture_id{1};

}  // namespace

void run_graph_node(const GraphNode& node) {
  std::visit(
      [](const auto& op) {
        using Op = std::decay_t<decltype(op)>;
        if constexpr (std::is_same_v<Op, KernelLaunch>) {
          op.host_body();
        } else if constexpr (std::is_same_v<Op, MemsetNode>) {
          std::memset(op.dst, op.value, op.bytes);
        } else {
          std::memcpy(op.dst, op.src, op.bytes);
        }
      },
      node);
}

std::string graph_node_label(const GraphNode& node) {
  if (const auto* kernel = std::get_if<KernelLaunch>(&node)) return "kernel " + kernel->name;
  return std::holds_alternative<MemsetNode>(node) ? "memset" : "memcpy";
}

absl::Status HostRuntime::submit(StreamHandle stream, GraphNode node) {
  std::lock_guard lock(mu_);
  auto st = find_stream(stream, graph_node_label(node));
  if (!st.ok()) return st.status();
  if (CaptureState* capture = (*st)->capture.get(); capture != nullptr) {
    if (capture->status != CaptureStatus::kActive) return invalidated_error(*capture, stream);
    CaptureMember& member = capture->members[stream];
    const std::size_t position = capture->nodes.ops.size();
    capture->nodes.ops.push_back(std::move(node));
    capture->nodes.depends_on.add_node(member.dependencies);
    member.dependencies = {position};
    ++member.own_nodes;
    publish(*capture);
    return absl::OkStatus();
  }
  std::string label = graph_node_label(node);
  (*st)->worker.enqueue(StreamWorker::Operation{
      .label = std::move(label),
      .run = [node = std::move(node)] { run_graph_node(node); }});
  return absl::OkStatus();
}

absl::Status HostRuntime::launch_kernel(StreamHandle stream, KernelLaunch kernel) {
  return guarded("host runtime: launch_kernel", [&]() -> absl::Status {
    if (!kernel.host_body) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "launch_kernel: kernel %s has no host body; the host runtime cannot run it",
          kernel.name));
    }
    return submit(stream, GraphNode(std::move(kernel)));
  });
}

absl::Status HostRuntime::memset_async(void* dst, int value, std::size_t bytes,
                                       StreamHandle stream) {
  return guarded("host runtime: memset_async", [&]() -> absl::Status {
    if (dst == nullptr && bytes != 0) {
      return absl::InvalidArgumentError(
          absl::StrFormat("memset_async: null destination for %d bytes on stream %d", bytes,
                          stream));
    }
    return submit(stream, MemsetNode{.dst = dst, .value = value, .bytes = bytes});
  });
}

absl::Status HostRuntime::memcpy_async(void* dst, const void* src, std::size_t bytes,
                                       StreamHandle stream) {
  return guarded("host runtime: memcpy_async", [&]() -> absl::Status {
    if ((dst == nullptr || src == nullptr) && bytes != 0) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "memcpy_async: null %s for %d bytes on stream %d",
          dst == nullptr ? "destination" : "source", bytes, stream));
    }
    return submit(stream, MemcpyNode{.dst = dst, .src = src, .bytes = bytes});
  });
}

// --- Capture -------------------------------------------------------------------

absl::StatusOr<CaptureId> HostRuntime::begin_capture(StreamHandle stream, CaptureMode mode) {
  return guarded("host runtime: begin_capture", [&]() -> absl::StatusOr<CaptureId> {
    if (stream == kDefaultStream) {
      return absl::InvalidArgumentError(
          "begin_capture: the default (legacy) stream cannot be captured; capture on a "
          "stream from create_stream");
    }
    std::lock_guard lock(mu_);
    auto st = find_stream(stream, "begin_capture");
    if (!st.ok()) return st.status();
    if (const CaptureState* current = (*st)->capture.get(); current != nullptr) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "begin_capture: stream %d is already part of capture %d", stream, current->id));
    }
    auto capture = std::make_shared<CaptureState>();
    capture->id = g_next_capture_id.fetch_add(1, std::memory_order_relaxed);
    capture->mode = mode;
    capture->origin = stream;
    capture->capturing_thread = std::this_thread::get_id();
    capture->members[stream] = CaptureMember{};
    captures_.emplace(capture->id, capture);
    (*st)->capture = capture;
    publish(*capture);
    count_capture_device(*capture, (*st)->device);
    return capture->id;
  });
}

absl::StatusOr<GraphHandle> HostRuntime::end_capture(StreamHandle stream) {
  return guarded("host runtime: end_capture", [&]() -> absl::StatusOr<GraphHandle> {
    std::lock_guard lock(mu_);
    auto st = find_stream(stream, "end_capture");
    if (!st.ok()) return st.status();
    const std::shared_ptr<CaptureState> capture = (*st)->capture;
    if (capture == nullptr) {
      return absl::FailedPreconditionError(
          absl::StrFormat("end_capture: stream %d is not capturing", stream));
    }
    if (capture->origin != stream) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "end_capture: stream %d joined capture %d but did not begin it; end it on its "
          "origin stream %d",
          stream, capture->id, capture->origin));
    }

    // Whatever the outcome, the capture is over for all of its streams.
    for (const auto& [member, progress] : capture->members) {
      if (auto it = streams_.find(member); it != streams_.end()) {
        it->second->capture.reset();
        published_.publish_outside(member);
      }
    }
    captures_.erase(capture->id);
    for (int device : capture->devices) {
      active_captures_[device].fetch_sub(1, std::memory_order_release);
    }

    if (capture->status != CaptureStatus::kActive) {
      return absl::FailedPreconditionError(
          absl::StrFormat("end_capture: capture %d was invalidated by %s: %s", capture->id,
                          capture->invalidated_by, capture->invalidation_reason));
    }
    const CaptureFrontier& joined = capture->members[stream].depends_on;
    std::vector<std::string> unjoined;
    for (const auto& [member, progress] : capture->members) {
      if (member == stream) continue;
      const auto it = joined.find(member);
      const std::size_t joined_nodes = it == joined.end() ? 0 : it->second;
      if (progress.own_nodes > joined_nodes) {
        unjoined.push_back(absl::StrFormat("stream %d (%d of its %d nodes)", member,
                                           progress.own_nodes - joined_nodes,
                                           progress.own_nodes));
      }
    }
    if (!unjoined.empty()) {
      std::sort(unjoined.begin(), unjoined.end());
      return absl::FailedPreconditionError(absl::StrFormat(
          "end_capture: capture %d is unjoined: work on %s never joined back to origin stream "
          "%d; record an event after that work and make stream %d wait on it before "
          "end_capture",
          capture->id, absl::StrJoin(unjoined, ", "), stream, stream));
    }

    // The graph's node list carries what keeps its watchers waiting; both go
    // when the last holder (the graph, or a replay in flight) lets go.
    const GraphHandle graph = next_graph_;
    graphs_.emplace(graph, std::shared_ptr<const GraphNodes>(
                               new GraphNodes(std::move(capture->nodes)),
                               [keep = std::move(capture->keep_alive)](const GraphNodes* nodes) mutable {
                                 delete nodes;
                                 keep = GraphKeepAlive{};
                               }));
    graph_of_capture_[capture->id] = graph;
    capture_of_graph_[graph] = capture->id;
    ++next_graph_;
    return graph;
  });
}

absl::Status HostRuntime::watch_capture_graph(StreamHandle stream, std::function<void()> on_gone) {
  if (!on_gone) return absl::InvalidArgumentError("watch_capture_graph: no function given");
  {
    std::lock_guard lock(mu_);
    auto st = find_stream(stream, "watch_capture_graph");
    if (!st.ok()) return st.status();
    CaptureState* capture = (*st)->capture.get();
    if (capture == nullptr || capture->status != CaptureStatus::kActive) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "watch_capture_graph: stream %d is not in an active capture", stream));
    }
    capture->keep_alive.tokens.push_back(std::make_shared<LifetimeToken>(std::move(on_gone)));
  }
  return absl::OkStatus();
}

void HostRuntime::count_capture_device(CaptureState& capture, int device) {
  if (std::find(capture.devices.begin(), capture.devices.end(), device) !=
      capture.devices.end()) {
    return;
  }
  capture.devices.push_back(device);
  active_captures_[device].fetch_add(1, std::memory_order_release);
}

bool HostRuntime::any_capture_active(int device) const {
  if (device < 0 || device >= options_.device_count) return false;
  return active_captures_[device].load(std::memory_order_acquire) > 0;
}

void HostRuntime::publish(const CaptureState& capture) {
  // An ended capture's streams were published outside it by end_capture;
  // nothing changes them back (every caller passes a capture not yet ended,
  // which this checks rather than assumes).
  if (!captures_.contains(capture.id)) return;
  const std::size_t position = capture.nodes.ops.size();
  for (const auto& [member, progress] : capture.members) {
    published_.publish_member(member, capture.status, capture.id, position);
  }
}

absl::StatusOr<CaptureInfo> HostRuntime::capture_info(StreamHandle stream) {
  // The allocator asks this at every allocation and free during a capture:
  // the published state, without the lock (published_capture_states.hpp).
  // A stream not published there (unknown, destroyed) is looked up under
  // the lock, out of line so that this path saves no registers for it.
  if (CaptureInfo info; published_.read(stream, info)) return info;
  return capture_info_locked(stream);
}

absl::StatusOr<CaptureInfo> HostRuntime::capture_info_locked(StreamHandle stream) {
  return guarded("host runtime: capture_info", [&]() -> absl::StatusOr<CaptureInfo> {
    std::lock_guard lock(mu_);
    auto st = find_stream(stream, "capture_info");
    if (!st.ok()) return st.status();
    const CaptureState* capture = (*st)->capture.get();
    if (capture == nullptr) return CaptureInfo{};
    return CaptureInfo{
        .status = capture->status,
        .id = capture->id,
        .position = capture->nodes.ops.size(),
        .graph = static_cast<std::uintptr_t>(capture->id)};
  });
}

// --- Capture invalidation ------------------------------------------------------

absl::Status HostRuntime::invalidate(CaptureState& capture, std::string by,
                                     std::string_view reason) {
  if (capture.status == CaptureStatus::kActive) {
    capture.status = CaptureStatus::kInvalidated;
    capture.invalidated_by = by;
    capture.invalidation_reason = std::string(reason);
    publish(capture);
  }
  return absl::FailedPreconditionError(
      absl::StrFormat("%s is illegal during stream capture (%s); capture %d is invalidated and "
                      "its end_capture will return no graph",
                      by, reason, capture.id));
}

absl::Status HostRuntime::invalidated_error(const CaptureState& capture, StreamHandle stream) {
  return absl::FailedPreconditionError(
      absl::StrFormat("stream %d is part of capture %d, which was invalidated by %s: %s; end "
                      "the capture on stream %d",
                      stream, capture.id, capture.invalidated_by, capture.invalidation_reason,
                      capture.origin));
}

// --- Graphs --------------------------------------------------------------------

absl::Status HostRuntime::launch_graph(GraphHandle graph, StreamHandle stream) {
  return guarded("host runtime: launch_graph", [&]() -> absl::Status {
    std::lock_guard lock(mu_);
    const auto found = graphs_.find(graph);
    if (found == graphs_.end()) {
      return absl::NotFoundError(absl::StrFormat(
          "launch_graph: graph %d not found (never created or already destroyed)", graph));
    }
    std::shared_ptr<const GraphNodes> nodes = found->second;
    auto st = find_stream(stream, "launch_graph");
    if (!st.ok()) return st.status();

    if (CaptureState* capture = (*st)->capture.get(); capture != nullptr) {
      // A graph launched into a capture becomes part of it: inline its nodes.
      if (capture->status != CaptureStatus::kActive) return invalidated_error(*capture, stream);
      // Its roots wait for the stream's dependencies; its sinks (nodes no
      // other of its nodes waits for) become the stream's dependencies.
      CaptureMember& member = capture->members[stream];
      const std::size_t offset = capture->nodes.ops.size();
      std::vector<bool> waited_for(nodes->size(), false);
      for (std::size_t i = 0; i < nodes->size(); ++i) {
        capture->nodes.ops.push_back(nodes->ops[i]);
        std::vector<std::size_t> deps;
        if (nodes->depends_on.of(i).empty()) deps = member.dependencies;
        for (std::size_t d : nodes->depends_on.of(i)) {
          deps.push_back(offset + d);
          waited_for[d] = true;
        }
        capture->nodes.depends_on.add_node(deps);
      }
      if (!nodes->ops.empty()) {
        member.dependencies.clear();
        for (std::size_t i = 0; i < nodes->size(); ++i) {
          if (!waited_for[i]) member.dependencies.push_back(offset + i);
        }
      }
      member.own_nodes += nodes->size();
      capture->keep_alive.children.push_back(std::move(nodes));
      publish(*capture);
      return absl::OkStatus();
    }
    auto order = replay_order(*nodes);
    if (!order.ok()) return order.status();
    (*st)->worker.enqueue(StreamWorker::Operation{
        .label = absl::StrFormat("replay of graph %d", graph),
        .run = [nodes = std::move(nodes), order = *std::move(order)] {
          for (std::size_t i : order) run_graph_node(nodes->ops[i]);
        }});
    return absl::OkStatus();
  });
}

absl::Status HostRuntime::destroy_graph(GraphHandle graph) {
  std::lock_guard lock(mu_);
  // Replays in flight hold the node list; it dies with the last of them.
  if (graphs_.erase(graph) == 1) {
    if (auto c = capture_of_graph_.find(graph); c != capture_of_graph_.end()) {
      graph_of_capture_.erase(c->second);
      capture_of_graph_.erase(c);
    }
    return absl::OkStatus();
  }
  return absl::NotFoundError(absl::StrFormat(
      "destroy_graph: graph %d not found (never created or already destroyed)", graph));
}

namespace {

// The accesses of a graph's nodes: a kernel's declared accesses, or, for one
// that declares none, the touches its parameter buffer shows (inspected, as
// CUDA's are); memset and memcpy destinations exact, memcpy sources read.
// `copies`: the evidence of memset and memcpy nodes: declared for a graph
// captured through this runtime's calls, inspected when read from a graph
// named by CaptureInfo::graph (as a GPU runtime reads a native graph).
std::vector<GraphWrite> accesses_of(const GraphNodes& nodes, WriteEvidence copies) {
  // Sized first: growing would move every access, each with its kernel's
  // name, again. A memset or memcpy node gives at most two.
  std::size_t bound = 0;
  for (const GraphNode& node : nodes.ops) {
    const auto* kernel = std::get_if<KernelLaunch>(&node);
    bound += kernel != nullptr ? max_accesses(*kernel) : 2;
  }
  std::vector<GraphWrite> writes;
  writes.reserve(bound);
  for (std::size_t position = 0; position < nodes.size(); ++position) {
    const GraphNode& node = nodes.ops[position];
    if (const auto* kernel = std::get_if<KernelLaunch>(&node)) {
      if (declares_accesses(*kernel)) {
        append_declared_accesses(*kernel, position, writes);
      } else {
        append_parameter_touches(*kernel, position, writes);
      }
    } else if (const auto* fill = std::get_if<MemsetNode>(&node)) {
      writes.push_back(GraphWrite{.span = {fill->dst, fill->bytes}, .position = position,
                                  .op = "memset", .evidence = copies});
    } else if (const auto* copy = std::get_if<MemcpyNode>(&node)) {
      writes.push_back(GraphWrite{.span = {copy->src, copy->bytes}, .position = position,
                                  .op = "memcpy", .evidence = copies, .mode = AccessMode::kRead});
      writes.push_back(GraphWrite{.span = {copy->dst, copy->bytes}, .position = position,
                                  .op = "memcpy", .evidence = copies});
    }
  }
  return writes;
}

}  // namespace

absl::StatusOr<std::vector<GraphWrite>> HostRuntime::graph_writes(GraphHandle graph) {
  return guarded("host runtime: graph_writes", [&]() -> absl::StatusOr<std::vector<GraphWrite>> {
    std::shared_ptr<const GraphNodes> nodes;
    {
      std::lock_guard lock(mu_);
      const auto found = graphs_.find(graph);
      if (found == graphs_.end()) {
        return absl::NotFoundError(absl::StrFormat(
            "graph_writes: graph %d not found (never created or already destroyed)", graph));
      }
      nodes = found->second;
    }
    return accesses_of(*nodes, WriteEvidence::kDeclared);
  });
}

absl::StatusOr<std::shared_ptr<const GraphNodes>> HostRuntime::captured_graph(
    std::uintptr_t graph, std::string_view call) const {
  // The host runtime names a capture's graph by the capture id: the nodes so
  // far while it runs, the graph end_capture made until it is destroyed.
  if (const auto live = captures_.find(graph); live != captures_.end()) {
    return std::make_shared<const GraphNodes>(live->second->nodes);
  }
  if (const auto ended = graph_of_capture_.find(graph); ended != graph_of_capture_.end()) {
    if (const auto found = graphs_.find(ended->second); found != graphs_.end()) return found->second;
  }
  return absl::NotFoundError(absl::StrFormat(
      "%s: no capture graph %d (never captured, or its graph was destroyed)", call, graph));
}

absl::StatusOr<std::vector<GraphWrite>> HostRuntime::captured_graph_writes(std::uintptr_t graph) {
  return guarded("host runtime: captured_graph_writes",
                            [&]() -> absl::StatusOr<std::vector<GraphWrite>> {
    std::shared_ptr<const GraphNodes> nodes;
    {
      std::lock_guard lock(mu_);
      auto found = captured_graph(graph, "captured_graph_writes");
      if (!found.ok()) return found.status();
      nodes = *std::move(found);
    }
    return accesses_of(*nodes, WriteEvidence::kInspected);
  });
}

absl::StatusOr<GraphDependencies> HostRuntime::captured_graph_dependencies(std::uintptr_t graph) {
  return guarded("host runtime: captured_graph_dependencies",
                            [&]() -> absl::StatusOr<GraphDependencies> {
    std::lock_guard lock(mu_);
    auto found = captured_graph(graph, "captured_graph_dependencies");
    if (!found.ok()) return found.status();
    return (*found)->depends_on;
  });
}

absl::StatusOr<GraphDependencies> HostRuntime::graph_dependencies(GraphHandle graph) {
  return guarded("host runtime: graph_dependencies", [&]() -> absl::StatusOr<GraphDependencies> {
    std::lock_guard lock(mu_);
    const auto found = graphs_.find(graph);
    if (found == graphs_.end()) {
      return absl::NotFoundError(absl::StrFormat(
          "graph_dependencies: graph %d not found (never created or already destroyed)", graph));
    }
    return found->second->depends_on;
  });
}

absl::StatusOr<std::vector<std::size_t>> HostRuntime::replay_order(const GraphNodes& graph) const {
  std::vector<std::size_t> order;
  if (!options_.replay_order) {
    order.resize(graph.size());
    for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
    return order;
  }
  order = options_.replay_order(graph.depends_on);
  // A permutation in which every node comes after the nodes it depends on.
  std::vector<std::size_t> rank(graph.size(), graph.size());
  bool valid = order.size() == graph.size();
  for (std::size_t r = 0; valid && r < order.size(); ++r) {
    valid = order[r] < graph.size() && rank[order[r]] == graph.size();
    if (valid) rank[order[r]] = r;
  }
  for (std::size_t i = 0; valid && i < graph.size(); ++i) {
    for (std::size_t d : graph.depends_on.of(i)) valid = valid && rank[d] < rank[i];
  }
  if (!valid) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "launch_graph: HostRuntimeOptions::replay_order returned an order of %d node(s) that is "
        "not a permutation of the graph's %d nodes respecting its edges; nothing was launched",
        order.size(), graph.size()));
  }
  return order;
}

}  // namespace capalloc::detail
