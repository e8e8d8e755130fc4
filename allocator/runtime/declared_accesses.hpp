// allocator/runtime/declared_accesses.hpp: the accesses a KernelLaunch
// declares, as graph records list them. Shared by the host and GPU runtimes
// so that both record a launch's reads, writes, updates and state alike.
#ifndef CAPALLOC_ALLOCATOR_RUNTIME_DECLARED_ACCESSES_HPP_
#define CAPALLOC_ALLOCATOR_RUNTIME_DECLARED_ACCESSES_HPP_

#include <cstddef>
#include <vector>

#include "capalloc/runtime.hpp"

namespace capalloc::detail {

// Appends one declared GraphWrite per span the kernel names, with its mode,
// at capture position `position`.
inline void append_declared_accesses(const KernelLaunch& kernel, std::size_t position,
                                     std::vector<GraphWrite>& out) {
  const struct {
    const std::vector<MemorySpan>* spans;
    AccessMode mode;
  } lists[] = {{&kernel.reads, AccessMode::kRead},
               {&kernel.writes, AccessMode::kWrite},
               {&kernel.updates, AccessMode::kReadWrite},
               {&kernel.state, AccessMode::kState}};
  for (const auto& list : lists) {
    for (const MemorySpan& span : *list.spans) {
      if (span.bytes == 0) continue;
      out.push_back(GraphWrite{.span = span, .position = position, .op = kernel.name,
                               .evidence = WriteEvidence::kDeclared, .mode = list.mode});
    }
  }
}

}  // namespace capalloc::detail

#endif  // CAPALLOC_ALLOCATOR_RUNTIME_DECLARED_ACCESSES_HPP_
