// tools/stress/stress_driver.hpp: the property driver of `capalloc stress`.
//
// A seeded generator produces operations over 3 streams (the default stream
// and two created ones) on each of 2 devices of the host runtime: allocate
// (1 B to 64 MiB, skewed small), free, record_stream, free after use on
// another stream, destroy a stream with work pending, begin/end capture into
// a private or a shared graph pool, memsets recorded into the capture,
// replay, destroy graph, persistent preallocate/get/release, empty_cache,
// out-of-memory requests against a small device limit, and invalid calls.
//
// An Executor applies them to one allocator (with a CaptureTracker and a
// PersistentCache) and keeps a model: the live blocks (pointer, sizes,
// device, stream, cookie) and the counters the stats must show. After every
// operation it checks: Allocator::CheckInvariants(); no two live blocks
// overlap; every cookie (8 bytes at the start of each block allocated
// outside captures, written by the host, never by a kernel, so the graphs
// under test are untouched) is intact unless a tracker finding names the
// block as a victim; the stats equal the model's sums; every invalid call
// returned an error and changed no stats.
//
// Every operation's parameters are independent of the state: a free picks
// `pick % live blocks`, an end of capture with no capture does nothing. So
// any subsequence of a program runs, which is what the shrinker relies on.
#ifndef CAPALLOC_TOOLS_STRESS_STRESS_DRIVER_HPP_
#define CAPALLOC_TOOLS_STRESS_STRESS_DRIVER_HPP_

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace capalloc::stress {

enum class OpKind : std::uint8_t {
  kAlloc,
  kFree,
  kRecordStream,     // record_stream on another stream of the block's device
  kFreeOtherStream,  // record_stream, work on that stream, then free
  kTick,             // a kernel on a stream: pending frees complete in their own time
  kDestroyStream,    // work pending on a created stream, then destroy it (and make a new one)
  kBeginCapture,
  kCaptureWrite,  // a memset of a block allocated in the capture, recorded into the graph
  kEndCapture,
  kReplay,
  kDestroyGraph,
  kPreallocate,
  kGetPersistent,
  kReleasePersistent,
  kEmptyCache,
  kOom,      // a request larger than the device limit leaves free
  kInvalid,  // one of the invalid calls (`variant` says which)
  kCount,
};
inline constexpr std::size_t kOpKinds = static_cast<std::size_t>(OpKind::kCount);
const char* op_kind_name(OpKind kind);

struct Op {
  OpKind kind = OpKind::kTick;
  std::uint8_t device = 0;   // 0 or 1
  std::uint8_t stream = 0;   // stream slot 0 (default), 1 or 2
  std::uint8_t variant = 0;  // shared pool or not, which key, which invalid call
  std::uint32_t pick = 0;    // which live block or graph, modulo how many there are
  std::uint64_t size = 0;    // bytes requested
};
using Program = std::vector<Op>;

// One readable line.
std::string describe(const Op& op);

// Produces the operations of one seed, one at a time (a 100,000,000-op run
// does not hold its program).
class Generator {
 public:
  explicit Generator(std::uint64_t seed);
  Op next();

 private:
  std::uint64_t state_;
  std::uint64_t random();
  std::size_t live_estimate_ = 0;
  bool capturing_ = false;
  int capture_device_ = 0, capture_stream_ = 1;
};
Program generate(std::uint64_t seed, std::size_t ops);

struct Counters {
  std::uint64_t ops = 0;
  std::array<std::uint64_t, kOpKinds> per_kind{};
  std::uint64_t invalid_calls_checked = 0;  // each returned an error and changed nothing
  std::uint64_t invariant_checks = 0;       // CheckInvariants() calls that passed
  std::uint64_t ooms = 0;                   // out-of-memory results (asked for or natural)
  std::uint64_t graphs = 0;                 // captures ended into a graph
  std::uint64_t replays = 0;
  std::uint64_t predicted_clobbers = 0;  // cookies changed where a finding named the block
  void add(const Counters& other);
};

struct ExecOptions {
  // Bytes each emulated device can reserve: small, so that out-of-memory
  // and the release-and-retry path happen.
  std::size_t memory_limit_per_device = std::size_t{192} << 20;
  // A test hook: called before each operation with its index and the number
  // of live blocks; a message makes that operation fail the run as a
  // checker failure would.
  std::function<std::optional<std::string>(const Op& op, std::size_t live_blocks)> inject_failure;
};

struct Failure {
  std::size_t op_index = 0;  // index in the program (or thread's program) of the failing op
  std::string message;
};

struct World;  // the runtime, allocator, tracker and cache the executors share

// Applies operations to a World and checks after each one. One executor per
// thread; several may share a World (run_threads).
class Executor {
 public:
  // A fresh World of its own (the single-threaded driver).
  explicit Executor(ExecOptions options);
  ~Executor();
  Executor(const Executor&) = delete;
  Executor& operator=(const Executor&) = delete;

  // Applies one operation and checks; the message of the first violation.
  std::optional<std::string> apply(const Op& op);
  // Ends any capture, frees every block, destroys the graphs, and checks that
  // the allocator is back to nothing allocated.
  std::optional<std::string> finish();
  const Counters& counters() const;

  struct State;

 private:
  friend struct ThreadedRun;
  Executor(std::shared_ptr<World> world, int thread, ExecOptions options);
  std::unique_ptr<State> state_;
};

// Runs `program` on a fresh executor; the first failure, if any.
std::optional<Failure> run_program(const Program& program, const ExecOptions& options,
                                   Counters* counters = nullptr);

struct ShrinkResult {
  Program program;
  Failure failure;
  std::size_t runs = 0;  // programs executed while shrinking
};
// Delta debugging: truncates after the failing op, then drops chunks of ever
// smaller size while the program still fails, within `budget_seconds`.
ShrinkResult shrink(const Program& failing, const ExecOptions& options, Failure failure,
                    double budget_seconds);
// The reproduction as text: the seed's failure, then one line per op.
std::string format_reproduction(const ShrinkResult& shrunk);

struct StressReport {
  Counters counters;
  double seconds = 0;
  std::optional<Failure> failure;
  int failing_thread = -1;
};
// `ops` operations of `seed`, single-threaded, on a fresh host runtime.
StressReport run_single(std::uint64_t seed, std::size_t ops, const ExecOptions& options);
// `threads` executors on one shared allocator, each with its own streams and
// its own program (seed + thread), `ops` operations in all.
StressReport run_threads(std::uint64_t seed, std::size_t ops, int threads,
                         const ExecOptions& options);

}  // namespace capalloc::stress

#endif  // CAPALLOC_TOOLS_STRESS_STRESS_DRIVER_HPP_
