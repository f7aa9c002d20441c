// A branch-free natural logarithm the compiler can vectorize (std::log is a library call
// that blocks vectorization of the moments pass). Error below 2e-7 (float) and 1e-14 (double)
// of max(|ln a|, 1) over all positive finite inputs, denormals included (tested).
#pragma once

#include <cstdint>
#include <limits>
#include <type_traits>

#include "sidco/core/bit.hpp"
#include "sidco/core/config.hpp"

namespace sidco {

namespace detail {

/// fast_log's constants, shared with its vector form (backend/highway_kernels.hpp).
template <class T>
struct fast_log_constants {
  using U = std::conditional_t<sizeof(T) == 4, std::uint32_t, std::uint64_t>;
  static constexpr int mantissa_bits = std::numeric_limits<T>::digits - 1;
  static constexpr U exponent_bias = U(std::numeric_limits<T>::max_exponent - 1);
  static constexpr U min_normal = U(1) << mantissa_bits;
  // Mantissas above sqrt(2)'s: m is halved and the exponent raised, so that |s| stays small.
  static constexpr U sqrt2_mantissa = sizeof(T) == 4 ? U(0x3504f3) : U(0x6a09e667f3bcdull);
  // The odd series runs 1 + s2/3 + s2^2/5 + ... up to 1/last_odd.
  static constexpr int last_odd = sizeof(T) == 4 ? 9 : 17;
  static constexpr T ln2 = T(0.693147180559945309417);
};

}  // namespace detail

/// ln(a) for finite a > 0. a = 2^e m with m in [sqrt(1/2), sqrt(2)); ln m = 2 atanh(s),
/// s = (m - 1)/(m + 1), |s| < 0.172, summed as an odd series.
template <class T>
SIDCO_HOST_DEVICE T fast_log(T a) {
  static_assert(std::is_floating_point_v<T>, "fast_log<T>: T must be float or double");
  using C = detail::fast_log_constants<T>;
  using U = typename C::U;
  constexpr int mantissa_bits = C::mantissa_bits;
  constexpr U exponent_bias = C::exponent_bias;
  // Integer arithmetic only, no selects: float compares may trap on NaN and ?: reads as
  // control flow, and either stops the compiler from vectorizing the calling loop.
  using S = std::make_signed_t<U>;
  constexpr U min_normal = C::min_normal;
  const U tiny = U(detail::bit_cast<U>(a) < min_normal);  // denormal: scale into range first
  const T scaled = a * detail::bit_cast<T>((exponent_bias + tiny * U(mantissa_bits)) << mantissa_bits);
  const U bits = detail::bit_cast<U>(scaled);
  const U mantissa = bits & (min_normal - 1);
  const U high = U(mantissa > C::sqrt2_mantissa);
  const T m = detail::bit_cast<T>(mantissa | ((exponent_bias - high) << mantissa_bits));
  const T e = T(S(bits >> mantissa_bits) - S(exponent_bias) + S(high) - S(tiny) * S(mantissa_bits));
  const T s = (m - T(1)) / (m + T(1));
  const T s2 = s * s;
  T series;  // up to 1/C::last_odd, as the vector form
  if constexpr (sizeof(T) == 4)
    series = T(1) + s2 * (T(1) / 3 + s2 * (T(1) / 5 + s2 * (T(1) / 7 + s2 * (T(1) / 9))));
  else
    series = T(1) + s2 * (T(1) / 3 + s2 * (T(1) / 5 + s2 * (T(1) / 7 + s2 * (T(1) / 9 +
             s2 * (T(1) / 11 + s2 * (T(1) / 13 + s2 * (T(1) / 15 + s2 * (T(1) / 17))))))));
  return e * C::ln2 + T(2) * s * series;
}

}  // namespace sidco
