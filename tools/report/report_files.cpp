// tools/report/report_files.cpp: see report_files.hpp.
#include "tools/report/report_files.hpp"

#include <sys/stat.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "absl/strings/str_cat.h"

namespace capalloc::report {

namespace {

// The directory a path is in ("." for a bare name).
std::string parent_of(const std::string& path) {
  const std::filesystem::path parent = std::filesystem::path(path).parent_path();
  return parent.empty() ? std::string(".") : parent.string();
}

bool is_directory(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

// The status for `what` on `path` failing with `error` (an errno value).
absl::Status path_error(const std::string& path, const char* what, int error) {
  const std::string reason = std::strerror(error);
  switch (error) {
    case ENOENT: {
      // The file's directory, or one above it, does not exist.
      std::string missing = parent_of(path);
      while (!is_directory(parent_of(missing)) && parent_of(missing) != missing) {
        missing = parent_of(missing);
      }
      return absl::NotFoundError(absl::StrCat(path, ": cannot ", what, ": the directory '",
                                              missing, "' does not exist"));
    }
    case ENOTDIR:
      return absl::FailedPreconditionError(absl::StrCat(
          path, ": cannot ", what, ": a part of the path is a file, not a directory (", reason,
          ")"));
    case EISDIR:
      return absl::FailedPreconditionError(
          absl::StrCat(path, ": cannot ", what, ": it is a directory (", reason, ")"));
    case EACCES:
    case EPERM:
    case EROFS:
      return absl::PermissionDeniedError(absl::StrCat(path, ": cannot ", what, ": ", reason));
    default:
      return absl::DataLossError(absl::StrCat(path, ": cannot ", what, ": ", reason));
  }
}

}  // namespace

absl::Status write_text_file(const std::string& path, std::string_view text) {
  std::FILE* file = std::fopen(path.c_str(), "wb");
  if (file == nullptr) return path_error(path, "be written", errno);
  const bool written = std::fwrite(text.data(), 1, text.size(), file) == text.size();
  const int write_error = errno;
  const bool closed = std::fclose(file) == 0;
  const int close_error = errno;
  if (!written) return path_error(path, "be written", write_error);
  if (!closed) return path_error(path, "be written (closing it failed)", close_error);
  return absl::OkStatus();
}

absl::Status make_report_dir(const std::string& dir) {
  if (dir.empty()) return absl::InvalidArgumentError("--report: the directory is empty");
  if (is_directory(dir)) return absl::OkStatus();
  if (::mkdir(dir.c_str(), 0777) == 0) return absl::OkStatus();
  const int error = errno;
  if (error == EEXIST) {  // a file, or a directory made meanwhile
    if (is_directory(dir)) return absl::OkStatus();
    return absl::FailedPreconditionError(
        absl::StrCat(dir, ": cannot create the report directory: a file of that name exists"));
  }
  return path_error(dir, "create the report directory", error);
}

}  // namespace capalloc::report
