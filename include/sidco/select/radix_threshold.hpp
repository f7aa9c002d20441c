// The threshold below the k-th largest magnitude's coarse radix bin, from one histogram pass.
#pragma once

#include <cmath>
#include <cstddef>
#include <limits>
#include <span>

#include "sidco/core/magnitude_key.hpp"
#include "sidco/core/moments.hpp"
#include "sidco/core/radix_select.hpp"
#include "sidco/core/segment.hpp"

namespace sidco::select::detail {

/// Where a radix select over the coarse bins of the magnitude keys starts.
struct radix_bucket {
  double threshold;          // |x| > threshold exactly for the keys in the bin and above
  std::size_t at_or_above;   // how many values that keeps (at least k, unless N < k)
  bool everything;           // the bin is the lowest: threshold -1 keeps zeros too
};

/// The threshold that keeps exactly the values of T in the coarse bin found and above.
template <class T>
radix_bucket bucket_at(key_bin found) {
  using Key = magnitude_key_t<T>;
  if (found.bin == 0) return {-1.0, found.at_or_above, true};
  // |x| > t exactly when the key is at least the bin's lowest key.
  const double t = std::nextafter(double(to_accumulator(magnitude_of_key<T>(Key(Key(found.bin) << coarse_shift<Key>)))),
                                  -std::numeric_limits<double>::infinity());
  return {t, found.at_or_above, false};
}

/// The coarse bin of source's k-th largest magnitude, from one pass.
template <class Backend, class Source>
radix_bucket bucket_of_kth_largest(Backend& backend, const Source& source, std::size_t k) {
  const segment whole{0, source.size};
  key_bin found;
  backend.coarse_histograms(source, std::span<const segment>(&whole, 1), std::span<moments>{});
  backend.kth_largest_bins(std::span<const std::size_t>(&k, 1), std::span<key_bin>(&found, 1));
  return bucket_at<typename Source::value_type>(found);
}

}  // namespace sidco::select::detail
