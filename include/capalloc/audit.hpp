// capalloc/audit.hpp: the retention audit: which blocks allocated since a
// checkpoint are still live, grouped by tag and allocation site.
//
// Field reports (seeds 000 and 002) are memory kept alive by a reference
// nobody meant to keep: the last launch's tensors in a cache, a frame held
// in a reference cycle until a collection that never comes. The audit makes
// that visible: take a checkpoint, run the step that should leave nothing
// behind, and ask what is still live.
//
//   allocator->set_record_stacks(true);  // or CAPALLOC_STACKS=1
//   const auto cp = allocator->checkpoint();
//   {
//     capalloc::AllocationTagScope scope(*allocator, "decoder.layer3");
//     run_step();
//   }
//   for (const auto& g : allocator->live_since(cp).groups)
//     std::printf("%s at %s: %llu blocks, %llu bytes\n", g.tag.c_str(), g.site.c_str(), ...);
//
// A block's site is where it was allocated: its call stack when stacks are
// recorded (Allocator::set_record_stacks: absl::GetStackTrace per
// allocation, frames symbolized only when reported), the call site a tag
// scope names (a Python "file.py:12 in f", which a C++ stack behind PyTorch
// cannot show), or both. Its tag is the one it was allocated with, else the
// innermost tag scope of the allocating thread.
//
// Thread safety: everything here may be used from any thread; tag scopes
// are per thread and per allocator.
#ifndef CAPALLOC_AUDIT_HPP_
#define CAPALLOC_AUDIT_HPP_

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "capalloc/export.h"
#include "capalloc/runtime.hpp"

namespace capalloc {

class Allocator;

// A point in an allocator's allocation order: blocks with a greater
// allocation sequence number were allocated after it.
struct AuditCheckpoint {
  std::uint64_t sequence = 0;
};

// One live block of a LiveSince group.
struct LiveBlock {
  const void* ptr = nullptr;
  std::size_t size = 0;       // rounded bytes
  std::size_t requested = 0;  // bytes asked for
  std::uint64_t sequence = 0;
  int device = 0;
  StreamHandle stream = kDefaultStream;  // its segment's (kNoStream: its stream was destroyed)
};

// The live blocks of one (tag, site).
struct LiveGroup {
  std::string tag;                  // "" when untagged
  std::string site;                 // the allocating frame, or the scope's call site; "" unknown
  std::string location;             // the tag scope's call site, if any
  std::vector<std::string> stack;   // symbolized frames, innermost first (stacks recorded)
  std::uint64_t blocks = 0;
  std::uint64_t bytes = 0;          // rounded
  std::uint64_t requested_bytes = 0;
  std::vector<LiveBlock> block_list;  // in allocation order
};

struct LiveSince {
  AuditCheckpoint since;
  std::uint64_t blocks = 0;
  std::uint64_t bytes = 0;
  std::vector<LiveGroup> groups;  // most bytes first
};

// As JSON: {"schema": "capalloc.live_since/1", "checkpoint", "blocks",
// "bytes", "groups": [{"tag", "site", "location", "stack", "blocks", "bytes",
// "requested_bytes", "block_list": [{"ptr", "size", "requested", "sequence",
// "device", "stream"}]}]} (docs/snapshot.md, the audit section).
CAPALLOC_API std::string live_since_to_json(const LiveSince& live);

// Tags the allocations that `allocator` makes on this thread, while the
// scope is open, and that carry no tag of their own, with `tag`, and names
// `location` (a call site such as "model.py:12 in forward"; may be empty) as
// their site. Scopes nest; the innermost scope opened for `allocator`
// applies (a scope opened for another allocator on the same thread does not
// tag this one's allocations, nor the reverse; the C ABI's and Python's
// scopes are the process-wide allocator's). The allocator applies tag
// scopes from the first one opened on it; without a scope open on the
// thread the check costs one thread-local load. Construction fails only past
// 64 nested scopes on one thread: the scope then applies nothing, and ok()
// is false.
class CAPALLOC_API AllocationTagScope {
 public:
  AllocationTagScope(Allocator& allocator, std::string_view tag, std::string_view location = {});
  ~AllocationTagScope();
  AllocationTagScope(const AllocationTagScope&) = delete;
  AllocationTagScope& operator=(const AllocationTagScope&) = delete;
  bool ok() const { return pushed_; }

 private:
  bool pushed_ = false;
};

}  // namespace capalloc

#endif  // CAPALLOC_AUDIT_HPP_
