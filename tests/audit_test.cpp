// The retention audit (capalloc/audit.hpp): checkpoint() and live_since()
// name the blocks a step left behind, with their tag and allocation site.
// The regression tests are modelled on seeds 000 and 002 (../shared/seeds/):
// a helper keeps a reference to a block past its owner's scope, in a cycle
// that only a later collection would break, and the audit names the block,
// its tag and its allocation site.
#include <memory>
#include <string>
#include <vector>

#include "capalloc/allocator.hpp"
#include "capalloc/audit.hpp"
#include "test_support.hpp"

using namespace capalloc;
using capalloc::testing::host_runtime;

namespace {

// A device buffer owned through shared_ptr, as a framework's tensor: freed
// when its last reference goes.
struct DeviceBuffer {
  Allocator* allocator = nullptr;
  void* ptr = nullptr;
  ~DeviceBuffer() {
    if (ptr != nullptr) allocator->deallocate(ptr).IgnoreError();
  }
};

// Seed 000's launch path: the call state caches the launch's arguments (the
// thread-local DLTensor adaptor that is never cleared), and refers to itself
// (the cached CallState lives as long as the kernel's cache: here, a cycle).
struct CallState {
  std::shared_ptr<CallState> self;
  std::shared_ptr<DeviceBuffer> last_input;
  std::shared_ptr<DeviceBuffer> last_output;
};

// The allocation sites the audit must name: not inlined, so that each is a
// frame of its own.
[[gnu::noinline]] std::shared_ptr<DeviceBuffer> seed000_allocate_projection_input(Allocator& a) {
  auto p = a.allocate(std::size_t{3} << 20, 0, kDefaultStream);
  REQUIRE_OK(p);
  return std::shared_ptr<DeviceBuffer>(new DeviceBuffer{&a, *p});
}

[[gnu::noinline]] std::shared_ptr<DeviceBuffer> seed000_allocate_projection_output(Allocator& a) {
  auto p = a.allocate(std::size_t{5} << 20, 0, kDefaultStream, {.tag = "vision.proj.output"});
  REQUIRE_OK(p);
  return std::shared_ptr<DeviceBuffer>(new DeviceBuffer{&a, *p});
}

// The layout-dynamic launch: keeps its arguments in the cached call state.
[[gnu::noinline]] void seed000_layout_dynamic_launch(std::shared_ptr<CallState>& cache,
                                                     const std::shared_ptr<DeviceBuffer>& in,
                                                     const std::shared_ptr<DeviceBuffer>& out) {
  auto state = std::make_shared<CallState>();
  state->self = state;  // the cycle
  state->last_input = in;
  state->last_output = out;
  cache = state;
}

const LiveGroup* group_tagged(const LiveSince& live, const std::string& tag) {
  for (const LiveGroup& g : live.groups) {
    if (g.tag == tag) return &g;
  }
  return nullptr;
}

std::string stack_text(const LiveGroup& g) {
  std::string s;
  for (const std::string& f : g.stack) s += f + "\n";
  return s;
}

}  // namespace

TEST_CASE("audit: seed 000, a launch path that keeps the last launch's tensors is named by "
          "live_since with tag and allocation site",
          "[audit][seed000]") {
  auto alloc = Allocator::create(host_runtime()).value();
  alloc->set_record_stacks(true);
  void* before = alloc->allocate(4096).value();  // before the checkpoint: never listed
  const AuditCheckpoint cp = alloc->checkpoint();
  std::shared_ptr<CallState> cache;
  const void* input_ptr = nullptr;
  const void* output_ptr = nullptr;
  {
    // The owner (vLLM's profile run) allocates, launches, and drops its
    // buffers when the scope ends.
    AllocationTagScope scope(*alloc, "vision.proj.input");
    auto in = seed000_allocate_projection_input(*alloc);
    auto out = seed000_allocate_projection_output(*alloc);
    input_ptr = in->ptr;
    output_ptr = out->ptr;
    seed000_layout_dynamic_launch(cache, in, out);
  }
  // The owner's last reference: the cycle keeps the state alive (the weak
  // reference is the test's, to break the cycle at the end as a collection
  // would, so that nothing leaks).
  const std::weak_ptr<CallState> pinned = cache;
  cache.reset();

  const LiveSince live = alloc->live_since(cp);
  INFO(live_since_to_json(live));
  CHECK(live.blocks == 2);
  CHECK(live.bytes == (std::size_t{8} << 20));
  REQUIRE(live.groups.size() == 2);
  // Most bytes first: the output, tagged by its own allocation.
  CHECK(live.groups[0].tag == "vision.proj.output");
  const LiveGroup* input = group_tagged(live, "vision.proj.input");  // from the tag scope
  const LiveGroup* output = group_tagged(live, "vision.proj.output");
  REQUIRE(input != nullptr);
  REQUIRE(output != nullptr);
  REQUIRE(input->block_list.size() == 1);
  CHECK(input->block_list[0].ptr == input_ptr);
  CHECK(input->block_list[0].requested == (std::size_t{3} << 20));
  CHECK(output->block_list[0].ptr == output_ptr);
  INFO(stack_text(*input));
  CHECK_THAT(input->site, Catch::Contains("seed000_allocate_projection_input"));
  CHECK_THAT(output->site, Catch::Contains("seed000_allocate_projection_output"));
  CHECK(input->location.empty());  // the scope named no call site

  // The fix (clear the cached arguments after the launch): nothing is left.
  {
    auto in = seed000_allocate_projection_input(*alloc);
    auto out = seed000_allocate_projection_output(*alloc);
    seed000_layout_dynamic_launch(cache, in, out);
    cache->last_input.reset();
    cache->last_output.reset();
    cache->self.reset();
    cache.reset();
  }
  // The earlier state is still in its cycle: break it the way a collection
  // would, and the audit is empty.
  const LiveSince still = alloc->live_since(cp);
  CHECK(still.blocks == 2);
  {
    std::shared_ptr<CallState> state = pinned.lock();
    REQUIRE(state != nullptr);
    state->self.reset();  // the collection: the state and its buffers go
  }
  CHECK(pinned.expired());
  CHECK(alloc->live_since(cp).blocks == 0);
  REQUIRE_OK(alloc->deallocate(before));
  REQUIRE_OK(alloc->CheckInvariants());
}

namespace {

// Seed 002's decorator frames, in C++: a frame holds its locals and its
// caller (f_back); the decorator binds its own frame to one of its locals,
// a cycle that pins every caller's locals until a collection.
struct Frame {
  std::shared_ptr<Frame> f_back;
  std::vector<std::shared_ptr<DeviceBuffer>> locals;
  std::shared_ptr<Frame> cur_frame;  // the local that names the frame itself
};

// Returns a weak reference to its frame, for the test to break the cycle at
// the end as a collection would.
[[gnu::noinline]] std::weak_ptr<Frame> seed002_cute_kernel_decorator(
    const std::shared_ptr<Frame>& caller) {
  auto frame = std::make_shared<Frame>();
  frame->f_back = caller;
  frame->cur_frame = frame;  // cur_frame = inspect.currentframe()
  return frame;
}

}  // namespace

TEST_CASE("audit: seed 002, a decorator frame cycle pins a caller's buffer and live_since names "
          "it with the tag and the Python call site of its tag scope",
          "[audit][seed002]") {
  auto alloc = Allocator::create(host_runtime()).value();
  const AuditCheckpoint cp = alloc->checkpoint();
  const void* big = nullptr;
  std::weak_ptr<Frame> decorator_frame;
  {
    // probe_cuda_tensor(): `big` is a local of the frame that defines kernels.
    AllocationTagScope scope(*alloc, "probe.big", "repro.py:97 in probe_cuda_tensor");
    auto frame = std::make_shared<Frame>();
    auto p = alloc->allocate(std::size_t{1} << 20);
    REQUIRE_OK(p);
    frame->locals.push_back(std::shared_ptr<DeviceBuffer>(new DeviceBuffer{alloc.get(), *p}));
    big = *p;
    decorator_frame = seed002_cute_kernel_decorator(frame);
  }
  // `big` died with its frame, unless the frame is pinned: it is.
  const LiveSince live = alloc->live_since(cp);
  INFO(live_since_to_json(live));
  REQUIRE(live.groups.size() == 1);
  const LiveGroup& g = live.groups[0];
  CHECK(g.tag == "probe.big");
  CHECK(g.site == "repro.py:97 in probe_cuda_tensor");
  CHECK(g.location == "repro.py:97 in probe_cuda_tensor");
  CHECK(g.stack.empty());  // stacks not recorded
  REQUIRE(g.block_list.size() == 1);
  CHECK(g.block_list[0].ptr == big);
  // A tag of the allocation's own wins over the scope's; outside any scope,
  // allocations are untagged.
  {
    AllocationTagScope outer(*alloc, "outer");
    AllocationTagScope inner(*alloc, "inner", "model.py:3 in layer");
    void* own = alloc->allocate(512, 0, kDefaultStream, {.tag = "own"}).value();
    void* scoped = alloc->allocate(512).value();
    CHECK(alloc->block_info(own)->tag == "own");
    CHECK(alloc->block_info(scoped)->tag == "inner");
    REQUIRE_OK(alloc->deallocate(own));
    REQUIRE_OK(alloc->deallocate(scoped));
  }
  void* plain = alloc->allocate(512).value();
  CHECK(alloc->block_info(plain)->tag.empty());
  REQUIRE_OK(alloc->deallocate(plain));
  {
    std::shared_ptr<Frame> frame = decorator_frame.lock();  // the collection
    REQUIRE(frame != nullptr);
    frame->cur_frame.reset();
  }
  CHECK(decorator_frame.expired());
  CHECK(alloc->live_since(cp).blocks == 0);
}

TEST_CASE("audit: the latest checkpoint is remembered, and live_since ignores freed and "
          "earlier blocks",
          "[audit]") {
  auto alloc = Allocator::create(host_runtime()).value();
  AuditCheckpoint latest;
  CHECK_FALSE(alloc->latest_checkpoint(&latest));
  void* early = alloc->allocate(1024).value();
  const AuditCheckpoint cp = alloc->checkpoint();
  REQUIRE(alloc->latest_checkpoint(&latest));
  CHECK(latest.sequence == cp.sequence);
  void* kept = alloc->allocate(2048).value();
  void* freed = alloc->allocate(4096).value();
  REQUIRE_OK(alloc->deallocate(freed));
  const LiveSince live = alloc->live_since(cp);
  REQUIRE(live.blocks == 1);
  CHECK(live.groups[0].block_list[0].ptr == kept);
  CHECK(live.groups[0].tag.empty());
  CHECK(live.groups[0].site.empty());
  CHECK_THAT(live_since_to_json(live), Catch::Contains("\"schema\":\"capalloc.live_since/1\""));
  REQUIRE_OK(alloc->deallocate(kept));
  REQUIRE_OK(alloc->deallocate(early));
}

// Break test 13, item 9: a scope opened for allocator A tagged what
// allocator B allocated on the same thread (the scopes were per thread
// only); audit.hpp says a scope tags what its allocator allocates.
TEST_CASE("audit: a tag scope tags its own allocator's allocations, not another's") {
  auto rt = host_runtime();
  auto a = Allocator::create(rt).value();
  auto b = Allocator::create(rt).value();
  { AllocationTagScope warm(*b, "b-scope"); }  // b applies scopes from now on
  const AuditCheckpoint cp_a = a->checkpoint();
  const AuditCheckpoint cp_b = b->checkpoint();
  void* pa = nullptr;
  void* pb = nullptr;
  void* pb_inner = nullptr;
  {
    AllocationTagScope outer_b(*b, "b-outer");
    AllocationTagScope scope_a(*a, "a-only");
    pa = a->allocate(4096).value();
    pb = b->allocate(4096).value();  // a's scope is innermost, but b's outer scope applies
    {
      AllocationTagScope inner_b(*b, "b-inner");
      pb_inner = b->allocate(8192).value();
    }
  }
  const LiveSince live_a = a->live_since(cp_a);
  REQUIRE(live_a.groups.size() == 1);
  CHECK(live_a.groups[0].tag == "a-only");
  const LiveSince live_b = b->live_since(cp_b);
  REQUIRE(live_b.groups.size() == 2);
  CHECK(live_b.groups[0].tag == "b-inner");  // most bytes first
  CHECK(live_b.groups[1].tag == "b-outer");
  REQUIRE_OK(a->deallocate(pa));
  REQUIRE_OK(b->deallocate(pb));
  REQUIRE_OK(b->deallocate(pb_inner));
}
