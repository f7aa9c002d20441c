// Weibull model of magnitudes: P(a > t) = exp(-(t / scale)^shape). Shape 1 is the
// exponential; shape < 1 has the heavier tail that gradient magnitudes often show, with one
// parameter more than the exponential and a closed-form quantile (unlike the gamma).
#pragma once

#include <cmath>

#include <boost/math/special_functions/gamma.hpp>

#include "sidco/core/moments.hpp"

namespace sidco::models {

struct weibull {
  static constexpr const char* name = "weibull";
  static constexpr bool needs_log = true;

  double shape = 1;  // k
  double scale = 1;  // lambda

  /// Fit from the mean and the mean logarithm (the statistics the gamma fit uses): with
  /// u = 1/k, E[a] = lambda Gamma(1 + u) and E[ln a] = ln lambda - gamma_E u, so
  ///   s = ln E[a] - E[ln a] = ln Gamma(1 + u) + gamma_E u,
  /// which rises from 0 with u (its derivative is digamma(1 + u) + gamma_E >= 0): u by
  /// bisection, then lambda = exp(E[ln a] + gamma_E u). All values equal gives s = 0 (or a
  /// rounding below), shape infinite and the quantile at that value; no non-zeros gives NaN.
  /// The compressor's fallback replaces either.
  static weibull fit(const moments& m) {
    if (m.nonzero() == 0) return {NAN, NAN};
    const double s = std::log(m.mean()) - m.mean_log();
    if (s <= 0) return {INFINITY, std::exp(m.mean_log())};
    double low = 0, high = 1;
    while (log_moment_gap(high) < s && high < 1e6) high *= 2;
    for (int i = 0; i < 200 && low < high; ++i) {
      const double mid = 0.5 * (low + high);
      if (mid == low || mid == high) break;
      (log_moment_gap(mid) < s ? low : high) = mid;
    }
    const double u = 0.5 * (low + high);
    return {1 / u, std::exp(m.mean_log() + euler_gamma * u)};
  }

  /// t with P(a > t) = rho: lambda (-ln rho)^(1/k).
  double upper_quantile(double rho) const { return scale * std::pow(-std::log(rho), 1 / shape); }

  double ccdf(double t) const { return t <= 0 ? 1.0 : std::exp(-std::pow(t / scale, shape)); }

  /// ln Gamma(1 + u) + gamma_E u: ln E[a] - E[ln a] of a Weibull with shape 1/u.
  /// Boost's lgamma: std::lgamma writes the global signgam, a race between threads.
  static double log_moment_gap(double u) { return boost::math::lgamma(1 + u) + euler_gamma * u; }

 private:
  static constexpr double euler_gamma = 0.57721566490153286061;
};

}  // namespace sidco::models
