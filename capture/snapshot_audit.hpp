// capture/snapshot_audit.hpp: the snapshot's "audit" section (docs/snapshot.md):
// the live-since list relative to the allocator's latest checkpoint.
#ifndef CAPALLOC_CAPTURE_SNAPSHOT_AUDIT_HPP_
#define CAPALLOC_CAPTURE_SNAPSHOT_AUDIT_HPP_

#include "capalloc/allocator.hpp"
#include "capture/json_writer.hpp"

namespace capalloc::detail {

// Writes the member "audit": null when no checkpoint was taken, else the
// live_since object of the latest checkpoint.
void write_audit_section(JsonWriter& j, const Allocator& allocator);

}  // namespace capalloc::detail

#endif  // CAPALLOC_CAPTURE_SNAPSHOT_AUDIT_HPP_
