// common/log.hpp: capalloc's logger. Quiet by default (warnings and
// errors only); CAPALLOC_LOG_LEVEL=trace|debug|info|warn|error|off changes it.
// Never used on the allocation hot path.
#ifndef CAPALLOC_COMMON_LOG_HPP_
#define CAPALLOC_COMMON_LOG_HPP_

#include <spdlog/spdlog.h>

namespace capalloc::detail {

spdlog::logger& log();

}  // namespace capalloc::detail

#endif  // CAPALLOC_COMMON_LOG_HPP_
