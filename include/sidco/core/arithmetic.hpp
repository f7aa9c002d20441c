// Element arithmetic that every backend rounds the same way: host loops, SIMD lanes and
// GPU threads alike (compilers contract a * b + c into a fused multiply-add in some places
// and not in others unless it is written out).
#pragma once

#include "sidco/core/config.hpp"
#include "sidco/core/float_traits.hpp"

namespace sidco::detail {

/// a b + c rounded once.
template <class T>
SIDCO_HOST_DEVICE T fused_multiply_add(T a, T b, T c) {
  if constexpr (sizeof(T) < 4) {
    return T(fused_multiply_add(to_accumulator(a), to_accumulator(b), to_accumulator(c)));
  } else {
#if defined(__CUDA_ARCH__)
    return fma(a, b, c);
#else
    if constexpr (sizeof(T) == 4)
      return __builtin_fmaf(a, b, c);
    else
      return __builtin_fma(a, b, c);
#endif
  }
}

/// a + b in T: 16-bit types add in float and round once, as their hardware add does.
template <class T>
SIDCO_HOST_DEVICE T add(T a, T b) {
  if constexpr (sizeof(T) >= 4)
    return a + b;
  else
    return from_accumulator<T>(to_accumulator(a) + to_accumulator(b));
}

}  // namespace sidco::detail
