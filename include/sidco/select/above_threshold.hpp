// Selection: keep every value whose magnitude exceeds the estimated threshold.
#pragma once

#include <cstddef>

#include "sidco/core/sparse_vector.hpp"
#include "sidco/select/result.hpp"

namespace sidco::select {

/// The count is whatever the threshold yields; one compaction pass, error feedback fused.
struct above_threshold {
  static constexpr const char* name = "above_threshold";
  static constexpr bool needs_threshold = true;

  double estimation_density(double delta) const { return delta; }

  template <class Backend, class Source, class T, class Index>
  selection_result select(const Backend& backend, const Source& source, double threshold,
                          std::size_t k, sparse_vector<T, Index>& out) {
    const std::size_t begin = out.size();
    backend.template select_above<true>(source, threshold, out, k);
    return {out.size() - begin, 0};
  }
};

}  // namespace sidco::select
