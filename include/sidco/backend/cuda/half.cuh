// The 16-bit gradient types backend::cuda compresses: __half and __nv_bfloat16. Their bits,
// their threshold keys, and float arithmetic (sums run in float; values are sent in their
// own type).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <cstdint>
#include <limits>

#include "sidco/core/float_traits.hpp"
#include "sidco/core/magnitude_key.hpp"

namespace sidco {

template <>
struct float_traits<__half> {
  using key = std::uint16_t;
  using accumulator = float;
  static constexpr key infinity = 0x7c00u;
  static constexpr key sign = 0x8000u;
  static constexpr const char* name = "float16";
  static constexpr std::uint8_t wire_code = 3;
  // Explicit: torch's extensions compile with -D__CUDA_NO_HALF_CONVERSIONS__.
  static SIDCO_HOST_DEVICE float widen(__half v) { return __half2float(v); }
  static SIDCO_HOST_DEVICE __half narrow(float a) { return __float2half_rn(a); }
};

template <>
struct float_traits<__nv_bfloat16> {
  using key = std::uint16_t;
  using accumulator = float;
  static constexpr key infinity = 0x7f80u;
  static constexpr key sign = 0x8000u;
  static constexpr const char* name = "bfloat16";
  static constexpr std::uint8_t wire_code = 4;
  static SIDCO_HOST_DEVICE float widen(__nv_bfloat16 v) { return __bfloat162float(v); }
  static SIDCO_HOST_DEVICE __nv_bfloat16 narrow(float a) { return __float2bfloat16_rn(a); }
};

namespace detail {

// The largest 16-bit value not above t >= 0, through float rounded down.
template <class H>
signed_key_t<H> half_threshold_key(double t, H (*round_down)(float)) {
  using S = signed_key_t<H>;
  if (std::isnan(t)) return std::numeric_limits<S>::max();
  if (t < 0) return S(-1);
  float f = float(t);
  if (double(f) > t) f = std::nextafter(f, 0.0f);
  return signed_key(round_down(f));
}

}  // namespace detail

template <>
inline signed_key_t<__half> threshold_key<__half>(double t) {
  return detail::half_threshold_key<__half>(t, [](float f) { return __float2half_rd(f); });
}

template <>
inline signed_key_t<__nv_bfloat16> threshold_key<__nv_bfloat16>(double t) {
  return detail::half_threshold_key<__nv_bfloat16>(t, [](float f) { return __float2bfloat16_rd(f); });
}

}  // namespace sidco
