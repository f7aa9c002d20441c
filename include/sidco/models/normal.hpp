// Half-normal model of magnitudes: |x| for x ~ N(0, sigma^2), as Gaussian-k assumes.
#pragma once

#include <cmath>

#include <boost/math/special_functions/erf.hpp>

#include "sidco/core/config.hpp"
#include "sidco/core/moments.hpp"

namespace sidco::models {

struct normal {
  static constexpr const char* name = "normal";
  static constexpr bool needs_log = false;

  double sigma = 1;

  /// E[a^2] = sigma^2 for the half-normal: the root mean square of the magnitudes.
  SIDCO_HOST_DEVICE static normal fit(const moments& m) {
    const double n = double(m.nonzero());
    return {n > 0 ? std::sqrt(m.sum_sq / n) : 0.0};
  }

  /// P(|x| > t) = erfc(t / (sigma sqrt 2)) = rho. Host only (Boost.Math).
  double upper_quantile(double rho) const {
    return sigma * std::sqrt(2.0) * boost::math::erfc_inv(rho, quiet_policy{});
  }

  SIDCO_HOST_DEVICE double ccdf(double t) const {
    return t <= 0 ? 1.0 : std::erfc(t / (sigma * std::sqrt(2.0)));
  }

 private:
  using quiet_policy = boost::math::policies::policy<
      boost::math::policies::overflow_error<boost::math::policies::ignore_error>,
      boost::math::policies::domain_error<boost::math::policies::ignore_error>>;
};

}  // namespace sidco::models
