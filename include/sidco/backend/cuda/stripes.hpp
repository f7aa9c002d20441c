// How a streaming pass reads: a thread visits i, i + stride, ... below end, issuing Items
// loads (each a warp-wide coalesced stripe on the device) before it uses any, so that several
// are in flight where one at a time leaves the memory system idle. Values are used in the
// plain loop's order, so results keep their bits. Host and device code; no CUDA header, so
// the host tests check the order against the plain loop.
#pragma once

#include <cstddef>

#include "sidco/core/config.hpp"

#if defined(__CUDA_ARCH__)  // the device pass only: the host compiler would warn
#define SIDCO_UNROLL _Pragma("unroll")
#else
#define SIDCO_UNROLL
#endif

namespace sidco::backend::cuda_detail {

template <int Items, class Read, class Use>
SIDCO_HOST_DEVICE inline void for_each_striped(std::size_t i, std::size_t end, std::size_t stride, Read read,
                                               Use use) {
  static_assert(Items >= 1);
  using value = decltype(read(i));
  const std::size_t span = std::size_t(Items - 1) * stride;
  for (; end > span && i < end - span; i += std::size_t(Items) * stride) {
    value v[Items];
    SIDCO_UNROLL
    for (int u = 0; u < Items; ++u) v[u] = read(i + std::size_t(u) * stride);
    SIDCO_UNROLL
    for (int u = 0; u < Items; ++u) use(v[u]);
  }
  for (; i < end; i += stride) use(read(i));
}

}  // namespace sidco::backend::cuda_detail
