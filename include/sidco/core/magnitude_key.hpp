// Magnitudes as unsigned integers that order the same way: the bits of |x|.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>
#include <type_traits>

namespace sidco {

/// Unsigned integer of the same width as T; for finite non-negative T its order is T's.
template <class T>
using magnitude_key_t = std::conditional_t<sizeof(T) == 4, std::uint32_t, std::uint64_t>;

template <class T>
magnitude_key_t<T> magnitude_key(T v) {
  return std::bit_cast<magnitude_key_t<T>>(std::fabs(v));
}

/// The magnitude whose key is key.
template <class T>
T magnitude_of_key(magnitude_key_t<T> key) {
  return std::bit_cast<T>(key);
}

}  // namespace sidco
