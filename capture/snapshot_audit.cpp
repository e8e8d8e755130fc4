// capture/snapshot_audit.cpp: see snapshot_audit.hpp. The section has the
// shape of live_since_to_json's document (capalloc.live_since/1).
#include "capture/snapshot_audit.hpp"

#include <string>

#include "capalloc/audit.hpp"

namespace capalloc::detail {

void write_audit_section(JsonWriter& j, const Allocator& allocator) {
  AuditCheckpoint since;
  if (!allocator.latest_checkpoint(&since)) {
    j.key("audit").null();
    return;
  }
  const LiveSince live = allocator.live_since(since);
  j.key("audit").begin_object();
  j.field("schema", "capalloc.live_since/1");
  j.field("checkpoint", since.sequence);
  j.field("blocks", live.blocks);
  j.field("bytes", live.bytes);
  j.key("groups").begin_array();
  for (const LiveGroup& g : live.groups) {
    j.begin_object();
    j.field("tag", g.tag);
    j.field("site", g.site);
    j.field("location", g.location);
    j.key("stack").begin_array();
    for (const std::string& frame : g.stack) j.value(frame);
    j.end_array();
    j.field("blocks", g.blocks);
    j.field("bytes", g.bytes);
    j.field("requested_bytes", g.requested_bytes);
    j.key("block_list").begin_array();
    for (const LiveBlock& b : g.block_list) {
      j.begin_object();
      j.key("ptr").pointer(b.ptr);
      j.field("size", static_cast<std::uint64_t>(b.size));
      j.field("requested", static_cast<std::uint64_t>(b.requested));
      j.field("sequence", b.sequence);
      j.field("device", b.device);
      j.field("stream", static_cast<std::uint64_t>(b.stream));
      j.end_object();
    }
    j.end_array();
    j.end_object();
  }
  j.end_array();
  j.end_object();
}

}  // namespace capalloc::detail
