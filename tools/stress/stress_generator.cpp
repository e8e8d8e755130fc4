// tools/stress/stress_generator.cpp: the seeded operation generator and the
// readable form of an operation (see stress_driver.hpp).
#include <cstdio>
#include <string>

#include "absl/strings/str_format.h"
#include "tools/stress/stress_driver.hpp"

namespace capalloc::stress {

const char* op_kind_name(OpKind kind) {
  switch (kind) {
    case OpKind::kAlloc: return "alloc";
    case OpKind::kFree: return "free";
    case OpKind::kRecordStream: return "record_stream";
    case OpKind::kFreeOtherStream: return "free_other_stream";
    case OpKind::kTick: return "tick";
    case OpKind::kDestroyStream: return "destroy_stream";
    case OpKind::kBeginCapture: return "begin_capture";
    case OpKind::kCaptureWrite: return "capture_write";
    case OpKind::kEndCapture: return "end_capture";
    case OpKind::kReplay: return "replay";
    case OpKind::kDestroyGraph: return "destroy_graph";
    case OpKind::kPreallocate: return "preallocate";
    case OpKind::kGetPersistent: return "get_persistent";
    case OpKind::kReleasePersistent: return "release_persistent";
    case OpKind::kEmptyCache: return "empty_cache";
    case OpKind::kOom: return "oom";
    case OpKind::kInvalid: return "invalid";
    case OpKind::kCount: break;
  }
  return "?";
}

std::string describe(const Op& op) {
  const char* name = op_kind_name(op.kind);
  switch (op.kind) {
    case OpKind::kAlloc:
      return absl::StrFormat("%s %d B device %d stream %d", name, op.size, op.device, op.stream);
    case OpKind::kFree:
    case OpKind::kCaptureWrite:
    case OpKind::kDestroyGraph:
      return absl::StrFormat("%s pick %d", name, op.pick);
    case OpKind::kRecordStream:
    case OpKind::kFreeOtherStream:
      return absl::StrFormat("%s pick %d stream %d", name, op.pick, op.stream);
    case OpKind::kTick:
    case OpKind::kDestroyStream:
    case OpKind::kEndCapture:
      return absl::StrFormat("%s device %d stream %d", name, op.device, op.stream);
    case OpKind::kBeginCapture:
      return absl::StrFormat("%s device %d stream %d %s pool", name, op.device, op.stream,
                             op.variant % 16 == 1 ? "a fresh shared"
                             : op.variant % 2     ? "shared"
                                                  : "private");
    case OpKind::kReplay:
      return absl::StrFormat("%s pick %d stream %d", name, op.pick, op.stream);
    case OpKind::kPreallocate:
      return absl::StrFormat("%s device %d key %d %d B", name, op.device, op.variant, op.size);
    case OpKind::kGetPersistent:
    case OpKind::kReleasePersistent:
      return absl::StrFormat("%s device %d key %d", name, op.device, op.variant);
    case OpKind::kEmptyCache:
      return absl::StrFormat("%s device %s", name,
                             op.variant % 3 == 2 ? std::string("any") : std::to_string(op.device));
    case OpKind::kOom:
      return absl::StrFormat("%s device %d", name, op.device);
    case OpKind::kInvalid:
      return absl::StrFormat("%s variant %d device %d pick %d", name, op.variant, op.device,
                             op.pick);
    case OpKind::kCount: break;
  }
  return name;
}

namespace {

// splitmix64's output function: a bijection that spreads nearby inputs.
std::uint64_t mix(std::uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

}  // namespace

// The seed is mixed before it becomes the state. splitmix64's state moves by
// one constant a step, so a state of seed * that constant (as until
// 2026-12-07) started seed s + 1 one step after seed s on the same stream:
// seeds 1, 2 and 77 ran the same program shifted by one, two and 77
// operations, and every seed tested what seed 0 did.
Generator::Generator(std::uint64_t seed) : state_(mix(seed ^ 0x632BE59BD9B4E019ull)) {}

// splitmix64: small, fast, and the same on every platform (std::mt19937_64
// would do too; its distributions would not).
std::uint64_t Generator::random() { return mix(state_ += 0x9E3779B97F4A7C15ull); }

namespace {

// 1 B to 64 MiB, skewed small: most requests fit small segments.
std::uint64_t skewed_size(std::uint64_t r, std::uint64_t r2) {
  switch (r % 100) {
    case 0: return 1 + r2 % (std::uint64_t{64} << 20);   // huge: a segment of its own
    case 1: case 2: case 3: return 1 + r2 % (std::uint64_t{10} << 20);  // medium
    default:
      if (r % 100 < 20) return 1 + r2 % (std::uint64_t{1} << 20);
      return 1 + r2 % 4096;
  }
}

}  // namespace

Op Generator::next() {
  Op op;
  const std::uint64_t r = random();
  op.pick = static_cast<std::uint32_t>(r >> 32);
  op.device = static_cast<std::uint8_t>((r >> 8) & 1);
  op.stream = static_cast<std::uint8_t>((r >> 9) % 3);
  op.variant = static_cast<std::uint8_t>(r >> 16);
  const unsigned dice = static_cast<unsigned>(r % 1000);
  // Allocations lead frees while few blocks are live, follow them while many.
  const unsigned alloc_share = live_estimate_ < 48 ? 420 : 300;
  if (dice < alloc_share) {
    op.kind = OpKind::kAlloc;
    op.size = skewed_size(random(), random());
    if (capturing_ && (r >> 20) % 2 == 0) {  // half of them on the capturing stream
      op.device = static_cast<std::uint8_t>(capture_device_);
      op.stream = static_cast<std::uint8_t>(capture_stream_);
    }
    ++live_estimate_;
  } else if (dice < 700) {
    op.kind = OpKind::kFree;
    if (live_estimate_ > 0) --live_estimate_;
  } else if (dice < 740) {
    op.kind = OpKind::kRecordStream;
  } else if (dice < 800) {
    op.kind = OpKind::kFreeOtherStream;
    if (live_estimate_ > 0) --live_estimate_;
  } else if (dice < 830) {
    op.kind = OpKind::kTick;
  } else if (dice < 834) {
    op.kind = OpKind::kDestroyStream;
    op.stream = static_cast<std::uint8_t>(1 + (r >> 9) % 2);
  } else if (dice < 850) {
    if (capturing_) {
      op.kind = OpKind::kEndCapture;
      op.device = static_cast<std::uint8_t>(capture_device_);
      op.stream = static_cast<std::uint8_t>(capture_stream_);
      capturing_ = false;
    } else {
      op.kind = OpKind::kBeginCapture;
      op.stream = static_cast<std::uint8_t>(1 + (r >> 9) % 2);
      capturing_ = true;
      capture_device_ = op.device;
      capture_stream_ = op.stream;
    }
  } else if (dice < 880) {
    op.kind = capturing_ ? OpKind::kCaptureWrite : OpKind::kReplay;
  } else if (dice < 892) {
    op.kind = OpKind::kDestroyGraph;
  } else if (dice < 902) {
    op.kind = OpKind::kPreallocate;
    op.variant %= 4;
    op.size = 1 + random() % (std::uint64_t{2} << 20);
  } else if (dice < 912) {
    op.kind = OpKind::kGetPersistent;
    op.variant %= 4;
  } else if (dice < 918) {
    op.kind = OpKind::kReleasePersistent;
    op.variant %= 4;
  } else if (dice < 923) {
    op.kind = OpKind::kEmptyCache;
  } else if (dice < 926) {
    op.kind = OpKind::kOom;
  } else {
    op.kind = OpKind::kInvalid;
  }
  return op;
}

Program generate(std::uint64_t seed, std::size_t ops) {
  Generator generator(seed);
  Program program;
  program.reserve(ops);
  for (std::size_t i = 0; i < ops; ++i) program.push_back(generator.next());
  return program;
}

}  // namespace capalloc::stress
