// runtime/stream_watchers.hpp: the watchers of a runtime's stream
// destructions (MemoryRuntime::watch_stream_destruction), shared by the host
// and GPU runtimes.
//
// A watcher is called, outside the runtime's own locks, after each stream the
// runtime destroyed, and is dropped the first time it returns false (its
// owner, an allocator, is gone). Thread-safe.
#ifndef CAPALLOC_RUNTIME_STREAM_WATCHERS_HPP_
#define CAPALLOC_RUNTIME_STREAM_WATCHERS_HPP_

#include <functional>
#include <mutex>
#include <utility>
#include <vector>

#include "capalloc/runtime.hpp"

namespace capalloc::detail {

class StreamWatchers {
 public:
  void add(std::function<bool(StreamHandle)> watcher) {
    std::lock_guard lock(mu_);
    watchers_.push_back(std::move(watcher));
  }

  // Tells every watcher that `stream` was destroyed.
  void destroyed(StreamHandle stream) {
    std::lock_guard lock(mu_);
    std::erase_if(watchers_, [stream](const auto& watcher) { return !watcher(stream); });
  }

 private:
  std::mutex mu_;
  std::vector<std::function<bool(StreamHandle)>> watchers_;
};

}  // namespace capalloc::detail

#endif  // CAPALLOC_RUNTIME_STREAM_WATCHERS_HPP_
