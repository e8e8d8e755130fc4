// gpu_graph_scan_test.cpp: the GPU runtimes' graph walk (runtime/
// gpu_graph_scan.hpp) over a fake API traits type, so that what it makes of
// a graph is tested on every CI run, without a device: which nodes give
// accesses, and when the list is incomplete and the tracker must fall back
// to footprint writes. Also the parameter word scan both runtimes share.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "absl/status/status.h"
#include "runtime/declared_accesses.hpp"
#include "runtime/gpu_api.hpp"
#include "runtime/gpu_graph_scan.hpp"

namespace {

using capalloc::AccessMode;
using capalloc::GraphWrite;
using capalloc::WriteEvidence;
using capalloc::detail::GpuNodeKind;

struct FakeGraph;

// A node of the fake API: its kind, and what reading it gives.
struct FakeNode {
  GpuNodeKind kind = GpuNodeKind::kNoDeviceWrite;
  std::vector<std::uintptr_t> pointers;  // kKernel: candidate pointers
  bool readable = true;                  // kKernel: false as for a launch packed in `extra`
  void* dst = nullptr;                   // kMemset: destination, `bytes` long
  std::size_t bytes = 0;
  const FakeGraph* child = nullptr;      // kChildGraph
};

struct FakeGraph {
  std::vector<const FakeNode*> nodes;
};

// The members of an API traits type (gpu_api.hpp) that the graph walk uses.
struct FakeApi {
  using Error = int;
  using Graph = const FakeGraph*;
  using GraphNode = const FakeNode*;
  using NodeType = int;
  struct MemsetParams {
    void* dst;
    std::size_t pitch;
    unsigned value;
    unsigned elementSize;
    std::size_t width;
    std::size_t height;
  };
  struct Memcpy3DParms {
    void* dstArray;
    struct {
      void* ptr;
      std::size_t pitch, xsize, ysize;
    } dstPtr;
    struct {
      std::size_t x, y, z;
    } dstPos;
    struct {
      std::size_t width, height, depth;
    } extent;
  };
  static constexpr const char* kName = "fake";
  static constexpr Error kSuccess = 0;
  enum : int {
    kErrorMemoryAllocation = 1, kErrorInvalidValue, kErrorInvalidDevice,
    kErrorInvalidResourceHandle, kErrorNoDevice, kErrorInsufficientDriver,
    kErrorStreamCaptureUnsupported, kErrorStreamCaptureInvalidated, kErrorStreamCaptureMerge,
    kErrorStreamCaptureUnmatched, kErrorStreamCaptureUnjoined, kErrorStreamCaptureIsolation,
    kErrorStreamCaptureImplicit, kErrorCapturedEvent, kErrorStreamCaptureWrongThread,
    kErrorIllegalState,
  };
  static Error GetLastError() { return kSuccess; }
  static const char* GetErrorName(Error) { return "fakeError"; }
  static const char* GetErrorString(Error) { return "fake error"; }

  static Error GraphGetNodes(Graph graph, GraphNode* out, std::size_t* count) {
    if (out != nullptr) {
      for (std::size_t i = 0; i < *count && i < graph->nodes.size(); ++i) out[i] = graph->nodes[i];
    }
    *count = graph->nodes.size();
    return kSuccess;
  }
  static Error GraphNodeGetType(GraphNode node, NodeType* type) {
    *type = static_cast<int>(node->kind);
    return kSuccess;
  }
  static GpuNodeKind classify_node(NodeType type) { return static_cast<GpuNodeKind>(type); }
  static absl::Status read_kernel_pointer_params(GraphNode node, std::vector<std::uintptr_t>& out) {
    if (!node->readable) {
      return absl::UnimplementedError("kernel parameters cannot be inspected: packed in `extra`");
    }
    out.insert(out.end(), node->pointers.begin(), node->pointers.end());
    return absl::OkStatus();
  }
  static Error GraphMemsetNodeGetParams(GraphNode node, MemsetParams* p) {
    *p = MemsetParams{.dst = node->dst, .pitch = 0, .value = 0, .elementSize = 1,
                      .width = node->bytes, .height = 1};
    return kSuccess;
  }
  static Error GraphMemcpyNodeGetParams(GraphNode, Memcpy3DParms* p) {
    *p = Memcpy3DParms{};
    return kSuccess;
  }
  static Error GraphChildGraphNodeGetGraph(GraphNode node, Graph* child) {
    *child = node->child;
    return kSuccess;
  }
};

absl::StatusOr<std::vector<GraphWrite>> accesses(const FakeGraph& graph) {
  return capalloc::detail::gpu::accesses_of<FakeApi>(&graph, {}, nullptr, "fake graph");
}

std::uintptr_t address(const void* p) { return reinterpret_cast<std::uintptr_t>(p); }

}  // namespace

TEST_CASE("graph scan: kernels give touches, memsets exact writes, in node order",
          "[gpu_graph_scan]") {
  alignas(8) char memory[256];
  const FakeNode kernel{.kind = GpuNodeKind::kKernel,
                        .pointers = {address(memory), address(memory + 128)}};
  const FakeNode fill{.kind = GpuNodeKind::kMemset, .dst = memory + 64, .bytes = 32};
  const FakeNode event{.kind = GpuNodeKind::kNoDeviceWrite};
  const FakeGraph graph{{&kernel, &event, &fill}};
  const auto writes = accesses(graph);
  REQUIRE(writes.ok());
  REQUIRE(writes->size() == 3);
  CHECK((*writes)[0].span.ptr == memory);
  CHECK((*writes)[0].mode == AccessMode::kTouch);
  CHECK((*writes)[0].evidence == WriteEvidence::kInspected);
  CHECK((*writes)[1].span.ptr == memory + 128);
  CHECK((*writes)[2].op == "memset");
  CHECK((*writes)[2].position == 2);
  CHECK((*writes)[2].span.bytes == 32);
}

// The first GPU run (2026-12-04): one kernel whose parameters could not be
// read, beside others that could, was dropped in silence, so its clobbers
// could never be reported. Now the whole list is refused and the tracker
// falls back to footprint writes.
TEST_CASE("graph scan: one node that cannot be read makes the list incomplete, even beside "
          "inspected kernels",
          "[gpu_graph_scan]") {
  alignas(8) char memory[64];
  const FakeNode readable{.kind = GpuNodeKind::kKernel, .pointers = {address(memory)}};
  const FakeNode packed{.kind = GpuNodeKind::kKernel, .readable = false};
  const FakeGraph graph{{&readable, &packed}};
  const auto writes = accesses(graph);
  REQUIRE(writes.status().code() == absl::StatusCode::kUnimplemented);
  const std::string message(writes.status().message());
  CHECK_THAT(message, Catch::Contains("1 node(s) may write memory"));
  CHECK_THAT(message, Catch::Contains("1 of 2 uncovered kernel node(s) inspected"));
  CHECK_THAT(message, Catch::Contains("use footprint writes"));

  SECTION("an opaque writer inside a child graph counts too") {
    const FakeNode opaque{.kind = GpuNodeKind::kOpaqueWriter};
    const FakeGraph child{{&opaque}};
    const FakeNode embed{.kind = GpuNodeKind::kChildGraph, .child = &child};
    const FakeGraph parent{{&readable, &embed}};
    const auto parent_writes = accesses(parent);
    REQUIRE(parent_writes.status().code() == absl::StatusCode::kUnimplemented);
    CHECK_THAT(std::string(parent_writes.status().message()),
               Catch::Contains("writes where this runtime cannot read"));
  }
}

TEST_CASE("parameter words: pointers inside a struct passed by value are candidates",
          "[gpu_graph_scan]") {
  // As PyTorch's elementwise kernels take (int n, functor, Array<char*, 2>):
  // here an int and a float, then two pointers, in one parameter.
  struct Params {
    int count;
    float factor;
    float* dst;
    const float* src;
  };
  float a[4] = {};
  float b[4] = {};
  const Params params{.count = 4, .factor = 2.0f, .dst = a, .src = b};
  std::vector<std::uintptr_t> words;
  const auto collect = [&](std::uintptr_t word) { words.push_back(word); };
  capalloc::detail::for_each_pointer_word(&params, sizeof params, collect);
  REQUIRE(words.size() == 3);  // the (count, factor) word is a candidate too
  CHECK(words[1] == address(a));
  CHECK(words[2] == address(b));

  SECTION("zero words and a short tail are left out") {
    const Params empty{.count = 0, .factor = 0.0f, .dst = nullptr, .src = b};
    words.clear();
    capalloc::detail::for_each_pointer_word(&empty, sizeof empty - 4, collect);
    CHECK(words.empty());  // the tail holding src is 4 bytes short of a word
    capalloc::detail::for_each_pointer_word(&empty, sizeof empty, collect);
    CHECK(words == std::vector<std::uintptr_t>{address(b)});
  }
}
