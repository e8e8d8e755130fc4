// allocator/event_trace.hpp: the event trace, an append-only JSON Lines log
// of allocator and capture events (docs/trace.md, capalloc.trace/1).
//
// The hot path never formats and never writes: each event is one
// fixed-size TraceRecord appended, under a lock of the trace's own, to an
// in-memory buffer of kRecordsPerBuffer records. A full buffer is handed to
// a writer thread, which formats and writes it, and the producer continues
// in a spare buffer; the writer also takes a partly filled buffer every
// kFlushInterval, so the file trails the program by at most that. Buffers
// are recycled: once the writer keeps up, appending allocates no heap
// memory. A writer that falls behind makes the producer take a new buffer
// (never wait, never drop). close() (or the destructor) writes what is left
// and joins the writer.
//
// Events are written in the order they were appended; the allocator appends
// its events with its own lock held, so the trace's order is the
// allocator's. Strings (tags, labels) travel as interned ids; the rare
// events that carry free text (findings) keep it beside the buffer.
// Thread-safe.
#ifndef CAPALLOC_ALLOCATOR_EVENT_TRACE_HPP_
#define CAPALLOC_ALLOCATOR_EVENT_TRACE_HPP_

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "capalloc/allocator.hpp"

namespace capalloc::detail {

enum class TraceOp : std::uint8_t {
  kAlloc,
  kFree,
  kRecordStream,
  kCaptureBegin,
  kCaptureEnd,
  kReplay,
  kGraphDestroy,
  kRelease,
  kReleaseDone,
  kFinding,
};

// One event, as appended. Members unused by an op are 0.
struct TraceRecord {
  std::uint64_t t = 0;       // ns since the trace started
  std::uint64_t id = 0;      // block sequence; capture id for capture events
  std::uint64_t size = 0;    // alloc: requested bytes; finding: bytes
  std::uint64_t stream = 0;
  std::uint64_t addr = 0;
  std::uint64_t extra = 0;   // capture_begin: pool; finding: graph; release(_done): request
  std::uint32_t text = 0;    // alloc: tag id; capture_begin: label id; finding: text index + 1
  std::uint32_t severity = 0;  // finding: interned severity name
  std::int32_t device = 0;
  TraceOp op = TraceOp::kAlloc;
  bool persistent = false;
};

class EventTrace {
 public:
  static constexpr std::size_t kRecordsPerBuffer = 4096;
  static constexpr std::chrono::milliseconds kFlushInterval{200};

  // Opens `path` for writing (truncating it) and writes the header. A path
  // already opened by another trace of this process gets a suffix (".2",
  // ".3", ...), so that allocators tracing to one CAPALLOC_TRACE do not
  // overwrite each other; path() says which. kInvalidArgument when the file
  // cannot be created.
  static absl::StatusOr<std::unique_ptr<EventTrace>> open(std::string_view path, int devices);
  ~EventTrace();
  EventTrace(const EventTrace&) = delete;
  EventTrace& operator=(const EventTrace&) = delete;

  const std::string& path() const { return path_; }
  // Writes what is buffered, stops the writer and closes the file; the first
  // write error, if any. Later appends are ignored.
  absl::Status close();

  void alloc(std::uint64_t id, std::size_t requested, StreamHandle stream, int device,
             std::uint32_t tag_id, Lifetime lifetime, std::uintptr_t addr);
  // A block live when the trace started, at `t` 0 (the trace's preamble).
  void live_block(std::uint64_t id, std::size_t requested, StreamHandle stream, int device,
                  std::uint32_t tag_id, Lifetime lifetime, std::uintptr_t addr);
  void free(std::uint64_t id);
  void record_stream(std::uint64_t id, StreamHandle stream);
  // Capture events. A capture is begun once (a second begin is ignored), and
  // the events of a capture the trace never saw begin are dropped: a replay
  // would refuse them.
  void capture_begin(CaptureId capture, StreamHandle stream, PoolHandle pool, int device,
                     std::string_view label);
  bool capture_begun(CaptureId capture) const;
  void capture_end(CaptureId capture);
  void replay(CaptureId capture);
  void graph_destroy(CaptureId capture);
  // A stream-ordered release, numbered `request` by its queue (both lines
  // carry it), and its callback having run: release_done only for a release
  // whose `release` line this trace wrote (one requested before the trace
  // started is left out).
  void release(std::uint64_t request, std::uint64_t id, std::uintptr_t addr,
               StreamHandle stream);
  void release_done(std::uint64_t request, std::uint64_t id, std::uintptr_t addr);
  void finding(std::string_view severity, std::uintptr_t addr, std::size_t size,
               std::uint64_t graph, std::uint64_t victim, std::uint32_t victim_tag,
               std::string message);

  // Events appended so far (for tests and the cost measurement).
  std::uint64_t appended() const;

 private:
  struct Buffer {
    std::vector<TraceRecord> records;
    std::vector<std::string> texts;
  };
  EventTrace(std::string path, std::FILE* file);
  std::uint64_t now() const;
  // A record of `op` at now().
  TraceRecord record(TraceOp op, std::uint64_t id) const;
  TraceRecord alloc_record(std::uint64_t id, std::size_t requested, StreamHandle stream,
                           int device, std::uint32_t tag_id, Lifetime lifetime,
                           std::uintptr_t addr) const;
  // Appends under mu_.
  void append(const TraceRecord& r);
  // capture_end, replay, graph_destroy: only of a capture begun in the trace.
  void capture_event(TraceOp op, CaptureId capture);
  // Requires mu_.
  void append_locked(const TraceRecord& r);
  Buffer take_spare_locked();
  void writer_loop();
  void write_buffer(const Buffer& b);

  const std::string path_;
  std::FILE* const file_;
  const std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();

  mutable std::mutex mu_;
  std::condition_variable wake_;
  Buffer active_;
  std::vector<Buffer> full_;   // waiting for the writer
  std::vector<Buffer> spare_;  // written, ready for reuse
  absl::flat_hash_map<CaptureId, bool> captures_;  // begun captures
  absl::flat_hash_set<std::uint64_t> releases_;     // releases written, not yet done
  std::uint64_t appended_ = 0;
  bool closing_ = false;
  bool closed_ = false;
  absl::Status write_error_;  // guarded by mu_ (set by the writer)
  std::thread writer_;

  // The writer's own: escaped tag texts by interned id, and the line buffer.
  absl::flat_hash_map<std::uint32_t, std::string> escaped_;
  std::string line_;
};

}  // namespace capalloc::detail

#endif  // CAPALLOC_ALLOCATOR_EVENT_TRACE_HPP_
