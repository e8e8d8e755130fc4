// gpu_graph_impl.hpp: kernel launches, stream capture, graphs and write
// records of GpuRuntime<Api> (DESIGN.md §5, §11), and its factory
// make_gpu_runtime<Api>(); gpu_runtime.hpp has the class, gpu_runtime_impl.hpp
// the rest of its members.
//
// Capture is the native one: this runtime keeps no capture state of its own,
// so captures begun through the native API (PyTorch's) and through
// begin_capture look the same, and capture_info asks the native API every
// time. Capture positions are node counts of the graph under construction.
//
// graph_writes draws on two sources (DESIGN.md §5):
//   (a) declared: launch_kernel on a capturing stream files the kernel's
//       declared writes under the capture id, at the node count before the
//       launch, and notes the kernel nodes the device body made (the nodes
//       the stream depends on after the body that it did not depend on
//       before); end_capture moves both to the graph;
//   (b) inspected, for every node of the graph not covered by (a), in
//       GraphGetNodes order, whose index stands for the capture position
//       (the drivers list nodes in creation order, in practice though not by
//       contract; that is capture order within a stream, and approximates it
//       across joined streams): memset
//       and memcpy destinations are exact (evidence kInspected, op "memset" /
//       "memcpy"); every nonzero 8-byte-aligned word of a kernel node's
//       parameters is a candidate pointer (pointers inside by-value structs
//       included; an 8-byte integer is a candidate too), each reported as a
//       write of unknown extent {ptr, 1} (evidence kInspected, op "kernel")
//       that the tracker widens to the block it falls in; child graphs are
//       walked, their writes at the parent node's position. Host, empty,
//       event, external-semaphore and memory alloc/free nodes are taken to
//       write no device memory.
// Any other node that may write and cannot be read (a kernel whose parameter
// layout the runtime or driver cannot give, HIP's 1D and symbol copies,
// CUDA's conditional and batched memory-operation nodes, a node type this
// code does not know) makes graph_writes fail with kUnimplemented, so that
// the tracker falls back to footprint writes for the whole graph instead of
// trusting a record that leaves that node out.
#ifndef CAPALLOC_RUNTIME_GPU_GRAPH_IMPL_HPP_
#define CAPALLOC_RUNTIME_GPU_GRAPH_IMPL_HPP_

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "capalloc/runtime.hpp"
#include "common/guarded.hpp"
#include "common/status_macros.hpp"
#include "runtime/declared_accesses.hpp"
#include "runtime/gpu_api.hpp"
#include "runtime/gpu_graph_scan.hpp"
#include "runtime/gpu_native.hpp"
#include "runtime/gpu_runtime.hpp"

namespace capalloc::detail {

namespace gpu {

// The user object's destructor: runs the watcher once, from whichever native
// thread releases the last reference (no native call may be made there).
inline void run_lifetime_watcher(void* data) {
  auto* on_gone = static_cast<std::function<void()>*>(data);
  (*on_gone)();
  delete on_gone;
}

}  // namespace gpu

template <class Api>
absl::Status GpuRuntime<Api>::Graph::destroy() {
  absl::Status result;
  if (exec != nullptr) {
    if (const typename Api::Error e = Api::GraphExecDestroy(exec); e != Api::kSuccess) {
      result.Update(gpu::native_error<Api>(e, absl::StrCat(Api::kName, "GraphExecDestroy")));
    }
    exec = nullptr;
  }
  if (graph != nullptr) {
    if (const typename Api::Error e = Api::GraphDestroy(graph); e != Api::kSuccess) {
      result.Update(gpu::native_error<Api>(e, absl::StrCat(Api::kName, "GraphDestroy")));
    }
    graph = nullptr;
  }
  return result;
}

// --- Kernel launches -------------------------------------------------------------

template <class Api>
absl::Status GpuRuntime<Api>::launch_kernel(StreamHandle stream, KernelLaunch kernel) {
  if (!kernel.device_body) {
    return absl::UnimplementedError(absl::StrFormat(
        "launch_kernel: kernel %s has no device body; the %s runtime cannot run host functions",
        kernel.name, Api::kName));
  }
  static const std::string where = absl::StrCat(Api::kName, " runtime: launch_kernel");
  return guarded(where, [&]() -> absl::Status {
    const NativeStream native = gpu::native_stream<Api>(stream);
    NativeCapture<Api> before;
    bool capturing = false;
    if (Api::query_capture(native, /*with_dependencies=*/true, before) == Api::kSuccess) {
      capturing = before.status == Api::kCaptureStatusActive;
    } else {
      (void)Api::GetLastError();  // the launch itself will say what is wrong
    }
    const std::size_t position = capturing ? gpu::node_count<Api>(before.graph) : 0;
    if (absl::Status s = kernel.device_body(Api::kKind, native); !s.ok()) {
      return absl::Status(s.code(), absl::StrFormat("launch_kernel(%s, stream 0x%x): %s",
                                                    kernel.name, stream, s.message()));
    }
    if (capturing) note_captured_launch(native, before, position, kernel);
    return absl::OkStatus();
  });
}

template <class Api>
void GpuRuntime<Api>::note_captured_launch(NativeStream stream, const NativeCapture<Api>& before,
                                           std::size_t position, const KernelLaunch& kernel) {
  // The kernel nodes the body made are the stream's new dependencies. Nodes
  // it made before its last operation on the stream stay uncovered and are
  // inspected: more evidence, never less.
  std::vector<NativeGraphNode> made;
  NativeCapture<Api> after;
  if (Api::query_capture(stream, /*with_dependencies=*/true, after) == Api::kSuccess) {
    if (after.status == Api::kCaptureStatusActive && after.id == before.id) {
      for (NativeGraphNode node : after.dependencies) {
        if (std::find(before.dependencies.begin(), before.dependencies.end(), node) !=
            before.dependencies.end()) {
          continue;
        }
        typename Api::NodeType type{};
        if (Api::GraphNodeGetType(node, &type) == Api::kSuccess &&
            Api::classify_node(type) == GpuNodeKind::kKernel) {
          made.push_back(node);
        }
      }
    }
  }
  (void)Api::GetLastError();
  std::lock_guard lock(mu_);
  DeclaredWrites& declared = declared_[before.id];
  append_declared_accesses(kernel, position, declared.writes);
  declared.covered.insert(made.begin(), made.end());
}

// --- Capture ---------------------------------------------------------------------

template <class Api>
absl::StatusOr<CaptureId> GpuRuntime<Api>::begin_capture(StreamHandle stream, CaptureMode mode) {
  if (stream == kDefaultStream) {
    return absl::InvalidArgumentError(
        "begin_capture: the default (legacy) stream cannot be captured; capture on a stream "
        "from create_stream");
  }
  const NativeStream native = gpu::native_stream<Api>(stream);
  if (const typename Api::Error e = Api::StreamBeginCapture(native, gpu::to_native<Api>(mode));
      e != Api::kSuccess) {
    return gpu::native_error<Api>(e, absl::StrFormat("%sStreamBeginCapture(stream 0x%x, mode %d)",
                                                     Api::kName, stream, static_cast<int>(mode)));
  }
  NativeCapture<Api> capture;
  if (const typename Api::Error e = Api::query_capture(native, false, capture);
      e != Api::kSuccess) {
    return gpu::native_error<Api>(
        e, absl::StrFormat("%sStreamGetCaptureInfo(stream 0x%x)", Api::kName, stream));
  }
  return static_cast<CaptureId>(capture.id);
}

template <class Api>
absl::StatusOr<GraphHandle> GpuRuntime<Api>::end_capture(StreamHandle stream) {
  static const std::string where = absl::StrCat(Api::kName, " runtime: end_capture");
  return guarded(where, [&]() -> absl::StatusOr<GraphHandle> {
    const NativeStream native = gpu::native_stream<Api>(stream);
    NativeCapture<Api> capture;
    if (const typename Api::Error e = Api::query_capture(native, false, capture);
        e != Api::kSuccess) {
      return gpu::native_error<Api>(
          e, absl::StrFormat("%sStreamGetCaptureInfo(stream 0x%x)", Api::kName, stream));
    }
    if (capture.status == Api::kCaptureStatusNone) {
      return absl::FailedPreconditionError(
          absl::StrFormat("end_capture: stream 0x%x is not capturing", stream));
    }
    const CaptureId id = capture.id;
    NativeGraph graph = nullptr;
    const typename Api::Error ended = Api::StreamEndCapture(native, &graph);
    if (ended != Api::kSuccess) {
      absl::Status error = gpu::native_error<Api>(
          ended, absl::StrFormat("%sStreamEndCapture(stream 0x%x, capture %d)", Api::kName,
                                 stream, id));
      if (graph != nullptr) (void)Api::GraphDestroy(graph);
      // Ended on a stream that only joined it, or from the wrong thread, the
      // capture goes on and keeps its declared writes; otherwise it is over.
      NativeCapture<Api> now;
      const bool goes_on = Api::query_capture(native, false, now) == Api::kSuccess &&
                           now.status != Api::kCaptureStatusNone && now.id == id;
      (void)Api::GetLastError();
      if (!goes_on) {
        std::lock_guard lock(mu_);
        declared_.erase(id);
      }
      return error;
    }
    auto record = std::make_shared<Graph>();
    record->graph = graph;
    {
      std::lock_guard lock(mu_);
      if (auto it = declared_.find(id); it != declared_.end()) {
        record->declared = std::move(it->second);
        declared_.erase(it);
      }
    }
    if (const typename Api::Error e = Api::GraphInstantiateWithFlags(&record->exec, graph, 0);
        e != Api::kSuccess) {
      record->exec = nullptr;
      return gpu::native_error<Api>(
          e, absl::StrFormat("%sGraphInstantiateWithFlags(capture %d)", Api::kName, id));
    }
    std::lock_guard lock(mu_);
    const GraphHandle handle = next_graph_++;
    graphs_.emplace(handle, std::move(record));
    return handle;
  });
}

template <class Api>
absl::StatusOr<CaptureInfo> GpuRuntime<Api>::capture_info(StreamHandle stream) {
  NativeCapture<Api> capture;
  if (const typename Api::Error e =
          Api::query_capture(gpu::native_stream<Api>(stream), false, capture);
      e != Api::kSuccess) {
    return gpu::native_error<Api>(
        e, absl::StrFormat("%sStreamGetCaptureInfo(stream 0x%x)", Api::kName, stream));
  }
  if (capture.status == Api::kCaptureStatusNone) return CaptureInfo{};
  // Only an active capture's graph is valid ("valid data (other than capture
  // status) is returned only if ... the returned capture status is Active";
  // an invalidated capture's graph handle may already be gone): an
  // invalidated capture has no position.
  const bool active = capture.status == Api::kCaptureStatusActive;
  return CaptureInfo{.status = active ? CaptureStatus::kActive : CaptureStatus::kInvalidated,
                     .id = static_cast<CaptureId>(capture.id),
                     .position = active ? gpu::node_count<Api>(capture.graph) : 0,
                     .graph = active ? reinterpret_cast<std::uintptr_t>(capture.graph) : 0};
}

// --- Graphs ------------------------------------------------------------------------

template <class Api>
std::shared_ptr<typename GpuRuntime<Api>::Graph> GpuRuntime<Api>::find_graph(
    GraphHandle graph) const {
  std::lock_guard lock(mu_);
  const auto it = graphs_.find(graph);
  return it == graphs_.end() ? nullptr : it->second;
}

template <class Api>
absl::Status GpuRuntime<Api>::launch_graph(GraphHandle graph, StreamHandle stream) {
  const std::shared_ptr<Graph> record = find_graph(graph);
  if (record == nullptr) {
    return absl::NotFoundError(absl::StrFormat(
        "launch_graph: graph %d not found (never created or already destroyed)", graph));
  }
  if (const typename Api::Error e =
          Api::GraphLaunch(record->exec, gpu::native_stream<Api>(stream));
      e != Api::kSuccess) {
    return gpu::native_error<Api>(
        e, absl::StrFormat("%sGraphLaunch(graph %d, stream 0x%x)", Api::kName, graph, stream));
  }
  return absl::OkStatus();
}

template <class Api>
absl::Status GpuRuntime<Api>::destroy_graph(GraphHandle graph) {
  std::shared_ptr<Graph> record;
  {
    std::lock_guard lock(mu_);
    const auto it = graphs_.find(graph);
    if (it == graphs_.end()) {
      return absl::NotFoundError(absl::StrFormat(
          "destroy_graph: graph %d not found (never created or already destroyed)", graph));
    }
    record = std::move(it->second);
    graphs_.erase(it);
  }
  // A graph_writes call still walking the graph holds it; the native objects
  // then die with its reference. Replays in flight finish either way: the
  // native destroy of a launched graph completes asynchronously.
  if (record.use_count() == 1) return record->destroy();
  return absl::OkStatus();
}

template <class Api>
absl::StatusOr<std::vector<GraphWrite>> GpuRuntime<Api>::graph_writes(GraphHandle graph) {
  static const std::string where = absl::StrCat(Api::kName, " runtime: graph_writes");
  return guarded(where, [&]() -> absl::StatusOr<std::vector<GraphWrite>> {
    const std::shared_ptr<Graph> record = find_graph(graph);
    if (record == nullptr) {
      return absl::NotFoundError(absl::StrFormat(
          "graph_writes: graph %d not found (never created or already destroyed)", graph));
    }
    return gpu::accesses_of<Api>(record->graph, record->declared.writes,
                                 &record->declared.covered, absl::StrCat("graph ", graph));
  });
}

template <class Api>
absl::StatusOr<std::vector<GraphWrite>> GpuRuntime<Api>::captured_graph_writes(
    std::uintptr_t graph) {
  static const std::string where = absl::StrCat(Api::kName, " runtime: captured_graph_writes");
  return guarded(where, [&]() -> absl::StatusOr<std::vector<GraphWrite>> {
    if (graph == 0) return absl::InvalidArgumentError("captured_graph_writes: no graph given");
    return gpu::accesses_of<Api>(reinterpret_cast<NativeGraph>(graph), {}, nullptr,
                                 absl::StrFormat("captured graph 0x%x", graph));
  });
}

template <class Api>
absl::StatusOr<GraphDependencies> GpuRuntime<Api>::captured_graph_dependencies(
    std::uintptr_t graph) {
  static const std::string where =
      absl::StrCat(Api::kName, " runtime: captured_graph_dependencies");
  return guarded(where, [&]() -> absl::StatusOr<GraphDependencies> {
    if (graph == 0) {
      return absl::InvalidArgumentError("captured_graph_dependencies: no graph given");
    }
    return gpu::dependencies_of<Api>(reinterpret_cast<NativeGraph>(graph),
                                     absl::StrFormat("captured graph 0x%x", graph));
  });
}

template <class Api>
absl::StatusOr<GraphDependencies> GpuRuntime<Api>::graph_dependencies(GraphHandle graph) {
  static const std::string where = absl::StrCat(Api::kName, " runtime: graph_dependencies");
  return guarded(where, [&]() -> absl::StatusOr<GraphDependencies> {
    const std::shared_ptr<Graph> record = find_graph(graph);
    if (record == nullptr) {
      return absl::NotFoundError(absl::StrFormat(
          "graph_dependencies: graph %d not found (never created or already destroyed)", graph));
    }
    // Positions are GraphGetNodes indices, as graph_writes numbers them.
    return gpu::dependencies_of<Api>(record->graph, absl::StrCat("graph ", graph));
  });
}

// --- Graph lifetime ------------------------------------------------------------------

template <class Api>
absl::Status GpuRuntime<Api>::watch_capture_graph(StreamHandle stream,
                                                  std::function<void()> on_gone) {
  if constexpr (Api::kHasUserObjects) {
    if (!on_gone) return absl::InvalidArgumentError("watch_capture_graph: no function given");
    static const std::string where = absl::StrCat(Api::kName, " runtime: watch_capture_graph");
    return guarded(where, [&]() -> absl::Status {
      NativeCapture<Api> capture;
      if (const typename Api::Error e =
              Api::query_capture(gpu::native_stream<Api>(stream), false, capture);
          e != Api::kSuccess) {
        return gpu::native_error<Api>(
            e, absl::StrFormat("%sStreamGetCaptureInfo(stream 0x%x)", Api::kName, stream));
      }
      if (capture.status != Api::kCaptureStatusActive || capture.graph == nullptr) {
        return absl::FailedPreconditionError(absl::StrFormat(
            "watch_capture_graph: stream 0x%x is not in an active capture", stream));
      }
      // A user object the capture's graph owns: executable graphs made from it
      // retain it too, and a failed capture's graph releases it when dropped.
      auto* watcher = new std::function<void()>(std::move(on_gone));
      typename Api::UserObject object = nullptr;
      if (const typename Api::Error e =
              Api::UserObjectCreate(&object, watcher, &gpu::run_lifetime_watcher, 1,
                                    Api::kUserObjectNoDestructorSync);
          e != Api::kSuccess) {
        delete watcher;
        return gpu::native_error<Api>(e, absl::StrCat(Api::kName, "UserObjectCreate"));
      }
      if (const typename Api::Error e =
              Api::GraphRetainUserObject(capture.graph, object, 1, Api::kGraphUserObjectMove);
          e != Api::kSuccess) {
        Api::UserObjectRelease(object, 1);  // runs the watcher: no graph holds it
        return gpu::native_error<Api>(e, absl::StrCat(Api::kName, "GraphRetainUserObject"));
      }
      return absl::OkStatus();
    });
  } else {
    (void)stream;
    (void)on_gone;
    return absl::UnimplementedError(absl::StrCat(
        "watch_capture_graph: ", Api::kDisplayName,
        " here has no user objects, so capalloc cannot tell when a graph it did not capture "
        "is destroyed"));
  }
}

// --- Factory -------------------------------------------------------------------------

// The runtime over `Api`, for make_cuda_runtime / make_hip_runtime
// (gpu_runtimes.hpp): kUnavailable ("no CUDA device") when the native runtime
// reports no device.
template <class Api>
absl::StatusOr<std::shared_ptr<DeviceRuntime>> make_gpu_runtime() {
  int count = 0;
  if (const typename Api::Error e = Api::GetDeviceCount(&count); e != Api::kSuccess) {
    const absl::Status error =
        gpu::native_error<Api>(e, absl::StrCat(Api::kName, "GetDeviceCount"));
    return absl::UnavailableError(
        absl::StrFormat("no %s device: %s", Api::kDisplayName, error.message()));
  }
  if (count <= 0) {
    return absl::UnavailableError(absl::StrFormat("no %s device: %sGetDeviceCount found none",
                                                  Api::kDisplayName, Api::kName));
  }
  static const std::string where = absl::StrCat(Api::kName, " runtime: create");
  return guarded(where, [&]() -> absl::StatusOr<std::shared_ptr<DeviceRuntime>> {
    return std::shared_ptr<DeviceRuntime>(std::make_shared<GpuRuntime<Api>>(count));
  });
}

}  // namespace capalloc::detail

#endif  // CAPALLOC_RUNTIME_GPU_GRAPH_IMPL_HPP_
