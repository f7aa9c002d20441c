// Replaces the global operator new and delete to count heap allocations. Include it in
// exactly one translation unit of a test program (a replacement is program-wide).
#pragma once

#include <atomic>
#include <cstdlib>
#include <new>

namespace sidco::test {
inline std::atomic<long> heap_allocations{0};
}  // namespace sidco::test

// Out of line: inlined into callers, GCC 12 pairs the free() below with the caller's new and
// warns (-Wmismatched-new-delete) although the pair is this file's own.
[[gnu::noinline]] void* operator new(std::size_t size) {
  ++sidco::test::heap_allocations;
  if (void* p = std::malloc(size ? size : 1)) return p;
  throw std::bad_alloc();
}
[[gnu::noinline]] void operator delete(void* p) noexcept { std::free(p); }
[[gnu::noinline]] void operator delete(void* p, std::size_t) noexcept { std::free(p); }
