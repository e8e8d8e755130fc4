// c_api/c_api_audit.cpp: the C ABI of the retention audit (checkpoints,
// live_since, tag scopes, stacks) and of the event trace, over the
// process-wide capalloc (global.hpp). JSON answers live in the calling
// thread's JSON slot, as capalloc_snapshot's do.
#include <optional>
#include <string>

#include "absl/strings/str_cat.h"
#include "allocator/allocation_sites.hpp"
#include "allocator/trace_hooks.hpp"
#include "c_api/c_api_support.hpp"
#include "capalloc/allocator.hpp"
#include "capalloc/audit.hpp"
#include "capalloc/capalloc.h"

namespace {

using capalloc::detail::with_global;
using capalloc::detail::GlobalCapalloc;

capalloc_status null_argument(const char* call, const char* what) {
  return capalloc::detail::report_c_status(
      absl::InvalidArgumentError(absl::StrCat(call, ": ", what, " is NULL")));
}

}  // namespace

extern "C" {

capalloc_status capalloc_checkpoint(uint64_t* out) {
  if (out == nullptr) return null_argument("capalloc_checkpoint", "out");
  return with_global([&](const GlobalCapalloc& g) {
    *out = g.allocator->checkpoint().sequence;
    return absl::OkStatus();
  });
}

capalloc_status capalloc_live_since(uint64_t checkpoint, const char** json) {
  if (json == nullptr) return null_argument("capalloc_live_since", "json");
  return with_global([&](const GlobalCapalloc& g) {
    std::string& slot = capalloc::detail::c_json_slot();
    slot = capalloc::live_since_to_json(g.allocator->live_since({checkpoint}));
    *json = slot.c_str();
    return absl::OkStatus();
  });
}

capalloc_status capalloc_set_record_stacks(int record) {
  if (record != 0 && record != 1) {
    return capalloc::detail::report_c_status(absl::InvalidArgumentError(absl::StrCat(
        "capalloc_set_record_stacks: record is ", record, "; it must be 0 (off) or 1 (on)")));
  }
  return with_global([&](const GlobalCapalloc& g) {
    g.allocator->set_record_stacks(record == 1);
    return absl::OkStatus();
  });
}

capalloc_status capalloc_push_tag(const char* tag, const char* site) {
  if (tag == nullptr) return null_argument("capalloc_push_tag", "tag");
  return with_global([&](const GlobalCapalloc& g) -> absl::Status {
    // The process-wide allocator applies tag scopes from the first one on;
    // a scope object would pop at the end of this call, so the thread's
    // stack is pushed directly and popped by capalloc_pop_tag.
    const void* owner = capalloc::detail::enable_tag_scopes(*g.allocator);
    return capalloc::detail::push_tag_scope(tag, site == nullptr ? "" : site, owner);
  });
}

capalloc_status capalloc_pop_tag(void) {
  return with_global([](const GlobalCapalloc&) { return capalloc::detail::pop_tag_scope(); });
}

capalloc_status capalloc_set_tag(const char* tag, const char* site) {
  return with_global([&](const GlobalCapalloc& g) -> absl::Status {
    if (tag == nullptr) {
      capalloc::detail::set_tag_scope(std::nullopt, "", nullptr);
      return absl::OkStatus();
    }
    const void* owner = capalloc::detail::enable_tag_scopes(*g.allocator);
    capalloc::detail::set_tag_scope(tag, site == nullptr ? "" : site, owner);
    return absl::OkStatus();
  });
}

capalloc_status capalloc_trace_start(const char* path) {
  if (path == nullptr) return null_argument("capalloc_trace_start", "path");
  return with_global([&](const GlobalCapalloc& g) { return g.allocator->start_trace(path); });
}

capalloc_status capalloc_trace_stop(void) {
  return with_global([](const GlobalCapalloc& g) { return g.allocator->stop_trace(); });
}

}  // extern "C"
