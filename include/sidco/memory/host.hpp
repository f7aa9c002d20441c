// Host memory: the memory space of the CPU backends. A memory space names the buffer,
// pointer and view types a backend's data lives in, and the few whole-buffer operations
// (zero, copies to and from host vectors) that code outside a backend may ask for.
#pragma once

#include <algorithm>
#include <cstddef>
#include <span>
#include <vector>

namespace sidco::memory {

struct host {
  static constexpr const char* name = "host";
  /// Owned storage: data(), size(), capacity(), resize() (keeps contents), reserve(), clear().
  template <class T>
  using buffer = std::vector<T>;
  template <class T>
  using pointer = T*;
  /// A non-owning (pointer, size) view; for host memory, std::span.
  template <class T>
  using view = std::span<T>;

  /// The host address of an element pointer: host backends work on raw pointers.
  template <class T>
  static T* address(pointer<T> p) {
    return p;
  }
  template <class T>
  static void zero(view<T> v) {
    std::fill(v.begin(), v.end(), T(0));
  }
  template <class T>
  static void copy_to_host(view<const T> from, std::span<T> to) {
    std::copy(from.begin(), from.end(), to.begin());
  }
  template <class T>
  static void copy_from_host(std::span<const T> from, view<T> to) {
    std::copy(from.begin(), from.end(), to.begin());
  }
};

}  // namespace sidco::memory
