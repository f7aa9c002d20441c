// The argument checks every entry point shares, and the count every method aims at.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>

#include "sidco/core/error.hpp"

namespace sidco {

/// The count a method aims at: max(1, floor(delta N)).
inline std::size_t target_count(double delta, std::size_t size) {
  const double k = std::floor(delta * double(size));
  // Compare in double first: delta N may exceed what size_t holds only for bad input, and
  // the conversion of such a value is undefined.
  return k >= double(size) ? std::max<std::size_t>(1, size) : std::max<std::size_t>(1, std::size_t(k));
}

namespace check {

/// delta must lie in (0, 1]; what names it in the message.
inline void density(double delta, const char* what = "delta") {
  if (!(delta > 0 && delta <= 1)) detail::fail(what, " = ", delta, " is outside (0, 1]");
}

/// A state or buffer that must match the gradient's size.
inline void same_size(const char* what, std::size_t size, std::size_t gradient) {
  if (size != gradient) detail::fail(what, ": size ", size, " does not match gradient size ", gradient);
}

}  // namespace check
}  // namespace sidco
