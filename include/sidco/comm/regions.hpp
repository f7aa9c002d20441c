// The index space of a tensor split into P regions, one owner each, for the reduce-scatter
// exchange (comm/reduce_scatter.hpp). Every rank computes the same boundaries from data
// every rank holds: an even split at first, then the quantiles of the last global selection,
// so that each owner receives about k/P entries from each rank.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "sidco/core/error.hpp"

namespace sidco::comm {

class regions {
 public:
  regions() = default;

  /// [0, size) in `owners` regions of equal size (the first size % owners one larger).
  static regions even(std::size_t size, std::size_t owners) {
    if (owners == 0) sidco::detail::fail("regions: owners = 0");
    regions r;
    r.bounds_.resize(owners + 1);
    for (std::size_t j = 0; j <= owners; ++j) r.bounds_[j] = j * (size / owners) + std::min(j, size % owners);
    return r;
  }

  /// Regions holding equal shares of `selected` (ascending indices below size, every rank's
  /// last global selection): owner j's region starts at the (j m / owners)-th of its m
  /// indices. Fewer indices than owners: an even split.
  template <class Index>
  static regions balanced(std::span<const Index> selected, std::size_t size, std::size_t owners) {
    if (selected.size() < owners) return even(size, owners);
    regions r;
    r.bounds_.resize(owners + 1);
    r.bounds_[0] = 0;
    r.bounds_[owners] = size;
    for (std::size_t j = 1; j < owners; ++j)
      r.bounds_[j] = std::max(r.bounds_[j - 1], std::size_t(selected[j * selected.size() / owners]));
    return r;
  }

  /// From saved bounds (a checkpoint): owners + 1 non-decreasing values from 0 to size.
  static regions from_bounds(std::vector<std::size_t> bounds, std::size_t size) {
    if (bounds.size() < 2 || bounds.front() != 0 || bounds.back() != size ||
        !std::is_sorted(bounds.begin(), bounds.end()))
      sidco::detail::fail("regions: ", bounds.size(), " bounds are not non-decreasing from 0 to ", size);
    regions r;
    r.bounds_ = std::move(bounds);
    return r;
  }

  std::size_t owners() const { return bounds_.empty() ? 0 : bounds_.size() - 1; }
  std::size_t begin(std::size_t owner) const { return bounds_[owner]; }
  std::size_t end(std::size_t owner) const { return bounds_[owner + 1]; }
  std::size_t size() const { return bounds_.empty() ? 0 : bounds_.back(); }
  const std::vector<std::size_t>& bounds() const { return bounds_; }
  friend bool operator==(const regions&, const regions&) = default;

 private:
  std::vector<std::size_t> bounds_;
};

}  // namespace sidco::comm
