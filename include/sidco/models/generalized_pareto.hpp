// Generalized Pareto model of magnitudes (or of excesses over a threshold, where extreme
// value theory says it belongs): P(a > t) = (1 - k t / alpha)^(1/k).
#pragma once

#include <cmath>

#include "sidco/core/config.hpp"
#include "sidco/core/moments.hpp"

namespace sidco::models {

/// Shape k in Hosking's sign convention: k < 0 is a heavy (Pareto) tail, k = 0 the
/// exponential, k > 0 a bounded support [0, alpha / k]. SciPy's genpareto has c = -k.
struct generalized_pareto {
  static constexpr const char* name = "generalized-pareto";
  static constexpr bool needs_log = false;

  double shape = 0;
  double scale = 1;

  /// Below this |k| the closed form loses digits; the exponential limit is exact to O(k).
  static constexpr double exponential_limit = 1e-8;

  /// Method of moments: k = (mu^2/sigma^2 - 1)/2, alpha = mu (mu^2/sigma^2 + 1)/2.
  SIDCO_HOST_DEVICE static generalized_pareto fit(const moments& m) {
    const double mu = m.mean();
    const double r = mu * mu / m.variance();
    return {0.5 * (r - 1), 0.5 * mu * (r + 1)};
  }

  /// alpha (1 - rho^k) / k, computed as -alpha expm1(k ln rho) / k so that it stays
  /// accurate as k -> 0, where it tends to the exponential's -alpha ln rho.
  SIDCO_HOST_DEVICE double upper_quantile(double rho) const {
    const double log_rho = std::log(rho);
    if (std::fabs(shape) < exponential_limit) return -scale * log_rho;
    return -scale * std::expm1(shape * log_rho) / shape;
  }

  SIDCO_HOST_DEVICE double ccdf(double t) const {
    if (t <= 0) return 1.0;
    if (std::fabs(shape) < exponential_limit) return std::exp(-t / scale);
    const double base = 1 - shape * t / scale;
    if (base <= 0) return 0.0;  // beyond a bounded support
    return std::exp(std::log(base) / shape);
  }
};

}  // namespace sidco::models
