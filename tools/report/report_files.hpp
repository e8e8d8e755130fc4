// tools/report/report_files.hpp: writing the report's files, with errors
// that say what failed (docs/report.md, "Files").
//
// `capalloc report -o FILE` writes FILE in a directory that must exist; the
// scenario commands' `--report DIR` create DIR itself when it is missing
// (its parent must exist), before any work runs. Errors name the path:
// kNotFound for a directory that does not exist (the missing one named),
// kFailedPrecondition for a path that is a directory where a file should be
// (or a file where a directory should be), kPermissionDenied for a
// permission or read-only file system refusal, and kDataLoss for a write or
// close that failed (a full disk), each with the system's reason.
#ifndef CAPALLOC_TOOLS_REPORT_REPORT_FILES_HPP_
#define CAPALLOC_TOOLS_REPORT_REPORT_FILES_HPP_

#include <string>
#include <string_view>

#include "absl/status/status.h"

namespace capalloc::report {

// Creates or truncates `path` and writes `text` to it.
absl::Status write_text_file(const std::string& path, std::string_view text);

// Makes sure `dir` is a directory, creating it (not its parents) if missing.
absl::Status make_report_dir(const std::string& dir);

}  // namespace capalloc::report

#endif  // CAPALLOC_TOOLS_REPORT_REPORT_FILES_HPP_
