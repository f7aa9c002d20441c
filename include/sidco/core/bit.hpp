// Bit casts usable in host and device code (std::bit_cast warns in nvcc's device code).
#pragma once

#include "sidco/core/config.hpp"

namespace sidco::detail {

template <class To, class From>
SIDCO_HOST_DEVICE constexpr To bit_cast(const From& from) noexcept {
  static_assert(sizeof(To) == sizeof(From), "bit_cast: sizes differ");
  return __builtin_bit_cast(To, from);
}

}  // namespace sidco::detail
