// RedSync's threshold (Fang et al., "RedSync: Reducing Synchronization Traffic for Distributed
// Deep Learning", 2019): t = mean + r (max - mean) of |x|, r found by bisection.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <span>

#include "sidco/backend/pass_statistics.hpp"
#include "sidco/core/checks.hpp"
#include "sidco/core/moments.hpp"
#include "sidco/estimate/result.hpp"

namespace sidco::estimate {

/// Bisection on r in [0, 1] that moves the right way: too few kept lowers t, too many
/// raises it; it stops once k to k (1 + tolerance) values are kept. It returns the lowest
/// count of at least k it saw (so a trimming selection can cut to exactly k), or t = mean
/// when even that keeps fewer than k. Mean and max are over the whole gradient.
struct redsync {
  static constexpr const char* name = "redsync";
  static constexpr bool provides_threshold = true;
  using statistics = backend::pass_statistics<true>;

  int max_iterations = 12;
  double tolerance = 0.2;

  template <class Pass>
  threshold_estimate estimate(const moments& all, std::span<const moments>, double delta,
                              Pass& pass) const {
    const double n = double(all.count);
    const double k = double(target_count(delta, std::size_t(all.count)));
    const double mean = all.sum / n;
    double low = 0, high = 1;
    double best = mean, best_kept = -1;
    int iterations = 0;
    while (iterations < max_iterations) {
      ++iterations;
      const double r = (low + high) / 2;
      const double t = mean + r * (all.max - mean);
      const double kept = double(pass.count_above(t));
      if (kept < k) {
        high = r;
      } else {
        if (best_kept < 0 || kept < best_kept) {
          best = t;
          best_kept = kept;
        }
        if (kept <= k * (1 + tolerance)) break;
        low = r;
      }
    }
    return {best, 0};  // no distribution fit: the bisection's steps are count passes (report.passes)
  }
};

}  // namespace sidco::estimate
