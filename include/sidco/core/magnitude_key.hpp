// Magnitudes as unsigned integers that order the same way: the bits of |x|.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "sidco/core/bit.hpp"
#include "sidco/core/config.hpp"
#include "sidco/core/float_traits.hpp"

namespace sidco {

/// Unsigned integer of the same width as T; for finite non-negative T its order is T's.
template <class T>
using magnitude_key_t = typename float_traits<T>::key;

/// The bits of v with the sign bit cleared (what std::fabs does, written so that
/// compilers vectorize it).
template <class T>
SIDCO_HOST_DEVICE magnitude_key_t<T> magnitude_key(T v) {
  using Key = magnitude_key_t<T>;
  return Key(detail::bit_cast<Key>(v) & Key(~float_traits<T>::sign));
}

/// Signed keys: |v| > t exactly when signed_key(v) > threshold_key<T>(t), for every t
/// (negative t: everything; NaN t: nothing) and every non-NaN v.
template <class T>
using signed_key_t = std::make_signed_t<magnitude_key_t<T>>;

template <class T>
SIDCO_HOST_DEVICE signed_key_t<T> signed_key(T v) {
  return signed_key_t<T>(magnitude_key(v));
}

/// The key of +infinity: keys above it are NaN.
template <class T>
SIDCO_HOST_DEVICE constexpr signed_key_t<T> infinity_key() {
  return signed_key_t<T>(float_traits<T>::infinity);
}

/// |v| > t for the key of v and above = threshold_key(t); NaN (keys above infinity's) never
/// is, as in a double compare. The key width names float or double; 16-bit types, whose
/// infinities differ, use exceeds<T>.
template <class S>
SIDCO_HOST_DEVICE bool key_exceeds(S key, S above) {
  static_assert(sizeof(S) >= 4, "key_exceeds: for 16-bit types, name the type: exceeds<T>(key, above)");
  constexpr S infinity = sizeof(S) == 4 ? S(0x7f800000) : S(0x7ff0000000000000ll);
  return (key > above) & (key <= infinity);
}

template <class T>
SIDCO_HOST_DEVICE bool exceeds(signed_key_t<T> key, signed_key_t<T> above) {
  return (key > above) & (key <= infinity_key<T>());
}

/// The key of the largest T not above t >= 0: |v| > t (in double) exactly when |v| > it.
/// For float and double; the 16-bit types (host and CUDA) have theirs in core/half.hpp.
template <class T>
signed_key_t<T> threshold_key(double t) {
  using S = signed_key_t<T>;
  if (std::isnan(t)) return std::numeric_limits<S>::max();
  if (t < 0) return S(-1);
  T below = T(t);
  if (double(below) > t) below = std::nextafter(below, T(0));
  return signed_key(below);
}

/// The magnitude whose key is key.
template <class T>
SIDCO_HOST_DEVICE T magnitude_of_key(magnitude_key_t<T> key) {
  return detail::bit_cast<T>(key);
}

}  // namespace sidco
