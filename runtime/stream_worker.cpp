// stream_worker.cpp: the run loop of a host-runtime stream. See the header for
// the invariants; the one that shapes this file is that an operation dies on
// the worker, inside its own scope, before it is counted as finished.
#include "runtime/stream_worker.hpp"

#include <exception>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/guarded.hpp"

namespace capalloc::detail {

StreamWorker::StreamWorker(std::string stream_label)
    : stream_label_(std::move(stream_label)), thread_([this] { run_loop(); }) {}

StreamWorker::~StreamWorker() { stop(); }

void StreamWorker::enqueue(Operation op) {
  {
    std::lock_guard lock(mu_);
    queue_.push_back(std::move(op));
    ++enqueued_;
  }
  work_cv_.notify_one();
}

absl::Status StreamWorker::drain() {
  std::unique_lock lock(mu_);
  const std::uint64_t target = enqueued_;
  done_cv_.wait(lock, [&] { return finished_ >= target; });
  if (first_failure_.empty()) return absl::OkStatus();
  std::string failure = std::exchange(first_failure_, std::string());
  return absl::InternalError(absl::StrCat(stream_label_, ": ", failure));
}

void StreamWorker::wait_idle() {
  if (std::this_thread::get_id() == thread_.get_id()) return;
  std::unique_lock lock(mu_);
  const std::uint64_t target = enqueued_;
  done_cv_.wait(lock, [&] { return finished_ >= target; });
}

void StreamWorker::stop() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  work_cv_.notify_one();
  if (thread_.joinable()) thread_.join();
}

void StreamWorker::run_loop() {
  std::unique_lock lock(mu_);
  for (;;) {
    work_cv_.wait(lock, [&] { return !queue_.empty() || stopping_; });
    if (queue_.empty()) return;  // stopping, and everything queued has run
    std::string failure;
    {
      Operation op = std::move(queue_.front());
      queue_.pop_front();
      lock.unlock();
      try {
        op.run();
      } catch (...) {
        failure = std::string(status_of_current_exception(op.label).message());
      }
    }  // the operation and all it captured are destroyed here, unlocked
    lock.lock();
    if (!failure.empty() && first_failure_.empty()) first_failure_ = std::move(failure);
    ++finished_;
    done_cv_.notify_all();
  }
}

}  // namespace capalloc::detail
