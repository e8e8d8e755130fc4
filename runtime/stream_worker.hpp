// stream_worker.hpp: the thread behind one host-runtime stream.
//
// A StreamWorker owns one std::thread and a FIFO queue of operations. It runs
// them one at a time in enqueue order, which is what makes a host stream an
// ordered, asynchronous queue like a CUDA stream. Invariants:
//   - an operation is destroyed (its std::function and everything it captured)
//     on the worker right after it has run, before the worker counts it as
//     finished; the worker never keeps a copy (field report 000: a launch path
//     that caches its last launch keeps the caller's memory alive);
//   - drain() returns once every operation enqueued before the call has run
//     and been destroyed, so a caller that synchronizes sees its captures
//     released;
//   - stop() runs what is queued, then joins the thread; no operation is
//     dropped.
// An operation that throws does not kill the thread: the first failure is kept
// and reported by the next drain(), as CUDA reports an asynchronous error at
// the next synchronization.
#ifndef CAPALLOC_RUNTIME_STREAM_WORKER_HPP_
#define CAPALLOC_RUNTIME_STREAM_WORKER_HPP_

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

#include "absl/status/status.h"

namespace capalloc::detail {

class StreamWorker {
 public:
  struct Operation {
    std::string label;  // what a failure report names: "kernel fill", "memset"
    std::function<void()> run;
  };

  // Starts the thread. Throws std::system_error if it cannot be started; the
  // runtime converts that into a status.
  explicit StreamWorker(std::string stream_label);
  ~StreamWorker();

  StreamWorker(const StreamWorker&) = delete;
  StreamWorker& operator=(const StreamWorker&) = delete;

  // Appends an operation. May throw std::bad_alloc. Must not be called after
  // stop().
  void enqueue(Operation op);

  // Blocks until every operation enqueued before this call has run and been
  // destroyed. Returns kInternal naming the first operation that threw since
  // the previous drain, if any.
  absl::Status drain();
  // Blocks until every operation enqueued before this call has run, leaving
  // any failure for the next drain() to report. Returns at once when called
  // from this worker's own thread (an operation cannot wait for itself).
  void wait_idle();

  // Runs what is queued, then joins the thread. Idempotent.
  void stop();

 private:
  void run_loop();

  const std::string stream_label_;
  std::mutex mu_;
  std::condition_variable work_cv_;  // signalled on enqueue and stop
  std::condition_variable done_cv_;  // signalled when an operation finishes
  std::deque<Operation> queue_;
  // Tickets: drain() waits for finished_ to reach the count enqueued at the
  // time of the call, so concurrent enqueuers cannot starve it.
  std::uint64_t enqueued_ = 0;
  std::uint64_t finished_ = 0;
  bool stopping_ = false;
  std::string first_failure_;
  std::thread thread_;  // last: started once the members above exist
};

}  // namespace capalloc::detail

#endif  // CAPALLOC_RUNTIME_STREAM_WORKER_HPP_
