// Exact Top-k: the k largest magnitudes, ties to the lower index, indices ascending.
#pragma once

#include <algorithm>
#include <cstddef>

#include "sidco/backend/concept.hpp"
#include "sidco/select/radix_threshold.hpp"
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

  double estimation_density(double delta) const { return delta; }

  template <backend::backend Backend, class Source, class Out>
  selection_result select(Backend& backend, const Source& source, double, std::size_t k, Out& out) {
    const std::size_t begin = out.size();
    k = std::min(k, source.size);
    const auto start = detail::bucket_of_kth_largest(backend, source, k);
    const std::size_t candidates = detail::select_above<false>(backend, source, start.threshold, out, start.at_or_above);
    backend.keep_top_k(out, begin, k);
    backend.mark_sent(source, out, begin);
    return {candidates, 0};
  }
};

}  // namespace sidco::select
