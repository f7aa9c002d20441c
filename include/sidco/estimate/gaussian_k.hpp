// Gaussian-k (Shi et al., "Understanding Top-k Sparsification in Distributed Deep Learning",
// 2019): a normal model of the gradient, then a few steps towards k.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <span>

#include "sidco/backend/pass_statistics.hpp"
#include "sidco/core/checks.hpp"
#include "sidco/core/moments.hpp"
#include "sidco/models/normal.hpp"
#include "sidco/estimate/result.hpp"

namespace sidco::estimate {

/// t = sigma sqrt(2) erfc^-1(delta), so both tails together hold delta of a N(0, sigma^2),
/// with sigma^2 the mean square of the whole gradient (zeros included, as in the paper; the
/// mean, about 0 for gradients, is folded into it). Then up to max_adjustments passes: fewer
/// than 2k/3 kept halves t, more than 4k/3 multiplies it by 1.5.
struct gaussian_k {
  static constexpr const char* name = "gaussian-k";
  static constexpr bool provides_threshold = true;
  using statistics = backend::pass_statistics<true>;

  int max_adjustments = 5;

  template <class Pass>
  threshold_estimate estimate(const moments& all, std::span<const moments>, double delta,
                              Pass& pass) const {
    const double n = double(all.count);
    const double k = double(target_count(delta, std::size_t(all.count)));
    const double sigma = std::sqrt(all.sum_sq / n);
    if (sigma == 0) return {0.0, 0};
    double t = models::normal{sigma}.upper_quantile(delta);
    int steps = 0;
    for (; steps < max_adjustments; ++steps) {
      const double kept = double(pass.count_above(t));
      if (kept < 2 * k / 3)
        t *= 0.5;
      else if (kept > 4 * k / 3)
        t *= 1.5;
      else
        break;
    }
    return {t, 1};
  }
};

}  // namespace sidco::estimate
