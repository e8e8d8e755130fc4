// tools/trace/trace_reader.hpp: reads a capalloc.trace/1 file (docs/trace.md)
// into the pre-decoded form `capalloc bench` replays.
//
// Everything a replay would otherwise look up per event is resolved here,
// once: trace ids become dense slots (a slot is reused once its block is
// freed, so the slot table is as large as the most blocks live at once),
// streams, captures and pool names become small indices. The replay loop then
// indexes plain arrays and never parses, hashes or allocates.
//
// The reader refuses, naming the file and line, what a replay could not
// perform: a line that is not a JSON object, an unknown `op`, a missing or
// ill-typed member, a `free` or `record_stream` of an id that is not live,
// an `alloc` of an id that is live, a size of 0, a device other than 0, and
// capture events out of order (end or replay of a capture not begun, a
// capture begun twice, a replay before the capture ended, a capture begun on
// a stream that is already capturing). Members it does not know are ignored.
// The event-trace lines `release`, `release_done` and `finding` are read and
// skipped: a replay makes its own.
#ifndef CAPALLOC_TOOLS_TRACE_TRACE_READER_HPP_
#define CAPALLOC_TOOLS_TRACE_TRACE_READER_HPP_

#include <cstddef>
#include <cstdint>
#include <istream>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace capalloc::trace {

enum class OpKind : std::uint8_t {
  kAlloc,         // slot, size, stream
  kFree,          // slot
  kRecordStream,  // slot, stream
  kCaptureBegin,  // capture, stream, pool
  kCaptureEnd,    // capture
  kReplay,        // capture (replayed on the stream it was captured on)
  kGraphDestroy,  // capture
};

// The op's name in the trace format ("alloc", "capture_end", ...).
constexpr const char* op_name(OpKind kind) {
  switch (kind) {
    case OpKind::kAlloc: return "alloc";
    case OpKind::kFree: return "free";
    case OpKind::kRecordStream: return "record_stream";
    case OpKind::kCaptureBegin: return "capture_begin";
    case OpKind::kCaptureEnd: return "capture_end";
    case OpKind::kReplay: return "replay";
    case OpKind::kGraphDestroy: return "graph_destroy";
  }
  return "?";
}

inline constexpr std::uint32_t kNoPool = ~std::uint32_t{0};

// One event, decoded. `index` is a block slot for block events and a capture
// index for capture events.
struct TraceOp {
  std::uint64_t size = 0;
  std::uint32_t index = 0;
  std::uint32_t stream = 0;     // dense: 0 is the trace's stream 0 (the default stream)
  std::uint32_t pool = kNoPool;  // capture_begin: index into Trace::pools, or kNoPool
  OpKind kind = OpKind::kAlloc;
};

struct Trace {
  std::string name;    // the file, as errors name it
  std::string source;  // the header's `source`
  std::vector<TraceOp> ops;
  std::vector<std::uint32_t> op_lines;   // the line of each of ops, for messages
  std::size_t slots = 0;                 // most blocks live at once
  std::vector<std::uint64_t> stream_ids;  // dense stream -> the trace's stream number
  std::size_t captures = 0;
  std::vector<std::string> pools;        // dense pool -> its name
  std::size_t allocs = 0;
  std::size_t frees = 0;
  std::size_t replays = 0;
  struct LiveBlock {
    std::uint32_t slot = 0;
    std::uint64_t size = 0;
    std::uint32_t stream = 0;  // the allocation's (dense)
  };
  std::vector<LiveBlock> live_at_end;  // the blocks the trace never frees
  std::uint64_t peak_requested_bytes = 0;  // most bytes live at once, by the trace's sizes

  // Operations a replay counts: one per alloc and one per free.
  std::size_t operations() const { return allocs + frees; }
  bool has_captures() const { return captures > 0; }
};

// Reads the trace in `in`; `name` is how errors name it ("FILE:LINE: ...").
absl::StatusOr<Trace> parse_trace(std::istream& in, std::string_view name);
// Reads the trace file at `path`.
absl::StatusOr<Trace> read_trace(const std::string& path);

}  // namespace capalloc::trace

#endif  // CAPALLOC_TOOLS_TRACE_TRACE_READER_HPP_
