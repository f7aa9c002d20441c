// One tensor's place in a flat gradient buffer, and the check that a layout tiles it.
#pragma once

#include <cstddef>
#include <limits>
#include <span>

#include "sidco/core/error.hpp"

namespace sidco {

/// Values [offset, offset + size) of the flat buffer.
struct segment {
  std::size_t offset = 0;
  std::size_t size = 0;

  std::size_t end() const { return offset + size; }
  friend bool operator==(const segment&, const segment&) = default;
};

namespace check {

/// Segments must tile [0, total) in order, none empty, total < 2^64 (sizes are added with
/// an overflow check: wrapped sums would let a layout pass for a smaller buffer). Returns
/// the total.
inline std::size_t layout(std::span<const segment> segments) {
  if (segments.empty()) detail::fail("layout is empty");
  std::size_t expected = 0;
  for (std::size_t i = 0; i < segments.size(); ++i) {
    if (segments[i].offset != expected)
      detail::fail("layout: segment ", i, " starts at ", segments[i].offset, ", expected ",
                   expected, " (segments must tile the gradient in order)");
    if (segments[i].size == 0) detail::fail("layout: segment ", i, " is empty");
    if (segments[i].size > std::numeric_limits<std::size_t>::max() - expected)
      detail::fail("layout: segment ", i, " (offset ", segments[i].offset, ", size ", segments[i].size,
                   ") ends past the largest addressable size");
    expected += segments[i].size;
  }
  return expected;
}

}  // namespace check
}  // namespace sidco
