// Exact Top-k: the k largest magnitudes, ties to the lower index, indices ascending.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>

#include "sidco/backend/concept.hpp"
#include "sidco/core/magnitude_key.hpp"
#include "sidco/select/result.hpp"
#include "sidco/select/single_threshold.hpp"

namespace sidco::select {

/// Radix select on the magnitude bits: one histogram pass over the top 12 bits finds the
/// bucket that holds the k-th largest; one pass collects every value at or above that
/// bucket (error feedback settled in it); the exact top k is then selected among those
/// candidates only. Three passes of streaming reads, no N-sized temporary, against the
/// random access of std::nth_element.
struct top_k {
  static constexpr const char* name = "top_k";
  static constexpr bool needs_threshold = false;
  static constexpr bool fuses_layers = false;
  static constexpr int bucket_bits = 12;

  double estimation_density(double delta) const { return delta; }

  template <backend::backend Backend, class Source, class Out>
  selection_result select(Backend& backend, const Source& source, double, std::size_t k, Out& out) {
    using T = typename Source::value_type;
    using Key = magnitude_key_t<T>;
    // Magnitude keys have a clear top bit: the next 12 bits are the bucket.
    constexpr int shift = int(8 * sizeof(Key)) - 1 - bucket_bits;
    const std::size_t begin = out.size();
    k = std::min(k, source.size);
    std::array<std::uint64_t, std::size_t(1) << bucket_bits> counts{};
    backend.key_histogram(source, shift, counts);
    std::size_t bucket = counts.size() - 1, above = 0;
    for (; bucket > 0 && above + counts[bucket] < k; --bucket) above += counts[bucket];
    // |x| > t exactly when the key is at least the bucket's lowest key.
    const double t = bucket == 0 ? -1.0
                                 : std::nextafter(double(magnitude_of_key<T>(Key(bucket) << shift)),
                                                  -std::numeric_limits<double>::infinity());
    const std::size_t candidates =
        detail::select_above<false>(backend, source, t, out, std::size_t(above + counts[bucket]));
    backend.keep_top_k(out, begin, k);
    backend.mark_sent(source, out, begin);
    return {candidates, 0};
  }
};

}  // namespace sidco::select
