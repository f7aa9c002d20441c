// Selection: keep every value whose magnitude exceeds the estimated threshold.
#pragma once

#include <cstddef>

#include "sidco/backend/concept.hpp"
#include "sidco/select/result.hpp"
#include "sidco/select/single_threshold.hpp"

namespace sidco::select {

/// The count is whatever the threshold yields; one compaction pass, error feedback fused.
/// Per layer, one pass serves every layer with its own threshold (fuses_layers).
struct above_threshold {
  static constexpr const char* name = "above_threshold";
  static constexpr bool needs_threshold = true;
  static constexpr bool fuses_layers = true;

  double estimation_density(double delta) const { return delta; }

  template <backend::backend Backend, class Source, class Out>
  selection_result select(Backend& backend, const Source& source, double threshold, std::size_t k, Out& out) {
    return {detail::select_above<true>(backend, source, threshold, out, k), 0};
  }
};

}  // namespace sidco::select
