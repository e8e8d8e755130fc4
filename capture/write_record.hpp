// capture/write_record.hpp: building a graph's write record.
//
// A declared (or inspected) record starts from the runtime's list of the
// graph's writes (span and capture position of each node) and ties each
// write to the block that occupied that memory at that position of the
// capture; memory no block occupied at the time is written "through no
// block" (sequence 0). A footprint record, for captures whose writes cannot
// be listed (the PyTorch plug-in sees only malloc and free), takes every
// block allocated during the capture as written by the graph over its
// lifetime in the capture.
#ifndef CAPALLOC_CAPTURE_WRITE_RECORD_HPP_
#define CAPALLOC_CAPTURE_WRITE_RECORD_HPP_

#include <cstdint>
#include <vector>

#include "capalloc/capture.hpp"
#include "capture/block_history.hpp"

namespace capalloc::detail {

// The capture a record is built for.
struct CaptureWindow {
  CaptureId capture = 0;
  int device = 0;
  std::uint64_t begin_tick = 0;  // the tracker's tick when the capture began
};

// True when occupant `o` held its memory at capture position `position`.
bool occupied_at(const Occupant& o, const CaptureWindow& window, std::size_t position);

// Ties each of `writes` to its block(s); `record` gets the writes and its
// precision (the weakest evidence among them; kDeclared for none). Adds the
// blocks it weighed (candidates for a write) to `blocks_visited`.
void add_declared_writes(const std::vector<GraphWrite>& writes, const CaptureWindow& window,
                         const BlockHistory& history, WriteRecord& record,
                         std::uint64_t& blocks_visited);

// One footprint write per block allocated during the capture.
void add_footprint_writes(const std::vector<std::uint64_t>& allocated, const BlockHistory& history,
                          WriteRecord& record);

}  // namespace capalloc::detail

#endif  // CAPALLOC_CAPTURE_WRITE_RECORD_HPP_
