// No estimate: for selections that need no threshold (Top-k, Random-k).
#pragma once

#include <span>

#include "sidco/backend/pass_statistics.hpp"
#include "sidco/core/moments.hpp"
#include "sidco/estimate/result.hpp"

namespace sidco::estimate {

struct none {
  static constexpr const char* name = "none";
  static constexpr bool provides_threshold = false;
  using statistics = backend::pass_statistics<false>;  // counts: the input check

  template <class Pass>
  threshold_estimate estimate(const moments&, std::span<const moments>, double, Pass&) const {
    return {-1.0, 0};
  }
};

}  // namespace sidco::estimate
