// tests/seed001_dlpack_release_test.cpp: field report 001 (seeds/001_*.txt)
// on the host runtime, and DLPack import's errors.
//
// The report: a consumer reads a DLPack tensor's pointer while preparing a
// launch, calls the tensor's deleter right away, and only then enqueues the
// asynchronous kernel that reads the memory. A producer whose deleter
// returns the memory to its pool lets the next tensor overwrite it before
// the kernel runs. Here the producer is a one-slot pool whose deleter
// poisons the slot and hands it back; the kernel is held back by a gate
// until argument preparation (and, with capalloc, the release request) has
// finished, as a GPU that has not reached the kernel yet would be.
#include <dlpack/dlpack.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <future>
#include <memory>
#include <mutex>
#include <vector>

#include "capalloc/dlpack.hpp"
#include "capalloc/release.hpp"
#include "release_test_support.hpp"
#include "test_support.hpp"

namespace capalloc::testing {
namespace {

constexpr std::uint32_t kPoison = 0xDEADBEEF;
constexpr int kElements = 64;

// The producer: one buffer, handed out as a DLPack tensor holding `value`;
// its deleter poisons the buffer and returns it, so the next export reuses
// (and overwrites) it.
class OneSlotProducer {
 public:
  DLManagedTensor* export_tensor(std::uint32_t value) {
    REQUIRE_FALSE(in_use_);
    in_use_ = true;
    for (auto& v : slot_) v = value;
    managed_ = DLManagedTensor{};
    managed_.dl_tensor.data = slot_.data();
    managed_.dl_tensor.device = {kDLCPU, 0};
    managed_.dl_tensor.ndim = 1;
    managed_.dl_tensor.dtype = {kDLUInt, 32, 1};
    managed_.dl_tensor.shape = &shape_;
    managed_.manager_ctx = this;
    managed_.deleter = [](DLManagedTensor* self) {
      auto* producer = static_cast<OneSlotProducer*>(self->manager_ctx);
      for (auto& v : producer->slot_) v = kPoison;
      ++producer->deleted_;
      producer->in_use_ = false;  // last: the slot may be exported again
    };
    return &managed_;
  }
  bool free() const { return !in_use_; }
  int deleted() const { return deleted_; }

 private:
  alignas(256) std::array<std::uint32_t, kElements> slot_{};
  std::int64_t shape_ = kElements;
  DLManagedTensor managed_{};
  std::atomic<bool> in_use_{false};
  std::atomic<int> deleted_{0};
};

// The consumer's kernel, held back by `gate`: counts the elements that do
// not hold the value exported (100), the poison among them.
void launch_gated_read(DeviceRuntime& rt, StreamHandle stream, const Gate& gate,
                       const std::uint32_t* data, std::atomic<int>* poisoned) {
  REQUIRE_OK(rt.launch_kernel(stream, gate.kernel(nullptr, 0)));
  REQUIRE_OK(rt.launch_kernel(stream, host_kernel("read", [data, poisoned] {
                                int bad = 0;
                                for (int i = 0; i < kElements; ++i) bad += data[i] != 100 ? 1 : 0;
                                poisoned->store(bad);
                              })));
}

constexpr int kRepetitions = 200;

TEST_CASE("seed 001: the report's immediate DLPack release lets the kernel read poison") {
  auto rt = host_runtime();
  const StreamHandle stream = rt->create_stream(0).value();
  OneSlotProducer producer;
  int runs_that_read_poison = 0;
  for (int rep = 0; rep < kRepetitions; ++rep) {
    DLManagedTensor* t = producer.export_tensor(100);
    // Argument preparation as the report describes it: take the pointer,
    // then call the deleter at once, then launch.
    const auto* data = static_cast<const std::uint32_t*>(t->dl_tensor.data);
    t->deleter(t);
    std::atomic<int> poisoned{-1};
    Gate gate;
    launch_gated_read(*rt, stream, gate, data, &poisoned);
    gate.open();
    REQUIRE_OK(rt->synchronize_stream(stream));
    if (poisoned.load() > 0) ++runs_that_read_poison;
  }
  CHECK(runs_that_read_poison == kRepetitions);
}

TEST_CASE("seed 001: with capalloc's stream-ordered release the kernel never reads poison") {
  auto rt = host_runtime();
  auto queue = ReleaseQueue::create(*rt).value();
  DlpackImports imports(*queue);
  const StreamHandle stream = rt->create_stream(0).value();
  OneSlotProducer producer;
  int runs_that_read_poison = 0;
  int deleter_ran_early = 0;
  for (int rep = 0; rep < kRepetitions; ++rep) {
    DLManagedTensor* t = producer.export_tensor(100);
    auto imported = imports.import(t, stream);
    REQUIRE_OK(imported);
    std::atomic<int> poisoned{-1};
    Gate gate;
    launch_gated_read(*rt, stream, gate, static_cast<const std::uint32_t*>(imported->data),
                      &poisoned);
    // Argument preparation is over: the consumer gives the tensor back.
    REQUIRE_OK(imports.release(t));
    if (producer.free()) ++deleter_ran_early;
    gate.open();
    REQUIRE_OK(rt->synchronize_stream(stream));
    if (poisoned.load() != 0) ++runs_that_read_poison;
    // The deleter runs on capalloc's thread once the kernel is done; the
    // next export needs the slot back.
    while (!producer.free()) std::this_thread::yield();
  }
  REQUIRE_OK(queue->drain());  // every deleter has returned before the producer goes
  CHECK(runs_that_read_poison == 0);
  CHECK(deleter_ran_early == 0);
  CHECK(producer.deleted() == kRepetitions);
  CHECK(imports.imported() == 0);
}

DLManagedTensor cpu_tensor(void* data, std::int64_t* shape, int ndim) {
  DLManagedTensor m{};
  m.dl_tensor.data = data;
  m.dl_tensor.device = {kDLCPU, 0};
  m.dl_tensor.ndim = ndim;
  m.dl_tensor.dtype = {kDLFloat, 32, 1};
  m.dl_tensor.shape = shape;
  return m;
}

TEST_CASE("dlpack import: bad input is a clear error that changes nothing") {
  auto rt = host_runtime();
  auto queue = ReleaseQueue::create(*rt).value();
  DlpackImports imports(*queue);
  const StreamHandle stream = rt->create_stream(0).value();
  float data[8] = {};
  std::int64_t shape[1] = {8};
  int deleted = 0;
  DLManagedTensor t = cpu_tensor(data, shape, 1);
  t.manager_ctx = &deleted;
  t.deleter = [](DLManagedTensor* self) { ++*static_cast<int*>(self->manager_ctx); };

  auto status = imports.import(nullptr, stream).status();
  CHECK(status.code() == absl::StatusCode::kInvalidArgument);
  CHECK(std::string(status.message()).find("tensor is null") != std::string::npos);

  DLManagedTensor gpu = t;
  gpu.dl_tensor.device = {kDLCUDA, 0};
  status = imports.import(&gpu, stream).status();
  CHECK(status.code() == absl::StatusCode::kInvalidArgument);
  CHECK(std::string(status.message()).find("kDLCUDA") != std::string::npos);
  CHECK(std::string(status.message()).find("host runtime serves kDLCPU only") != std::string::npos);

  DLManagedTensor other_device = t;
  other_device.dl_tensor.device = {kDLCPU, 4};
  CHECK(imports.import(&other_device, stream).status().code() ==
        absl::StatusCode::kInvalidArgument);

  std::int64_t negative[1] = {-1};
  DLManagedTensor bad_shape = cpu_tensor(data, negative, 1);
  CHECK(imports.import(&bad_shape, stream).status().code() == absl::StatusCode::kInvalidArgument);

  CHECK(imports.import(&t, StreamHandle{424242}).status().code() == absl::StatusCode::kNotFound);
  CHECK(imports.imported() == 0);

  auto first = imports.import(&t, stream);
  REQUIRE_OK(first);
  CHECK(first->data == data);
  CHECK(first->bytes == sizeof(data));
  status = imports.import(&t, stream).status();
  CHECK(status.code() == absl::StatusCode::kAlreadyExists);
  CHECK(std::string(status.message()).find("already imported") != std::string::npos);
  CHECK(imports.imported() == 1);

  REQUIRE_OK(imports.release(&t));
  status = imports.release(&t);
  CHECK(status.code() == absl::StatusCode::kNotFound);
  CHECK(std::string(status.message()).find("released already") != std::string::npos);
  CHECK(imports.release(nullptr).code() == absl::StatusCode::kInvalidArgument);
  REQUIRE_OK(queue->drain());
  CHECK(deleted == 1);
  CHECK(queue->stats().requested == 1);
}

TEST_CASE("dlpack import: strides and offsets give the bytes the tensor addresses") {
  auto rt = host_runtime();
  auto queue = ReleaseQueue::create(*rt).value();
  DlpackImports imports(*queue);
  float data[64] = {};
  std::int64_t shape[2] = {4, 3};
  std::int64_t strides[2] = {1, 8};  // column-major with padding
  DLManagedTensor t = cpu_tensor(data, shape, 2);
  t.dl_tensor.strides = strides;
  t.dl_tensor.byte_offset = 16;
  auto view = imports.import(&t, kDefaultStream);
  REQUIRE_OK(view);
  CHECK(view->data == reinterpret_cast<char*>(data) + 16);
  CHECK(view->bytes == (3 + 2 * 8 + 1) * sizeof(float));  // last element at 3*1 + 2*8

  std::int64_t empty_shape[1] = {0};
  DLManagedTensor empty = cpu_tensor(nullptr, empty_shape, 1);
  auto none = imports.import(&empty, kDefaultStream);
  REQUIRE_OK(none);
  CHECK(none->bytes == 0);
  // Both are released by the destructor, in stream order.
}

// Break test of issue 13: a tensor imported and never released never had
// its deleter run. Teardown releases it, in stream order, and says how many.
TEST_CASE("dlpack import: a tensor never released is released at teardown, after its stream's work") {
  auto rt = host_runtime();
  const StreamHandle stream = rt->create_stream(0).value();
  auto has_count_line = [](const LogLines& log) {
    for (const std::string& line : log.lines()) {
      if (line.find("1 tensor(s) still imported at teardown were released") != std::string::npos) {
        return true;
      }
    }
    return false;
  };
  SECTION("the queue's drain (capalloc_release_drain, exit, Python's atexit)") {
    auto queue = ReleaseQueue::create(*rt).value();
    DlpackImports imports(*queue);
    OneSlotProducer producer;
    Gate gate;
    std::atomic<int> poisoned{-1};
    LogLines log;
    auto view = imports.import(producer.export_tensor(100), stream).value();
    launch_gated_read(*rt, stream, gate, static_cast<const std::uint32_t*>(view.data), &poisoned);
    // The drain waits for the gated kernel: open the gate from here.
    auto drained = std::async(std::launch::async, [&] { return queue->drain(); });
    gate.open();
    REQUIRE_OK(drained.get());
    CHECK(poisoned == 0);  // the kernel read before the deleter poisoned
    CHECK(producer.deleted() == 1);
    CHECK(imports.imported() == 0);
    CHECK(imports.released_at_teardown() == 1);
    CHECK(has_count_line(log));
  }
  SECTION("the DlpackImports' destructor, before the queue's") {
    auto queue = ReleaseQueue::create(*rt).value();
    OneSlotProducer producer;
    Gate gate;
    std::atomic<int> poisoned{-1};
    LogLines log;
    {
      DlpackImports imports(*queue);
      auto view = imports.import(producer.export_tensor(100), stream).value();
      launch_gated_read(*rt, stream, gate, static_cast<const std::uint32_t*>(view.data),
                        &poisoned);
    }  // never waits: the deleter is queued behind the kernel
    CHECK(producer.deleted() == 0);
    gate.open();
    REQUIRE_OK(queue->drain());
    CHECK(poisoned == 0);
    CHECK(producer.deleted() == 1);
    CHECK(has_count_line(log));
  }
  REQUIRE_OK(rt->destroy_stream(stream));
}


// Break test 13, item 1: a tensor whose import stream is destroyed before
// its release was never released (the release asked the runtime about the
// gone stream: kNotFound), teardown took that kNotFound for "released
// meanwhile", and the deleter never ran. The stream's work has run
// (destroy_stream waits for it), so the release succeeds and the deleter
// runs, in request order.
TEST_CASE("dlpack import: a tensor whose import stream was destroyed is released, in order") {
  auto rt = host_runtime();
  auto queue = ReleaseQueue::create(*rt).value();
  DlpackImports imports(*queue);
  float data[8] = {};
  std::int64_t shape[1] = {8};
  std::vector<int> order;
  std::mutex order_mu;
  DLManagedTensor t = cpu_tensor(data, shape, 1);
  struct Ctx {
    std::vector<int>* order;
    std::mutex* mu;
  } ctx{&order, &order_mu};
  t.manager_ctx = &ctx;
  t.deleter = [](DLManagedTensor* self) {
    auto* c = static_cast<Ctx*>(self->manager_ctx);
    std::lock_guard lock(*c->mu);
    c->order->push_back(2);
  };
  const StreamHandle stream = rt->create_stream(0).value();
  REQUIRE_OK(imports.import(&t, stream));
  // A release requested earlier on the stream runs first.
  REQUIRE_OK(queue->release(0, stream, [&] {
    std::lock_guard lock(order_mu);
    order.push_back(1);
  }));
  REQUIRE_OK(rt->destroy_stream(stream));
  SECTION("released by the application") {
    REQUIRE_OK(imports.release(&t));
    CHECK(imports.imported() == 0);
    // A second release is still "not imported", and changes nothing.
    CHECK(imports.release(&t).code() == absl::StatusCode::kNotFound);
  }
  SECTION("released at teardown") {
    REQUIRE_OK(queue->drain());
    CHECK(imports.released_at_teardown() == 1);
  }
  REQUIRE_OK(queue->drain());
  CHECK(imports.imported() == 0);
  std::lock_guard lock(order_mu);
  CHECK(order == std::vector<int>{1, 2});
}

// Break test 13, item 2: a producer that reuses its DLManagedTensor once the
// deleter has run gives the next import the same address; a stale handle
// (the first import's token) must not release the newer import.
TEST_CASE("dlpack import: a stale import's token does not release a newer import of the address") {
  auto rt = host_runtime();
  auto queue = ReleaseQueue::create(*rt).value();
  DlpackImports imports(*queue);
  float data[8] = {};
  std::int64_t shape[1] = {8};
  int deleted = 0;
  DLManagedTensor t = cpu_tensor(data, shape, 1);
  t.manager_ctx = &deleted;
  t.deleter = [](DLManagedTensor* self) { ++*static_cast<int*>(self->manager_ctx); };
  auto first = imports.import(&t, kDefaultStream);
  REQUIRE_OK(first);
  CHECK(first->token != 0);
  REQUIRE_OK(imports.release(&t, first->token));
  wait_for_a_pass(*queue, kDefaultStream);
  CHECK(deleted == 1);
  auto second = imports.import(&t, kDefaultStream);  // the producer reused the struct
  REQUIRE_OK(second);
  CHECK(second->token != first->token);
  absl::Status stale = imports.release(&t, first->token);
  CHECK(stale.code() == absl::StatusCode::kNotFound);
  CHECK(std::string(stale.message()).find("released already") != std::string::npos);
  CHECK(imports.imported() == 1);
  REQUIRE_OK(imports.release(&t, second->token));
  REQUIRE_OK(queue->drain());
  CHECK(deleted == 2);
}

// Break test 13, item 5: offsets and strides that overflow the address
// space are refused and import nothing.
TEST_CASE("dlpack import: an offset or stride that overflows is refused and imports nothing") {
  auto rt = host_runtime();
  auto queue = ReleaseQueue::create(*rt).value();
  DlpackImports imports(*queue);
  float data[8] = {};
  std::int64_t shape[1] = {8};
  DLManagedTensor offset = cpu_tensor(data, shape, 1);
  offset.dl_tensor.byte_offset = UINT64_MAX;  // data + offset wraps to data - 1
  auto status = imports.import(&offset, kDefaultStream).status();
  CHECK(status.code() == absl::StatusCode::kInvalidArgument);
  CHECK(std::string(status.message()).find("byte_offset") != std::string::npos);
  std::int64_t strides[1] = {INT64_MIN};
  DLManagedTensor stride = cpu_tensor(data, shape, 1);
  stride.dl_tensor.strides = strides;
  status = imports.import(&stride, kDefaultStream).status();
  CHECK(status.code() == absl::StatusCode::kInvalidArgument);
  CHECK(std::string(status.message()).find("stride") != std::string::npos);
  CHECK(imports.imported() == 0);
  // A release naming memory past the end of the address space, too.
  status = queue->release(0, kDefaultStream, [] {},
                          {{reinterpret_cast<void*>(std::uintptr_t{0} - 1), SIZE_MAX}});
  CHECK(status.code() == absl::StatusCode::kInvalidArgument);
  CHECK(std::string(status.message()).find("past the end of the address space") !=
        std::string::npos);
  CHECK(queue->stats().requested == 0);
}

}  // namespace
}  // namespace capalloc::testing
