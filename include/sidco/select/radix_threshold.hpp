// The threshold below the k-th largest magnitude's radix bucket, from one histogram pass.
#pragma once

#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>

#include "sidco/core/magnitude_key.hpp"
#include "sidco/core/radix_select.hpp"

namespace sidco::select::detail {

/// Where a radix select over the top radix_bucket_bits of the magnitude keys starts.
struct radix_bucket {
  double threshold;          // |x| > threshold exactly for the keys in the bucket and above
  std::size_t at_or_above;   // how many values that keeps (at least k, unless N < k)
  bool everything;           // the bucket is the lowest: threshold -1 keeps zeros too
};

inline constexpr int radix_bucket_bits = 12;

/// One histogram pass of the top 12 key bits (magnitude keys have a clear top bit): the
/// highest bucket at which k or more values lie at or above it.
template <class Backend, class Source>
radix_bucket bucket_of_kth_largest(Backend& backend, const Source& source, std::size_t k) {
  using T = typename Source::value_type;
  using Key = magnitude_key_t<T>;
  constexpr int shift = int(8 * sizeof(Key)) - 1 - radix_bucket_bits;
  std::array<std::uint64_t, std::size_t(1) << radix_bucket_bits> counts{};
  backend.key_histogram(source, shift, counts);
  std::size_t needed = k;
  const std::size_t bucket = highest_bin_reaching(counts.data(), counts.size(), needed);
  const std::size_t at_or_above = std::size_t(k - needed + counts[bucket]);
  if (bucket == 0) return {-1.0, at_or_above, true};
  // |x| > t exactly when the key is at least the bucket's lowest key.
  const double t = std::nextafter(double(magnitude_of_key<T>(Key(bucket) << shift)),
                                  -std::numeric_limits<double>::infinity());
  return {t, at_or_above, false};
}

}  // namespace sidco::select::detail
