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

/// The bins a count added to, bin 0 aside (exact zeros and what is too small to tell from
/// them): [low, high], none when low > high.
struct touched_bins {
  std::uint32_t low = std::uint32_t(coarse_bins), high = 0;

  void merge(touched_bins other) {
    low = std::min(low, other.low);
    high = std::max(high, other.high);
  }
};

/// Every bin of a histogram.
inline constexpr touched_bins all_bins{0, std::uint32_t(coarse_bins - 1)};

class kept_histograms {
 public:
  /// coarse_bins counts for each of segments, one after another, left as they were: each
  /// is cleared (clear) where it is counted.
  void resize(std::size_t segments) {
    counts_.resize(segments * coarse_bins);
    touched_.resize(segments);
  }

  /// Zeros segment's histogram where its counts since the last clear touched it (bin 0 and
  /// the bins touch recorded: every other bin is zero already), so that a layer's clear and
  /// its k-th bin walk cost the range its magnitudes span, not 4,096 bins.
  void clear(std::size_t segment) {
    std::uint64_t* histogram = of(segment);
    histogram[0] = 0;
    if (const touched_bins t = touched_[segment]; t.low <= t.high)
      std::fill(histogram + t.low, histogram + t.high + 1, std::uint64_t(0));
    touched_[segment] = {};
  }
  /// Records the bins a count into segment's histogram added to (besides bin 0).
  void touch(std::size_t segment, touched_bins bins) { touched_[segment].merge(bins); }

  /// Adds part, a histogram whose counts touched bins (and bin 0), to segment's.
  void add(std::size_t segment, const std::uint64_t* part, touched_bins bins) {
    std::uint64_t* histogram = of(segment);
    histogram[0] += part[0];
    for (std::size_t b = bins.low; b <= bins.high; ++b) histogram[b] += part[b];
    touch(segment, bins);
  }

  std::uint64_t* of(std::size_t segment) { return counts_.data() + segment * coarse_bins; }
  const std::uint64_t* of(std::size_t segment) const { return counts_.data() + segment * coarse_bins; }

  /// out[s] = the coarse bin of segment s's targets[s]-th largest magnitude, walked down from
  /// its highest touched bin (those above are zero, so any k > 0 lies at or below it; k = 0
  /// is reached at the top bin).
  void kth_largest_bins(std::span<const std::size_t> targets, std::span<key_bin> out) const {
    for (std::size_t s = 0; s < targets.size(); ++s) {
      const std::size_t bins = targets[s] == 0 ? coarse_bins : std::size_t(touched_[s].high) + 1;
      out[s] = kth_largest_bin(of(s), bins, targets[s]);
    }
  }

  std::size_t bytes() const {
    return counts_.capacity() * sizeof(std::uint64_t) + touched_.capacity() * sizeof(touched_bins);
  }

 private:
  std::vector<std::uint64_t> counts_;
  std::vector<touched_bins> touched_;
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
