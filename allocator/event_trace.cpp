// allocator/event_trace.cpp: see event_trace.hpp. The writer thread formats
// records into JSON lines (docs/trace.md); nothing here runs on the
// producer's side but the append.
#include "allocator/event_trace.hpp"

#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/interned_strings.hpp"
#include "nlohmann/json.hpp"

namespace capalloc::detail {

namespace {

// Paths opened by traces of this process, with how many times: a second
// trace to the same path writes path.2 instead of truncating the first.
struct OpenedPaths {
  std::mutex mu;
  absl::flat_hash_map<std::string, int> count;
};
OpenedPaths& opened_paths() {
  static OpenedPaths* p = new OpenedPaths();  // never destroyed: used at exit
  return *p;
}

std::string json_string(std::string_view s) {
  // Invalid UTF-8 (a tag is the caller's bytes) becomes U+FFFD.
  return nlohmann::json(std::string(s)).dump(-1, ' ', false,
                                              nlohmann::json::error_handler_t::replace);
}

const char* op_name(TraceOp op) {
  switch (op) {
    case TraceOp::kAlloc: return "alloc";
    case TraceOp::kFree: return "free";
    case TraceOp::kRecordStream: return "record_stream";
    case TraceOp::kCaptureBegin: return "capture_begin";
    case TraceOp::kCaptureEnd: return "capture_end";
    case TraceOp::kReplay: return "replay";
    case TraceOp::kGraphDestroy: return "graph_destroy";
    case TraceOp::kRelease: return "release";
    case TraceOp::kReleaseDone: return "release_done";
    case TraceOp::kFinding: return "finding";
  }
  return "unknown";
}

}  // namespace

absl::StatusOr<std::unique_ptr<EventTrace>> EventTrace::open(std::string_view path_in,
                                                            int devices) {
  if (path_in.empty()) return absl::InvalidArgumentError("start_trace: the trace path is empty");
  std::string path(path_in);
  OpenedPaths& opened = opened_paths();
  std::lock_guard lock(opened.mu);  // held until the file exists: one suffix per trace
  const int n = ++opened.count[std::string(path_in)];
  if (n > 1) absl::StrAppend(&path, ".", n);
  std::FILE* file = std::fopen(path.c_str(), "w");
  if (file == nullptr) {
    const int error = errno;
    --opened.count[std::string(path_in)];  // nothing was opened: no suffix taken
    return absl::InvalidArgumentError(absl::StrFormat(
        "start_trace: cannot create the trace file '%s': %s", path, std::strerror(error)));
  }
  std::fprintf(file, "{\"format\": \"capalloc.trace/1\", \"source\": \"capalloc\", \"devices\": %d}\n",
               devices);
  std::unique_ptr<EventTrace> trace(new EventTrace(std::move(path), file));
  trace->writer_ = std::thread([t = trace.get()] { t->writer_loop(); });
  return trace;
}

EventTrace::EventTrace(std::string path, std::FILE* file) : path_(std::move(path)), file_(file) {
  active_.records.reserve(kRecordsPerBuffer);
  full_.reserve(8);
  spare_.reserve(8);
}

EventTrace::~EventTrace() { close().IgnoreError(); }

absl::Status EventTrace::close() {
  {
    std::lock_guard lock(mu_);
    if (closed_) return write_error_;
    closed_ = true;
    closing_ = true;
    if (!active_.records.empty()) full_.push_back(std::exchange(active_, Buffer{}));
  }
  wake_.notify_one();
  if (writer_.joinable()) writer_.join();
  std::lock_guard lock(mu_);
  if (std::fclose(file_) != 0 && write_error_.ok()) {
    write_error_ = absl::DataLossError(
        absl::StrFormat("trace '%s': closing failed: %s", path_, std::strerror(errno)));
  }
  return write_error_;
}

std::uint64_t EventTrace::now() const {
  return static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                        std::chrono::steady_clock::now() - start_)
                                        .count());
}

EventTrace::Buffer EventTrace::take_spare_locked() {
  if (!spare_.empty()) {
    Buffer b = std::move(spare_.back());
    spare_.pop_back();
    return b;
  }
  Buffer b;  // the writer is behind: one more buffer, never a wait
  b.records.reserve(kRecordsPerBuffer);
  return b;
}

void EventTrace::append_locked(const TraceRecord& r) {
  if (closed_) return;
  active_.records.push_back(r);
  ++appended_;
  if (active_.records.size() == kRecordsPerBuffer) {
    full_.push_back(std::exchange(active_, take_spare_locked()));
    wake_.notify_one();
  }
}

TraceRecord EventTrace::record(TraceOp op, std::uint64_t id) const {
  TraceRecord r;
  r.t = now();
  r.op = op;
  r.id = id;
  return r;
}

void EventTrace::append(const TraceRecord& r) {
  std::lock_guard lock(mu_);
  append_locked(r);
}

TraceRecord EventTrace::alloc_record(std::uint64_t id, std::size_t requested,
                                     StreamHandle stream, int device, std::uint32_t tag_id,
                                     Lifetime lifetime, std::uintptr_t addr) const {
  TraceRecord r = record(TraceOp::kAlloc, id);
  r.size = requested;
  r.stream = stream;
  r.device = device;
  r.text = tag_id;
  r.persistent = lifetime == Lifetime::kPersistent;
  r.addr = addr;
  return r;
}

void EventTrace::alloc(std::uint64_t id, std::size_t requested, StreamHandle stream, int device,
                       std::uint32_t tag_id, Lifetime lifetime, std::uintptr_t addr) {
  append(alloc_record(id, requested, stream, device, tag_id, lifetime, addr));
}

void EventTrace::live_block(std::uint64_t id, std::size_t requested, StreamHandle stream,
                            int device, std::uint32_t tag_id, Lifetime lifetime,
                            std::uintptr_t addr) {
  TraceRecord r = alloc_record(id, requested, stream, device, tag_id, lifetime, addr);
  r.t = 0;  // the preamble: the state at the trace's start
  append(r);
}

void EventTrace::free(std::uint64_t id) { append(record(TraceOp::kFree, id)); }

void EventTrace::record_stream(std::uint64_t id, StreamHandle stream) {
  TraceRecord r = record(TraceOp::kRecordStream, id);
  r.stream = stream;
  append(r);
}

void EventTrace::capture_begin(CaptureId capture, StreamHandle stream, PoolHandle pool, int device,
                               std::string_view label) {
  TraceRecord r = record(TraceOp::kCaptureBegin, capture);
  r.stream = stream;
  r.extra = pool;
  r.device = device;
  r.text = intern_id(label);
  std::lock_guard lock(mu_);
  if (!captures_.emplace(capture, true).second) return;
  append_locked(r);
}

bool EventTrace::capture_begun(CaptureId capture) const {
  std::lock_guard lock(mu_);
  return captures_.contains(capture);
}

void EventTrace::capture_event(TraceOp op, CaptureId capture) {
  const TraceRecord r = record(op, capture);
  std::lock_guard lock(mu_);
  if (captures_.contains(capture)) append_locked(r);
}

void EventTrace::capture_end(CaptureId capture) { capture_event(TraceOp::kCaptureEnd, capture); }
void EventTrace::replay(CaptureId capture) { capture_event(TraceOp::kReplay, capture); }
void EventTrace::graph_destroy(CaptureId capture) {
  capture_event(TraceOp::kGraphDestroy, capture);
}

void EventTrace::release(std::uint64_t request, std::uint64_t id, std::uintptr_t addr,
                         StreamHandle stream) {
  TraceRecord r = record(TraceOp::kRelease, id);
  r.addr = addr;
  r.stream = stream;
  r.extra = request;
  std::lock_guard lock(mu_);
  releases_.insert(request);
  append_locked(r);
}

void EventTrace::release_done(std::uint64_t request, std::uint64_t id, std::uintptr_t addr) {
  TraceRecord r = record(TraceOp::kReleaseDone, id);
  r.addr = addr;
  r.extra = request;
  std::lock_guard lock(mu_);
  if (releases_.erase(request) == 0) return;  // requested before the trace started
  append_locked(r);
}

void EventTrace::finding(std::string_view severity, std::uintptr_t addr, std::size_t size,
                         std::uint64_t graph, std::uint64_t victim, std::uint32_t victim_tag,
                         std::string message) {
  TraceRecord r = record(TraceOp::kFinding, victim);
  r.addr = addr;
  r.size = size;
  r.extra = graph;
  r.stream = victim_tag;
  r.severity = intern_id(severity);
  std::lock_guard lock(mu_);
  if (closed_) return;
  active_.texts.push_back(std::move(message));
  r.text = static_cast<std::uint32_t>(active_.texts.size());
  append_locked(r);
}

std::uint64_t EventTrace::appended() const {
  std::lock_guard lock(mu_);
  return appended_;
}

void EventTrace::writer_loop() {
  std::unique_lock lock(mu_);
  for (;;) {
    wake_.wait_for(lock, kFlushInterval, [&] { return closing_ || !full_.empty(); });
    // The periodic flush: a partly filled buffer goes too.
    if (full_.empty() && !active_.records.empty()) {
      full_.push_back(std::exchange(active_, take_spare_locked()));
    }
    if (full_.empty()) {
      if (closing_) return;
      continue;
    }
    std::vector<Buffer> batch = std::exchange(full_, {});
    lock.unlock();
    for (const Buffer& b : batch) write_buffer(b);
    const bool flushed = std::fflush(file_) == 0;
    lock.lock();
    if ((!flushed || std::ferror(file_) != 0) && write_error_.ok()) {
      write_error_ = absl::DataLossError(
          absl::StrFormat("trace '%s': writing failed: %s", path_, std::strerror(errno)));
    }
    for (Buffer& b : batch) {
      b.records.clear();
      b.texts.clear();
      if (spare_.size() < 4) spare_.push_back(std::move(b));
    }
    if (full_.capacity() == 0) full_.reserve(8);
    if (closing_ && full_.empty()) return;
  }
}

void EventTrace::write_buffer(const Buffer& b) {
  auto text_of = [&](std::uint32_t id) -> const std::string& {
    auto it = escaped_.find(id);
    if (it == escaped_.end()) it = escaped_.emplace(id, json_string(interned(id))).first;
    return it->second;
  };
  for (const TraceRecord& r : b.records) {
    line_.clear();
    absl::StrAppend(&line_, "{\"op\": \"", op_name(r.op), "\", \"t\": ", r.t);
    switch (r.op) {
      case TraceOp::kAlloc:
        absl::StrAppend(&line_, ", \"id\": ", r.id, ", \"size\": ", r.size, ", \"stream\": ",
                        r.stream);
        if (r.device != 0) absl::StrAppend(&line_, ", \"device\": ", r.device);
        if (r.text != 0) absl::StrAppend(&line_, ", \"tag\": ", text_of(r.text));
        if (r.persistent) absl::StrAppend(&line_, ", \"lifetime\": \"persistent\"");
        absl::StrAppend(&line_, ", \"addr\": \"0x", absl::Hex(r.addr), "\"");
        break;
      case TraceOp::kFree:
        absl::StrAppend(&line_, ", \"id\": ", r.id);
        break;
      case TraceOp::kRecordStream:
        absl::StrAppend(&line_, ", \"id\": ", r.id, ", \"stream\": ", r.stream);
        break;
      case TraceOp::kCaptureBegin:
        absl::StrAppend(&line_, ", \"capture\": ", r.id, ", \"stream\": ", r.stream);
        if (r.extra != 0) absl::StrAppend(&line_, ", \"pool\": \"", r.extra, "\"");
        if (r.device != 0) absl::StrAppend(&line_, ", \"device\": ", r.device);
        if (r.text != 0) absl::StrAppend(&line_, ", \"label\": ", text_of(r.text));
        break;
      case TraceOp::kCaptureEnd:
      case TraceOp::kReplay:
      case TraceOp::kGraphDestroy:
        absl::StrAppend(&line_, ", \"capture\": ", r.id);
        break;
      case TraceOp::kRelease:
      case TraceOp::kReleaseDone:
        // A release names its block, or the first memory span it names, or
        // (a release of no memory) neither; `release` is the request's
        // number, on both lines, so that each release_done has its release.
        absl::StrAppend(&line_, ", \"release\": ", r.extra);
        if (r.id != 0) {
          absl::StrAppend(&line_, ", \"id\": ", r.id);
        } else if (r.addr != 0) {
          absl::StrAppend(&line_, ", \"addr\": \"0x", absl::Hex(r.addr), "\"");
        }
        if (r.op == TraceOp::kRelease) absl::StrAppend(&line_, ", \"stream\": ", r.stream);
        break;
      case TraceOp::kFinding:
        absl::StrAppend(&line_, ", \"severity\": ", text_of(r.severity), ", \"addr\": \"0x",
                        absl::Hex(r.addr), "\", \"size\": ", r.size,
                        ", \"graph\": ", r.extra);
        if (r.id != 0) absl::StrAppend(&line_, ", \"victim\": ", r.id);
        if (r.stream != 0) {
          absl::StrAppend(&line_, ", \"tag\": ", text_of(static_cast<std::uint32_t>(r.stream)));
        }
        if (r.text != 0 && r.text <= b.texts.size()) {
          absl::StrAppend(&line_, ", \"message\": ", json_string(b.texts[r.text - 1]));
        }
        break;
    }
    line_ += "}\n";
    std::fwrite(line_.data(), 1, line_.size(), file_);
  }
}

}  // namespace capalloc::detail
