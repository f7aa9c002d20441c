// Every segment's coarse histogram of magnitude keys, kept by a host backend from its
// coarse_histograms pass for kth_largest_bins: the serial oracle and backend::cpu share it.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "sidco/core/float_traits.hpp"
#include "sidco/core/magnitude_key.hpp"
#include "sidco/core/radix_select.hpp"

namespace sidco::backend::host {

class kept_histograms {
 public:
  /// coarse_bins counts for each of segments, one after another, left as they were: each
  /// is cleared (clear) where it is counted.
  void resize(std::size_t segments) { counts_.resize(segments * coarse_bins); }
  void clear(std::size_t segment) { std::fill(of(segment), of(segment) + coarse_bins, std::uint64_t(0)); }
  std::uint64_t* of(std::size_t segment) { return counts_.data() + segment * coarse_bins; }
  const std::uint64_t* of(std::size_t segment) const { return counts_.data() + segment * coarse_bins; }

  /// out[s] = the coarse bin of segment s's targets[s]-th largest magnitude.
  void kth_largest_bins(std::span<const std::size_t> targets, std::span<key_bin> out) const {
    for (std::size_t s = 0; s < targets.size(); ++s) out[s] = kth_largest_bin(of(s), coarse_bins, targets[s]);
  }

  std::size_t bytes() const { return counts_.capacity() * sizeof(std::uint64_t); }

 private:
  std::vector<std::uint64_t> counts_;
};

/// The non-finite values a coarse histogram of T's keys counts: its bins from infinity's up,
/// exactly, since infinity's key has no bits below the coarse bin.
template <class T>
std::uint64_t nonfinite_in_histogram(const std::uint64_t* histogram) {
  using Key = magnitude_key_t<T>;
  constexpr Key infinity = float_traits<T>::infinity;
  constexpr std::size_t first = std::size_t(infinity >> coarse_shift<Key>);
  static_assert((Key(first) << coarse_shift<Key>) == infinity, "infinity's key must start a coarse bin");
  std::uint64_t n = 0;
  for (std::size_t b = first; b < coarse_bins; ++b) n += histogram[b];
  return n;
}

}  // namespace sidco::backend::host
