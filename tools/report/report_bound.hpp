// tools/report/report_bound.hpp: keeps a report page to a size a browser
// draws (docs/report.md, "Large traces").
//
// Every block of a trace is an SVG rectangle and two lines of embedded
// JSON; a trace of hundreds of thousands of blocks makes a page of tens of
// megabytes that no one can look at. When a trace has more blocks than
// `max_blocks`, bound_report_blocks() keeps at most that many (more only
// when the blocks it must keep are more):
//   1. every block a finding involves (the trace's finding events: victim,
//      writer, and the blocks live over the harmed bytes when it was
//      reported; the snapshot's findings: victim, writer, reuse chain),
//      every block the snapshot holds (its live blocks, its audit's list);
//   2. the blocks still live at the end of the trace (what the retention
//      audit asks about);
//   3. then the largest and the longest-lived blocks, alternately.
// The other blocks' events (alloc, free, record_stream, release) are left
// out and summarized per time bucket (blocks and bytes allocated, the most
// of them live at once); every event kept carries its original index as
// `x`, so the page's time axis is unchanged.
#ifndef CAPALLOC_TOOLS_REPORT_REPORT_BOUND_HPP_
#define CAPALLOC_TOOLS_REPORT_REPORT_BOUND_HPP_

#include <cstddef>

#include "tools/report/report_data.hpp"

namespace capalloc::report {

// The default of `capalloc report --max-blocks`: a page of about 2 MB.
inline constexpr std::size_t kDefaultMaxBlocks = 10000;
// How many time buckets summarize the blocks left out.
inline constexpr std::size_t kOmittedBuckets = 64;

// Bounds `data` in place as described above (0: no bound). Sets
// data.omitted and adds a note when blocks were left out.
void bound_report_blocks(ReportData& data, std::size_t max_blocks);

}  // namespace capalloc::report

#endif  // CAPALLOC_TOOLS_REPORT_REPORT_BOUND_HPP_
