// Exact Top-k: the k largest magnitudes, ties to the lower index, indices ascending.
#pragma once

#include <cstddef>

#include "sidco/backend/concept.hpp"
#include "sidco/core/radix_select.hpp"
#include "sidco/select/candidates.hpp"
#include "sidco/select/radix_threshold.hpp"
#include "sidco/select/result.hpp"

namespace sidco::select {

/// Radix select on the magnitude bits: one histogram pass over the top 12 bits (also the
/// input check: it counts the zeros and non-finite values) finds the bucket that holds the
/// k-th largest; one pass collects every value at or above that bucket (error feedback
/// settled in it); the exact top k is then selected among those candidates only. Two passes
/// of streaming reads, no N-sized temporary, against the random access of std::nth_element.
struct top_k {
  static constexpr const char* name = "top-k";
  static constexpr bool needs_threshold = false;
  static constexpr bool fuses_layers = false;
  static constexpr bool ranks_candidates = true;

  double estimation_density(double delta) const { return delta; }

  template <backend::backend Backend, class Source, class Out>
  selection_result select(Backend& backend, const Source& source, double threshold, std::size_t k, Out& out) {
    return select_candidates_whole(backend, source, *this, threshold, k, out);
  }

  /// Starts where its coarse radix bin begins (coarse_histograms, one pass over every layer).
  static constexpr bool starts_from_kth_bin = true;
  template <class T>
  candidate_start start_from_bin(key_bin found) const {
    const auto bucket = detail::bucket_at<T>(found);
    return {bucket.threshold, bucket.at_or_above};
  }

  std::size_t keep(std::size_t k, std::size_t) const { return k; }
};

}  // namespace sidco::select
