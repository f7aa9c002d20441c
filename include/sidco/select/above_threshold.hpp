// Selection: keep every value whose magnitude exceeds the estimated threshold.
#pragma once

#include <cstddef>
#include <span>

#include "sidco/backend/concept.hpp"
#include "sidco/core/segment.hpp"
#include "sidco/select/result.hpp"

namespace sidco::select {

/// The count is whatever the threshold yields; one compaction pass, error feedback fused.
/// Per layer, one pass serves every layer with its own threshold (fuses_layers).
struct above_threshold {
  static constexpr const char* name = "above-threshold";
  static constexpr bool needs_threshold = true;
  static constexpr bool fuses_layers = true;

  double estimation_density(double delta) const { return delta; }

  template <backend::backend Backend, class Source, class Out>
  selection_result select(Backend& backend, const Source& source, double threshold, std::size_t k, Out& out) {
    // The backend's layout-wide pass, over one segment: the whole source.
    const segment whole{0, source.size};
    std::size_t kept = 0;
    backend.template select_above<true>(source, std::span<const segment>(&whole, 1),
                                        std::span<const double>(&threshold, 1), out, k,
                                        std::span<std::size_t>(&kept, 1));
    return {kept, 0};
  }
};

}  // namespace sidco::select
