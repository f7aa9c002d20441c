// The bit layout of the floating-point types sidco compresses: the unsigned integer of the
// same width, the sign bit and the bits of +infinity. float and double here; the CUDA
// backend adds __half and __nv_bfloat16 (backend/cuda/half.cuh), and converts them to
// float for arithmetic (to_float).
#pragma once

#include <cstdint>

#include "sidco/core/config.hpp"

namespace sidco {

template <class T>
struct float_traits;

template <>
struct float_traits<float> {
  using key = std::uint32_t;
  using accumulator = float;  // the type sums of this type run in, lane by lane
  static constexpr key infinity = 0x7f800000u;
  static constexpr key sign = 0x80000000u;
  static constexpr const char* name = "float32";
  static constexpr std::uint8_t wire_code = 1;  // how exchanges name the type on the wire
};

template <>
struct float_traits<double> {
  using key = std::uint64_t;
  using accumulator = double;
  static constexpr key infinity = 0x7ff0000000000000ull;
  static constexpr key sign = 0x8000000000000000ull;
  static constexpr const char* name = "float64";
  static constexpr std::uint8_t wire_code = 2;
};

/// v as the accumulator type (float for float and the 16-bit types, double for double).
/// Types without implicit conversions (CUDA's 16-bit types under torch's extension flags,
/// -D__CUDA_NO_HALF_CONVERSIONS__) name theirs in float_traits<T>::widen.
template <class T>
SIDCO_HOST_DEVICE typename float_traits<T>::accumulator to_accumulator(T v) {
  if constexpr (requires { float_traits<T>::widen(v); })
    return float_traits<T>::widen(v);
  else
    return static_cast<typename float_traits<T>::accumulator>(v);
}

/// a rounded to the nearest T: the inverse of to_accumulator (float_traits<T>::narrow where
/// T has no implicit conversion).
template <class T>
SIDCO_HOST_DEVICE T from_accumulator(typename float_traits<T>::accumulator a) {
  if constexpr (requires { float_traits<T>::narrow(a); })
    return float_traits<T>::narrow(a);
  else
    return static_cast<T>(a);
}

}  // namespace sidco
