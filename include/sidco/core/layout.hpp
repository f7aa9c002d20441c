// A layout from tensor sizes: the tensors of a model (or of a DDP bucket) laid end to end in
// one flat buffer, in order, as segmented<> and the exchanges take them. From a manifest
// file: sidco/io/manifest.hpp.
#pragma once

#include <concepts>
#include <cstddef>
#include <initializer_list>
#include <limits>
#include <ranges>
#include <span>
#include <vector>

#include "sidco/core/error.hpp"
#include "sidco/core/segment.hpp"

namespace sidco {

/// Segment i = {the sum of the sizes before it, sizes[i]}. Every size must be at least 1 and
/// their sum addressable; the error names the tensor and its size.
template <std::ranges::input_range Sizes>
  requires std::integral<std::ranges::range_value_t<Sizes>>
std::vector<segment> layout_of(const Sizes& sizes) {
  std::vector<segment> layout;
  if constexpr (std::ranges::sized_range<Sizes>) layout.reserve(std::size_t(std::ranges::size(sizes)));
  std::size_t offset = 0, i = 0;
  for (const auto size : sizes) {
    if (size <= 0) detail::fail("layout_of: tensor ", i, " has size ", size, " (every tensor needs at least one value)");
    if (std::size_t(size) > std::numeric_limits<std::size_t>::max() - offset)
      detail::fail("layout_of: tensor ", i, " (size ", size, ") ends past the largest addressable size");
    layout.push_back({offset, std::size_t(size)});
    offset += std::size_t(size);
    ++i;
  }
  if (layout.empty()) detail::fail("layout_of: no tensors");
  return layout;
}

inline std::vector<segment> layout_of(std::initializer_list<std::size_t> sizes) {
  return layout_of(std::span<const std::size_t>(sizes.begin(), sizes.size()));
}

/// The layout of these tensors (anything with size(): std::vector, std::span, a sidco view),
/// in order.
template <std::ranges::input_range Tensors>
  requires requires(std::ranges::range_reference_t<Tensors> t) {
    { t.size() } -> std::convertible_to<std::size_t>;
  }
std::vector<segment> layout_of_tensors(const Tensors& tensors) {
  std::vector<std::size_t> sizes;
  for (const auto& t : tensors) sizes.push_back(std::size_t(t.size()));
  return layout_of(sizes);
}

}  // namespace sidco
