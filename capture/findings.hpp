// capture/findings.hpp: a finding as a JSON object, for callers composing a
// larger document (the CLI's --json output).
#ifndef CAPALLOC_CAPTURE_FINDINGS_HPP_
#define CAPALLOC_CAPTURE_FINDINGS_HPP_

#include "capalloc/capture.hpp"
#include "capture/json_writer.hpp"

namespace capalloc::detail {

void write_finding(JsonWriter& json, const Finding& finding);

}  // namespace capalloc::detail

#endif  // CAPALLOC_CAPTURE_FINDINGS_HPP_
