// tests/replaced_operator_new.hpp: replaces the global operator new and
// delete of the test program that includes it, so that the program can
// watch (or fail) every heap allocation through a hook of its own.
//
// Include it in exactly one translation unit of the program: the
// replacements are ordinary (non-inline) definitions, as the standard
// requires of replacement functions. The program defines
// capalloc_test::before_operator_new(), which runs before each allocation
// through operator new (plain, array, nothrow and aligned) and may throw
// std::bad_alloc to fail it; the nothrow forms then return nullptr.
//
// Users: steady_state_test.cpp (counts allocations), alloc_failure_test.cpp
// (fails the k-th).
#ifndef CAPALLOC_TESTS_REPLACED_OPERATOR_NEW_HPP_
#define CAPALLOC_TESTS_REPLACED_OPERATOR_NEW_HPP_

#include <cstddef>
#include <cstdlib>
#include <new>

namespace capalloc_test {

// Defined by the including program.
void before_operator_new();

namespace replaced_new_detail {

inline void* allocate(std::size_t size) {
  before_operator_new();
  if (void* p = std::malloc(size == 0 ? 1 : size)) return p;
  throw std::bad_alloc();
}

inline void* allocate_aligned(std::size_t size, std::align_val_t align) {
  before_operator_new();
  const auto a = static_cast<std::size_t>(align);
  if (void* p = std::aligned_alloc(a, (size + a - 1) / a * a)) return p;
  throw std::bad_alloc();
}

}  // namespace replaced_new_detail
}  // namespace capalloc_test

void* operator new(std::size_t size) { return capalloc_test::replaced_new_detail::allocate(size); }
void* operator new[](std::size_t size) {
  return capalloc_test::replaced_new_detail::allocate(size);
}
void* operator new(std::size_t size, const std::nothrow_t&) noexcept {
  try {
    return capalloc_test::replaced_new_detail::allocate(size);
  } catch (...) {
    return nullptr;
  }
}
void* operator new[](std::size_t size, const std::nothrow_t&) noexcept {
  try {
    return capalloc_test::replaced_new_detail::allocate(size);
  } catch (...) {
    return nullptr;
  }
}
void* operator new(std::size_t size, std::align_val_t a) {
  return capalloc_test::replaced_new_detail::allocate_aligned(size, a);
}
void* operator new[](std::size_t size, std::align_val_t a) {
  return capalloc_test::replaced_new_detail::allocate_aligned(size, a);
}

// Every form of delete frees what malloc or aligned_alloc gave. GCC, seeing
// a replaced operator new inlined into a caller of these, would take the
// free for a mismatch (-Wmismatched-new-delete, an error in the sanitizer
// builds).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
void operator delete(void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete(void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }
void operator delete(void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { std::free(p); }
#pragma GCC diagnostic pop

#endif  // CAPALLOC_TESTS_REPLACED_OPERATOR_NEW_HPP_
