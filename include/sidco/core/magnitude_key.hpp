// Magnitudes as unsigned integers that order the same way: the bits of |x|.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

namespace sidco {

/// Unsigned integer of the same width as T; for finite non-negative T its order is T's.
template <class T>
using magnitude_key_t = std::conditional_t<sizeof(T) == 4, std::uint32_t, std::uint64_t>;

/// The bits of v with the sign bit cleared (what std::fabs does, written so that
/// compilers vectorize it).
template <class T>
magnitude_key_t<T> magnitude_key(T v) {
  using Key = magnitude_key_t<T>;
  return std::bit_cast<Key>(v) & (~Key(0) >> 1);
}

/// Signed keys: |v| > t exactly when signed_key(v) > threshold_key<T>(t), for every t
/// (negative t: everything; NaN t: nothing) and every non-NaN v.
template <class T>
using signed_key_t = std::make_signed_t<magnitude_key_t<T>>;

template <class T>
signed_key_t<T> signed_key(T v) {
  return signed_key_t<T>(magnitude_key(v));
}

template <class T>
signed_key_t<T> threshold_key(double t) {
  using S = signed_key_t<T>;
  if (std::isnan(t)) return std::numeric_limits<S>::max();
  if (t < 0) return S(-1);
  // The largest T not above t: |v| > t (in double) exactly when |v| > it.
  T below = T(t);
  if (double(below) > t) below = std::nextafter(below, T(0));
  return signed_key(below);
}

/// The magnitude whose key is key.
template <class T>
T magnitude_of_key(magnitude_key_t<T> key) {
  return std::bit_cast<T>(key);
}

}  // namespace sidco
