// 16-bit gradients on the host: IEEE binary16 (float16) and bfloat16, as storage with exact
// conversions (float to 16 bits rounds to nearest, ties to even). Arithmetic runs in float
// and rounds once, as the hardware's does; sums run in float or double. The layouts are
// those of c10::Half, c10::BFloat16, __half and __nv_bfloat16, so their buffers can be used
// as they are. (The CUDA backend compresses __half and __nv_bfloat16: backend/cuda/half.cuh.)
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>

#include "sidco/core/bit.hpp"
#include "sidco/core/config.hpp"
#include "sidco/core/float_traits.hpp"
#include "sidco/core/magnitude_key.hpp"

namespace sidco {

namespace detail {

// The conversions select with masks, not branches (compilers take ?: for control flow and
// will not vectorize it), so that loops over 16-bit values vectorize.

// float to binary16, round to nearest even; NaN stays NaN (quiet), overflow gives infinity.
SIDCO_HOST_DEVICE constexpr std::uint16_t float_to_half_bits(float f) {
  const std::uint32_t x = bit_cast<std::uint32_t>(f);
  const std::uint32_t sign = (x >> 16) & 0x8000u;
  const std::uint32_t magnitude = x & 0x7fffffffu;
  const std::uint32_t normal = (magnitude + 0xfffu + ((magnitude >> 13) & 1u) - 0x38000000u) >> 13;
  // Below binary16's normals, adding 0.5 rounds |f| to a multiple of 2^-24 (to nearest even):
  // the count of 2^-24 is the subnormal's bits (0x400 where it rounds up to the least normal).
  const std::uint32_t subnormal = bit_cast<std::uint32_t>(bit_cast<float>(magnitude) + 0.5f) - 0x3f000000u;
  const std::uint32_t is_normal = 0u - std::uint32_t(magnitude >= 0x38800000u);
  const std::uint32_t overflows = 0u - std::uint32_t(magnitude >= 0x477ff000u);  // rounds to >= 65520
  const std::uint32_t not_finite = 0u - std::uint32_t(magnitude >= 0x7f800000u);
  const std::uint32_t nan_bit = 0x200u & (0u - std::uint32_t(magnitude > 0x7f800000u));
  std::uint32_t bits = (normal & is_normal) | (subnormal & ~is_normal);
  bits = (bits & ~overflows) | (0x7c00u & overflows);
  bits = (bits & ~not_finite) | ((0x7c00u | nan_bit) & not_finite);
  return std::uint16_t(sign | bits);
}

SIDCO_HOST_DEVICE constexpr float half_bits_to_float(std::uint16_t h) {
  const std::uint32_t sign = std::uint32_t(h & 0x8000u) << 16;
  const std::uint32_t magnitude = h & 0x7fffu;
  const std::uint32_t exponent = magnitude >> 10;
  const std::uint32_t normal = (magnitude << 13) + (112u << 23);
  const std::uint32_t not_finite_bits = 0x7f800000u | ((magnitude & 0x3ffu) << 13);
  // Zero and subnormals: mantissa x 2^-24, exact in float.
  const std::uint32_t subnormal = bit_cast<std::uint32_t>(float(std::int32_t(magnitude)) * 0x1p-24f);
  const std::uint32_t is_subnormal = 0u - std::uint32_t(exponent == 0);
  const std::uint32_t not_finite = 0u - std::uint32_t(exponent == 0x1fu);
  std::uint32_t bits = (normal & ~is_subnormal) | (subnormal & is_subnormal);
  bits = (bits & ~not_finite) | (not_finite_bits & not_finite);
  return bit_cast<float>(sign | bits);
}

// float to bfloat16, round to nearest even; NaN stays NaN (quiet).
SIDCO_HOST_DEVICE constexpr std::uint16_t float_to_bfloat16_bits(float f) {
  const std::uint32_t x = bit_cast<std::uint32_t>(f);
  const std::uint32_t rounded = (x + 0x7fffu + ((x >> 16) & 1u)) >> 16;
  const std::uint32_t nan = 0u - std::uint32_t((x & 0x7fffffffu) > 0x7f800000u);
  return std::uint16_t((rounded & ~nan) | (((x >> 16) | 0x40u) & nan));
}

SIDCO_HOST_DEVICE constexpr float bfloat16_bits_to_float(std::uint16_t b) {
  return bit_cast<float>(std::uint32_t(b) << 16);
}

}  // namespace detail

/// IEEE binary16.
struct float16 {
  std::uint16_t bits;

  float16() = default;
  SIDCO_HOST_DEVICE constexpr explicit float16(float f) : bits(detail::float_to_half_bits(f)) {}
  // Through float: one rounding for float values.
  SIDCO_HOST_DEVICE constexpr explicit float16(double d) : float16(float(d)) {}
  SIDCO_HOST_DEVICE constexpr explicit float16(int i) : float16(float(i)) {}
  SIDCO_HOST_DEVICE constexpr explicit operator float() const { return detail::half_bits_to_float(bits); }
  SIDCO_HOST_DEVICE constexpr explicit operator double() const { return double(float(*this)); }
  SIDCO_HOST_DEVICE static constexpr float16 from_bits(std::uint16_t b) {
    float16 h{};
    h.bits = b;
    return h;
  }
  /// IEEE equality (+0 == -0, NaN equals nothing); beyond negation there is no 16-bit
  /// arithmetic (sums go through float_traits<float16>::accumulator).
  SIDCO_HOST_DEVICE friend constexpr bool operator==(float16 a, float16 b) { return float(a) == float(b); }
  SIDCO_HOST_DEVICE friend constexpr float16 operator-(float16 a) {
    return from_bits(std::uint16_t(a.bits ^ 0x8000u));
  }
};

/// bfloat16: float's exponent, 8 bits of mantissa.
struct bfloat16 {
  std::uint16_t bits;

  bfloat16() = default;
  SIDCO_HOST_DEVICE constexpr explicit bfloat16(float f) : bits(detail::float_to_bfloat16_bits(f)) {}
  SIDCO_HOST_DEVICE constexpr explicit bfloat16(double d) : bfloat16(float(d)) {}
  SIDCO_HOST_DEVICE constexpr explicit bfloat16(int i) : bfloat16(float(i)) {}
  SIDCO_HOST_DEVICE constexpr explicit operator float() const { return detail::bfloat16_bits_to_float(bits); }
  SIDCO_HOST_DEVICE constexpr explicit operator double() const { return double(float(*this)); }
  SIDCO_HOST_DEVICE static constexpr bfloat16 from_bits(std::uint16_t b) {
    bfloat16 h{};
    h.bits = b;
    return h;
  }
  SIDCO_HOST_DEVICE friend constexpr bool operator==(bfloat16 a, bfloat16 b) { return float(a) == float(b); }
  SIDCO_HOST_DEVICE friend constexpr bfloat16 operator-(bfloat16 a) {
    return from_bits(std::uint16_t(a.bits ^ 0x8000u));
  }
};

namespace detail {

// The two 16-bit layouts, one traits family for the host's float16 / bfloat16 and CUDA's
// __half / __nv_bfloat16 (backend/cuda/half.cuh), whose bits are the same.
struct float16_layout {
  using key = std::uint16_t;
  using accumulator = float;
  using host_type = float16;
  static constexpr key infinity = 0x7c00u;
  static constexpr key sign = 0x8000u;
  static constexpr const char* name = "float16";
  static constexpr std::uint8_t wire_code = 3;
};
struct bfloat16_layout {
  using key = std::uint16_t;
  using accumulator = float;
  using host_type = bfloat16;
  static constexpr key infinity = 0x7f80u;
  static constexpr key sign = 0x8000u;
  static constexpr const char* name = "bfloat16";
  static constexpr std::uint8_t wire_code = 4;
};

// The key of the largest 16-bit value of Layout not above t >= 0, computed with the host
// type (the threshold is computed on the host for every backend). The sign bit is cleared,
// as signed_key does for float and double, so that -0.0 selects what 0.0 selects.
template <class Layout>
std::int16_t half_threshold_key(double t) {
  using H = typename Layout::host_type;
  if (std::isnan(t)) return std::numeric_limits<std::int16_t>::max();
  if (t < 0) return -1;
  if (t >= double(float(H::from_bits(Layout::infinity)))) return std::int16_t(Layout::infinity);
  float f = float(t);
  if (double(f) > t) f = std::nextafter(f, 0.0f);
  H h(f);
  if (float(h) > f) h = H::from_bits(std::uint16_t(h.bits - 1));  // rounded up: step down (h > 0 here)
  return std::int16_t(h.bits & ~Layout::sign);
}

}  // namespace detail

template <>
struct float_traits<float16> : detail::float16_layout {};
template <>
struct float_traits<bfloat16> : detail::bfloat16_layout {};

template <>
inline signed_key_t<float16> threshold_key<float16>(double t) {
  return detail::half_threshold_key<detail::float16_layout>(t);
}

template <>
inline signed_key_t<bfloat16> threshold_key<bfloat16>(double t) {
  return detail::half_threshold_key<detail::bfloat16_layout>(t);
}

}  // namespace sidco

namespace std {

template <>
class numeric_limits<sidco::float16> {
  using H = sidco::float16;

 public:
  static constexpr bool is_specialized = true;
  static constexpr bool is_signed = true;
  static constexpr bool is_integer = false;
  static constexpr bool is_exact = false;
  static constexpr bool has_infinity = true;
  static constexpr bool has_quiet_NaN = true;
  static constexpr bool has_signaling_NaN = true;
  static constexpr bool is_iec559 = true;
  static constexpr int digits = 11;
  static constexpr int radix = 2;
  static constexpr int min_exponent = -13;
  static constexpr int max_exponent = 16;
  static constexpr H min() { return H::from_bits(0x0400); }
  static constexpr H max() { return H::from_bits(0x7bff); }
  static constexpr H lowest() { return H::from_bits(0xfbff); }
  static constexpr H epsilon() { return H::from_bits(0x1400); }
  static constexpr H infinity() { return H::from_bits(0x7c00); }
  static constexpr H quiet_NaN() { return H::from_bits(0x7e00); }
  static constexpr H signaling_NaN() { return H::from_bits(0x7d00); }
  static constexpr H denorm_min() { return H::from_bits(0x0001); }
};

template <>
class numeric_limits<sidco::bfloat16> {
  using H = sidco::bfloat16;

 public:
  static constexpr bool is_specialized = true;
  static constexpr bool is_signed = true;
  static constexpr bool is_integer = false;
  static constexpr bool is_exact = false;
  static constexpr bool has_infinity = true;
  static constexpr bool has_quiet_NaN = true;
  static constexpr bool has_signaling_NaN = true;
  static constexpr bool is_iec559 = false;
  static constexpr int digits = 8;
  static constexpr int radix = 2;
  static constexpr int min_exponent = -125;
  static constexpr int max_exponent = 128;
  static constexpr H min() { return H::from_bits(0x0080); }
  static constexpr H max() { return H::from_bits(0x7f7f); }
  static constexpr H lowest() { return H::from_bits(0xff7f); }
  static constexpr H epsilon() { return H::from_bits(0x3c00); }
  static constexpr H infinity() { return H::from_bits(0x7f80); }
  static constexpr H quiet_NaN() { return H::from_bits(0x7fc0); }
  static constexpr H signaling_NaN() { return H::from_bits(0x7fa0); }
  static constexpr H denorm_min() { return H::from_bits(0x0001); }
};

}  // namespace std
