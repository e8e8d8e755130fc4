// allocator/observation.cpp: see observation.hpp.
#include "allocator/observation.hpp"

#include "allocator/allocation_sites.hpp"
#include "allocator/pool.hpp"

namespace capalloc::detail {

void Observation::on_allocate(Block& block) {
  const TagScope* scope = apply_tag_scopes ? current_tag_scope(this) : nullptr;
  std::uint32_t scope_site = 0;
  if (scope != nullptr) {
    if (block.tag_id == 0) block.tag_id = scope->tag_id;
    scope_site = scope->site_id;
  }
  // Skipped: record_stack_site's caller (this function); the first frame
  // kept is the allocator's allocate, then whoever called it.
  block.site_id = record_stacks ? record_stack_site(scope_site, 1) : scope_site;
  if (trace != nullptr) {
    const Segment& segment = *block.segment;
    if (block.capture != 0 && !trace->capture_begun(block.capture)) {
      // A capture nobody announced to the trace (a native capture, found
      // through its first allocation).
      trace->capture_begin(block.capture, segment.stream, segment.pool->handle(), segment.device,
                           {});
    }
    trace->alloc(block.sequence, block.requested, segment.stream, segment.device, block.tag_id,
                 block.lifetime, block.addr);
  }
}

void Observation::on_free(std::uint64_t sequence) {
  if (trace != nullptr) trace->free(sequence);
}

void Observation::on_record_stream(const Block& block, StreamHandle stream) {
  if (trace != nullptr) trace->record_stream(block.sequence, stream);
}

}  // namespace capalloc::detail
