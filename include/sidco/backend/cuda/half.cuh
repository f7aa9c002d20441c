// The 16-bit gradient types backend::cuda compresses: __half and __nv_bfloat16. Their bits,
// their threshold keys, and float arithmetic (sums run in float; values are sent in their
// own type).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "sidco/core/float_traits.hpp"
#include "sidco/core/half.hpp"
#include "sidco/core/magnitude_key.hpp"

namespace sidco {

// The traits of the host types with the same layout (core/half.hpp), plus the conversions
// CUDA names explicitly: torch's extensions compile with -D__CUDA_NO_HALF_CONVERSIONS__.
template <>
struct float_traits<__half> : detail::float16_layout {
  static SIDCO_HOST_DEVICE float widen(__half v) { return __half2float(v); }
  static SIDCO_HOST_DEVICE __half narrow(float a) { return __float2half_rn(a); }
};

template <>
struct float_traits<__nv_bfloat16> : detail::bfloat16_layout {
  static SIDCO_HOST_DEVICE float widen(__nv_bfloat16 v) { return __bfloat162float(v); }
  static SIDCO_HOST_DEVICE __nv_bfloat16 narrow(float a) { return __float2bfloat16_rn(a); }
};

/// The host type with T's bits: T for float and double, float16 and bfloat16 for CUDA's
/// 16-bit types. Host code on device values (an exchange's packing, an owner's selection)
/// runs on it, so that it is the CPU's own code and needs none of CUDA's conversions.
template <class T>
struct host_value {
  using type = T;
};
template <>
struct host_value<__half> {
  using type = float16;
};
template <>
struct host_value<__nv_bfloat16> {
  using type = bfloat16;
};
template <class T>
using host_value_t = typename host_value<T>::type;

// Thresholds are keyed on the host, by the host type of the same layout.
template <>
inline signed_key_t<__half> threshold_key<__half>(double t) {
  return detail::half_threshold_key<detail::float16_layout>(t);
}

template <>
inline signed_key_t<__nv_bfloat16> threshold_key<__nv_bfloat16>(double t) {
  return detail::half_threshold_key<detail::bfloat16_layout>(t);
}

}  // namespace sidco
