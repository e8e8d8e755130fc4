// runtime/declared_accesses.hpp: the accesses a KernelLaunch
// declares, as graph records list them. Shared by the host and GPU runtimes
// so that both record a launch's reads, writes, updates and state alike.
#ifndef CAPALLOC_RUNTIME_DECLARED_ACCESSES_HPP_
#define CAPALLOC_RUNTIME_DECLARED_ACCESSES_HPP_

#include <cstddef>
#include <cstdint>
#include <cstring>
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

// True when the kernel declares any access (then its declarations, not its
// parameters, describe it).
inline bool declares_accesses(const KernelLaunch& kernel) {
  return !kernel.reads.empty() || !kernel.writes.empty() || !kernel.updates.empty() ||
         !kernel.state.empty();
}

// Calls visit(word) for each nonzero 8-byte-aligned word of `bytes` bytes at
// `data` (one kernel parameter, or a whole parameter buffer): pointers passed
// by value and pointers inside structs passed by value (PyTorch's
// elementwise kernels take theirs in an array inside a struct). An integer
// that looks like an address is a candidate too; the tracker keeps only
// candidates that point into a block. A parameter starts at its own
// alignment, so a pointer member sits at an 8-byte multiple from its start.
// Shared by the host runtime's model and the cuda runtime's inspection, so
// both see the same touches.
template <typename Visit>
void for_each_pointer_word(const void* data, std::size_t bytes, Visit&& visit) {
  const auto* base = static_cast<const std::byte*>(data);
  for (std::size_t at = 0; at + sizeof(std::uint64_t) <= bytes; at += sizeof(std::uint64_t)) {
    std::uint64_t word = 0;
    std::memcpy(&word, base + at, sizeof(word));
    if (word != 0) visit(static_cast<std::uintptr_t>(word));
  }
}

// Appends one inspected touch (mode kTouch, extent 1: the tracker widens it
// to the block the address falls in) per candidate pointer of the kernel's
// parameter buffer (for_each_pointer_word).
inline void append_parameter_touches(const KernelLaunch& kernel, std::size_t position,
                                     std::vector<GraphWrite>& out) {
  for_each_pointer_word(kernel.params.data(), kernel.params.size(), [&](std::uintptr_t word) {
    out.push_back(GraphWrite{.span = {reinterpret_cast<const void*>(word), 1},
                             .position = position, .op = kernel.name,
                             .evidence = WriteEvidence::kInspected, .mode = AccessMode::kTouch});
  });
}

// The most GraphWrites the two appends above give for `kernel` (its
// declared spans, else one per 8-byte word of its parameters): what a list
// of a graph's accesses reserves before it is filled.
inline std::size_t max_accesses(const KernelLaunch& kernel) {
  if (declares_accesses(kernel)) {
    return kernel.reads.size() + kernel.writes.size() + kernel.updates.size() +
           kernel.state.size();
  }
  return kernel.params.size() / sizeof(std::uint64_t);
}

}  // namespace capalloc::detail

#endif  // CAPALLOC_RUNTIME_DECLARED_ACCESSES_HPP_
