// common/futex_mutex.hpp: a mutex whose uncontended lock and unlock are one
// atomic operation each.
//
// The allocator takes its lock twice per allocation+free pair, almost always
// uncontended; pthread_mutex_lock/unlock spend some 50 instructions a pair
// on that (callgrind, glibc 2.36). This is the three-state futex mutex (0
// unlocked, 1 locked, 2 locked with waiters): lock is a compare-exchange,
// unlock an exchange, and only a contended lock spins briefly, then sleeps
// in std::atomic::wait (a futex on Linux). Not recursive; satisfies
// Lockable, so std::lock_guard and std::unique_lock work with it.
#ifndef CAPALLOC_COMMON_FUTEX_MUTEX_HPP_
#define CAPALLOC_COMMON_FUTEX_MUTEX_HPP_

#include <atomic>

namespace capalloc::detail {

class FutexMutex {
 public:
  FutexMutex() = default;
  FutexMutex(const FutexMutex&) = delete;
  FutexMutex& operator=(const FutexMutex&) = delete;

  void lock() {
    int expected = 0;
    if (state_.compare_exchange_strong(expected, 1, std::memory_order_acquire)) return;
    lock_contended();
  }

  bool try_lock() {
    int expected = 0;
    return state_.compare_exchange_strong(expected, 1, std::memory_order_acquire);
  }

  // The wake-up is out of line: with notify_one inlined, GCC kept unlock
  // itself out of line, a call on every allocation and free.
  void unlock() {
    if (state_.exchange(0, std::memory_order_release) == 2) wake_one();
  }

 private:
  [[gnu::noinline]] void wake_one() { state_.notify_one(); }

  [[gnu::noinline]] void lock_contended() {
    // A short spin first: the holder's critical section is usually shorter
    // than a sleep and a wake-up.
    for (int spin = 0; spin < 64; ++spin) {
      int expected = 0;
      if (state_.load(std::memory_order_relaxed) == 0 &&
          state_.compare_exchange_weak(expected, 1, std::memory_order_acquire)) {
        return;
      }
#if defined(__x86_64__) || defined(__i386__)
      __builtin_ia32_pause();
#endif
    }
    // Announce a waiter (2) and sleep until the holder's unlock wakes us.
    while (state_.exchange(2, std::memory_order_acquire) != 0) state_.wait(2, std::memory_order_relaxed);
  }

  std::atomic<int> state_{0};
};

}  // namespace capalloc::detail

#endif  // CAPALLOC_COMMON_FUTEX_MUTEX_HPP_
