// common/status_macros.hpp: early returns on absl::Status errors, for
// code that chains many fallible runtime calls (scenarios, the CLI).
#ifndef CAPALLOC_COMMON_STATUS_MACROS_HPP_
#define CAPALLOC_COMMON_STATUS_MACROS_HPP_

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define CAPALLOC_CONCAT_INNER_(a, b) a##b
#define CAPALLOC_CONCAT_(a, b) CAPALLOC_CONCAT_INNER_(a, b)

// Returns the status of `expr` (an absl::Status) if it is not OK.
#define CAPALLOC_RETURN_IF_ERROR(expr)            \
  do {                                            \
    const ::absl::Status capalloc_rie_ = (expr);  \
    if (!capalloc_rie_.ok()) return capalloc_rie_; \
  } while (0)

// `lhs = value of expr` (an absl::StatusOr), or returns its status.
#define CAPALLOC_ASSIGN_OR_RETURN(lhs, expr) \
  CAPALLOC_ASSIGN_OR_RETURN_IMPL_(CAPALLOC_CONCAT_(capalloc_aor_, __LINE__), lhs, expr)
#define CAPALLOC_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                                    \
  if (!tmp.ok()) return tmp.status();                   \
  lhs = *std::move(tmp)

#endif  // CAPALLOC_COMMON_STATUS_MACROS_HPP_
