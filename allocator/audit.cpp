// allocator/audit.cpp: the Allocator's retention audit (checkpoint,
// live_since, stacks, tag scopes) and event trace calls; the observer they
// install is in observation.cpp, sites in allocation_sites.cpp, the trace
// writer in event_trace.cpp. Nothing here is on the hot path.
#include <algorithm>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "allocator/allocation_sites.hpp"
#include "allocator/allocator_impl.hpp"
#include "allocator/trace_hooks.hpp"
#include "capalloc/audit.hpp"
#include "common/interned_strings.hpp"
#include "common/log.hpp"
#include "nlohmann/json.hpp"

namespace capalloc {

using detail::Block;

detail::Observation& Allocator::Impl::observe() {
  if (observation == nullptr) {
    observation = std::make_unique<detail::Observation>();
    observer = observation.get();
  }
  return *observation;
}

absl::Status Allocator::Impl::start_observing(const AllocatorOptions& from) {
  std::lock_guard lock(mu);
  if (from.record_stacks) observe().record_stacks = true;
  if (from.trace_path.empty()) return absl::OkStatus();
  auto trace = detail::EventTrace::open(from.trace_path, static_cast<int>(devices.size()));
  if (!trace.ok()) {
    // A trace is an observation, not the allocator's work: an allocator
    // that cannot write it still allocates. Said once, here; trace_path()
    // stays empty, and an explicit start_trace() returns the error.
    detail::log().error("{}; the allocator runs without an event trace (trace_path or "
                        "CAPALLOC_TRACE)",
                        std::string(trace.status().message()));
    return absl::OkStatus();
  }
  observe().trace = *std::move(trace);
  return absl::OkStatus();
}

void Allocator::set_record_stacks(bool record) {
  std::lock_guard lock(impl_->mu);
  if (!record && impl_->observation == nullptr) return;
  impl_->observe().record_stacks = record;
}

bool Allocator::record_stacks() const {
  std::lock_guard lock(impl_->mu);
  return impl_->observation != nullptr && impl_->observation->record_stacks;
}

AuditCheckpoint Allocator::checkpoint() {
  std::lock_guard lock(impl_->mu);
  impl_->latest_checkpoint = impl_->next_sequence - 1;
  impl_->has_checkpoint = true;
  return AuditCheckpoint{impl_->latest_checkpoint};
}

bool Allocator::latest_checkpoint(AuditCheckpoint* out) const {
  std::lock_guard lock(impl_->mu);
  if (impl_->has_checkpoint && out != nullptr) out->sequence = impl_->latest_checkpoint;
  return impl_->has_checkpoint;
}

LiveSince Allocator::live_since(AuditCheckpoint since) const {
  // By (tag id, site id), as one number.
  absl::flat_hash_map<std::uint64_t, std::vector<LiveBlock>> by_key;
  {
    std::lock_guard lock(impl_->mu);
    impl_->for_each_live([&](std::uintptr_t, const Block* b) {
      if (b->sequence <= since.sequence) return;
      by_key[std::uint64_t{b->tag_id} << 32 | b->site_id].push_back(LiveBlock{
          b->ptr(), b->size, b->requested, b->sequence, b->segment->device, b->segment->stream});
    });
  }
  // Symbolized outside the allocator's lock. Two sites can differ only in
  // raw frames that symbolize alike (return addresses inside one function,
  // frames past what is shown): groups are keyed by what is shown (tag,
  // site, location, stack), so identical-looking groups are one.
  LiveSince out;
  out.since = since;
  absl::flat_hash_map<std::string, std::size_t> shown;  // what is shown -> index in out.groups
  for (auto& [key, blocks] : by_key) {
    LiveGroup g;
    g.tag = std::string(detail::interned(static_cast<std::uint32_t>(key >> 32)));
    detail::SiteDescription site = detail::describe_site(static_cast<std::uint32_t>(key));
    g.site = std::move(site.summary);
    g.location = std::move(site.location);
    g.stack = std::move(site.frames);
    std::string seen = absl::StrCat(g.tag.size(), ":", g.tag, g.site.size(), ":", g.site,
                                    g.location.size(), ":", g.location);
    for (const std::string& f : g.stack) absl::StrAppend(&seen, f.size(), ":", f);
    auto [it, fresh] = shown.try_emplace(std::move(seen), out.groups.size());
    LiveGroup& into = fresh ? out.groups.emplace_back(std::move(g)) : out.groups[it->second];
    for (const LiveBlock& b : blocks) {
      ++into.blocks;
      into.bytes += b.size;
      into.requested_bytes += b.requested;
      into.block_list.push_back(b);
    }
    out.blocks += blocks.size();
    for (const LiveBlock& b : blocks) out.bytes += b.size;
  }
  for (LiveGroup& g : out.groups) {
    std::sort(g.block_list.begin(), g.block_list.end(),
              [](const LiveBlock& a, const LiveBlock& b) { return a.sequence < b.sequence; });
  }
  std::sort(out.groups.begin(), out.groups.end(), [](const LiveGroup& a, const LiveGroup& b) {
    if (a.bytes != b.bytes) return a.bytes > b.bytes;
    return a.block_list.front().sequence < b.block_list.front().sequence;
  });
  return out;
}

std::string live_since_to_json(const LiveSince& live) {
  auto text = [](const std::string& s) { return nlohmann::json(s); };
  nlohmann::json groups = nlohmann::json::array();
  for (const LiveGroup& g : live.groups) {
    nlohmann::json blocks = nlohmann::json::array();
    for (const LiveBlock& b : g.block_list) {
      blocks.push_back({{"ptr", absl::StrFormat("%p", b.ptr)},
                        {"size", b.size},
                        {"requested", b.requested},
                        {"sequence", b.sequence},
                        {"device", b.device},
                        {"stream", static_cast<std::uint64_t>(b.stream)}});
    }
    nlohmann::json stack = nlohmann::json::array();
    for (const std::string& f : g.stack) stack.push_back(text(f));
    groups.push_back({{"tag", text(g.tag)},
                      {"site", text(g.site)},
                      {"location", text(g.location)},
                      {"stack", std::move(stack)},
                      {"blocks", g.blocks},
                      {"bytes", g.bytes},
                      {"requested_bytes", g.requested_bytes},
                      {"block_list", std::move(blocks)}});
  }
  const nlohmann::json doc = {{"schema", "capalloc.live_since/1"},
                              {"checkpoint", live.since.sequence},
                              {"blocks", live.blocks},
                              {"bytes", live.bytes},
                              {"groups", std::move(groups)}};
  return doc.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

AllocationTagScope::AllocationTagScope(Allocator& allocator, std::string_view tag,
                                       std::string_view location) {
  const void* owner = detail::enable_tag_scopes(allocator);
  pushed_ = detail::push_tag_scope(tag, location, owner).ok();
}

AllocationTagScope::~AllocationTagScope() {
  if (pushed_) detail::pop_tag_scope().IgnoreError();
}

// --- The event trace -----------------------------------------------------------

absl::Status Allocator::start_trace(std::string_view path) {
  Impl& m = *impl_;
  std::lock_guard lock(m.mu);
  if (m.observation != nullptr && m.observation->trace != nullptr) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "start_trace: a trace is already being written to '%s'; stop_trace first",
        m.observation->trace->path()));
  }
  auto trace = detail::EventTrace::open(path, static_cast<int>(m.devices.size()));
  if (!trace.ok()) return trace.status();
  // Destroyed streams' blocks are written with kNoStream, not a handle
  // a new stream may hold by now.
  m.apply_runtime_reports();
  // The blocks live now, as allocs, so that every later free names a block
  // the trace introduced.
  std::vector<const Block*> live;
  live.reserve(m.live_count());
  m.for_each_live([&](std::uintptr_t, const Block* b) { live.push_back(b); });
  std::sort(live.begin(), live.end(),
            [](const Block* a, const Block* b) { return a->sequence < b->sequence; });
  for (const Block* b : live) {
    (*trace)->live_block(b->sequence, b->requested, b->segment->stream, b->segment->device,
                         b->tag_id, b->lifetime, b->addr);
  }
  m.observe().trace = *std::move(trace);
  return absl::OkStatus();
}

absl::Status Allocator::stop_trace() {
  std::unique_ptr<detail::EventTrace> trace;
  {
    std::lock_guard lock(impl_->mu);
    if (impl_->observation != nullptr) trace = std::move(impl_->observation->trace);
  }
  if (trace == nullptr) return absl::FailedPreconditionError("stop_trace: no trace is running");
  return trace->close();  // outside the lock: it waits for the writer
}

std::string Allocator::trace_path() const {
  std::lock_guard lock(impl_->mu);
  if (impl_->observation == nullptr || impl_->observation->trace == nullptr) return {};
  return impl_->observation->trace->path();
}

namespace detail {

namespace {

// Runs `body` on the running trace, under the allocator's lock.
template <typename Body>
void with_trace(const Allocator& a, Body&& body) {
  auto& m = AllocatorAccess::impl(a);
  std::lock_guard lock(m.mu);
  if (m.observation != nullptr && m.observation->trace != nullptr) body(*m.observation->trace);
}

}  // namespace

const void* enable_tag_scopes(const Allocator& a) {
  auto& m = AllocatorAccess::impl(a);
  std::lock_guard lock(m.mu);
  Observation& o = m.observe();
  o.apply_tag_scopes = true;
  return &o;  // lives as long as the allocator: the owner of its scopes
}

void trace_capture_begin(const Allocator& a, CaptureId capture, StreamHandle stream,
                         PoolHandle pool, int device, std::string_view label) {
  with_trace(a, [&](EventTrace& t) { t.capture_begin(capture, stream, pool, device, label); });
}
void trace_capture_end(const Allocator& a, CaptureId capture) {
  with_trace(a, [&](EventTrace& t) { t.capture_end(capture); });
}
void trace_replay(const Allocator& a, CaptureId capture) {
  with_trace(a, [&](EventTrace& t) { t.replay(capture); });
}
void trace_graph_destroy(const Allocator& a, CaptureId capture) {
  with_trace(a, [&](EventTrace& t) { t.graph_destroy(capture); });
}
void trace_release(const Allocator& a, std::uint64_t request, std::uint64_t id, const void* addr,
                   StreamHandle stream) {
  with_trace(a, [&](EventTrace& t) {
    t.release(request, id, reinterpret_cast<std::uintptr_t>(addr), stream);
  });
}
void trace_release_done(const Allocator& a, std::uint64_t request, std::uint64_t id,
                        const void* addr) {
  with_trace(a, [&](EventTrace& t) {
    t.release_done(request, id, reinterpret_cast<std::uintptr_t>(addr));
  });
}
bool trace_running(const Allocator& a) {
  bool running = false;
  with_trace(a, [&](EventTrace&) { running = true; });
  return running;
}
void trace_finding(const Allocator& a, std::string_view severity, const void* addr,
                   std::size_t size, std::uint64_t graph, std::uint64_t victim,
                   std::string_view victim_tag, std::string message) {
  with_trace(a, [&](EventTrace& t) {
    t.finding(severity, reinterpret_cast<std::uintptr_t>(addr), size, graph, victim,
              intern_id(victim_tag), std::move(message));
  });
}

}  // namespace detail

}  // namespace capalloc
