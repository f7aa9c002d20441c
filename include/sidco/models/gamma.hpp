// Gamma model of magnitudes, fitted from the mean and the mean logarithm.
#pragma once

#include <cmath>

#include <boost/math/special_functions/gamma.hpp>

#include "sidco/core/config.hpp"
#include "sidco/core/moments.hpp"

namespace sidco::models {

struct gamma {
  static constexpr const char* name = "gamma";
  static constexpr bool needs_log = true;

  double shape = 1;
  double scale = 1;

  /// Minka's closed-form approximation of the maximum-likelihood shape:
  /// s = ln mean - mean(ln a), k = (3 - s + sqrt((s - 3)^2 + 24 s)) / (12 s), theta = mean/k.
  SIDCO_HOST_DEVICE static gamma fit(const moments& m) {
    const double mu = m.mean();
    const double s = std::log(mu) - m.mean_log();
    const double k = (3 - s + std::sqrt((s - 3) * (s - 3) + 24 * s)) / (12 * s);
    return {k, mu / k};
  }

  /// theta * Q^-1(k, rho). Host only: Boost.Math has no device build.
  double upper_quantile(double rho) const {
    return scale * boost::math::gamma_q_inv(shape, rho, quiet_policy{});
  }

  double ccdf(double t) const {
    return t <= 0 ? 1.0 : boost::math::gamma_q(shape, t / scale, quiet_policy{});
  }

 private:
  // Degenerate fits return inf/NaN for the caller to check instead of throwing.
  using quiet_policy = boost::math::policies::policy<
      boost::math::policies::overflow_error<boost::math::policies::ignore_error>,
      boost::math::policies::domain_error<boost::math::policies::ignore_error>,
      boost::math::policies::evaluation_error<boost::math::policies::ignore_error>>;
};

}  // namespace sidco::models
