// Selection: keep every value whose magnitude exceeds the estimated threshold.
#pragma once

#include <cstddef>

#include "sidco/core/sparse_vector.hpp"

namespace sidco::select {

/// The count is whatever the threshold yields; no pass beyond the one compaction.
struct above_threshold {
  static constexpr const char* name = "above_threshold";

  template <class Backend, class Source, class T, class Index>
  void select(const Backend& backend, const Source& source, double threshold,
              sparse_vector<T, Index>& out) const {
    backend.select_above(source, threshold, out);
  }
};

}  // namespace sidco::select
