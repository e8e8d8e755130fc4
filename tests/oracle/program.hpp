// tests/oracle/program.hpp: the capture programs of the differential oracle
// (issue 9): what a program is, a seeded generator, a printer and a shrinker.
//
// A program allocates eager blocks, then makes 1 to 3 captures (into one
// shared pool or private pools), each on 1 to 4 streams that fork from the
// origin stream and join back with events, of allocations, frees, kernels
// that write, read (into a sink block of their own) or update random ranges
// of live blocks, memsets, and memcpys out of live blocks; then frees eager
// blocks and allocates new
// ones. Each capture is begun through capalloc's tracker (declared evidence)
// or natively through the runtime, as PyTorch does (footprint evidence).
#ifndef CAPALLOC_TESTS_ORACLE_PROGRAM_HPP_
#define CAPALLOC_TESTS_ORACLE_PROGRAM_HPP_

#include <cstddef>
#include <functional>
#include <random>
#include <string>
#include <vector>

namespace capalloc::oracle {

// kRead and kCopy both copy a range of a block into the capture's sink: a
// kernel that declares (or, natively, points at) it, and a memcpy node.
enum class OpKind { kAlloc, kFree, kWrite, kRead, kUpdate, kMemset, kJoin, kCopy };
// Whether the op copies what it reads into the sink.
inline bool reads_into_sink(OpKind k) {
  return k == OpKind::kRead || k == OpKind::kUpdate || k == OpKind::kCopy;
}
const char* op_name(OpKind kind);

struct Op {
  OpKind kind = OpKind::kWrite;
  int block = 0;        // program block id (kJoin: unused)
  std::size_t lo = 0;   // float range [lo, hi) of kernels and memsets; kAlloc: floats in `hi`
  std::size_t hi = 0;
  int stream = 0;       // the stream it is issued on (kJoin: the stream joined from)
  int to = 0;           // kJoin: the stream that waits
};

// How a capture is begun, and so what evidence its record has.
enum class Route {
  kTracker,  // CaptureTracker::begin_capture: declared accesses
  kNative,   // the runtime's begin_capture, found by the allocator: footprint
};

struct CaptureProgram {
  bool shared_pool = true;
  Route route = Route::kTracker;
  int streams = 1;  // stream 0 begins the capture; others join by kJoin
  std::vector<Op> ops;
};

struct Program {
  std::vector<std::size_t> eager;        // floats of blocks 0..E-1, allocated first
  std::vector<CaptureProgram> captures;
  std::vector<int> free_after;           // eager block ids freed after the captures
  std::vector<std::size_t> alloc_after;  // floats of new eager blocks after them
};

struct GenerateOptions {
  int max_streams = 4;
  bool native_captures = true;  // some captures through the native route
};

Program generate(std::mt19937_64& rng, const GenerateOptions& options = {});
std::string describe(const Program& p);
// Removes ops, captures' after-steps one at a time while `fails` holds.
Program shrink(Program p, const std::function<bool(const Program&)>& fails);

}  // namespace capalloc::oracle

#endif  // CAPALLOC_TESTS_ORACLE_PROGRAM_HPP_
