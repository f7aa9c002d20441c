// Exponential model of magnitudes: P(a > t) = exp(-t / mean).
#pragma once

#include <cmath>

#include "sidco/core/config.hpp"
#include "sidco/core/moments.hpp"

namespace sidco::models {

struct exponential {
  static constexpr const char* name = "exponential";
  static constexpr bool needs_log = false;

  double mean = 1;

  /// Maximum-likelihood fit: the mean of the non-zero magnitudes.
  SIDCO_HOST_DEVICE static exponential fit(const moments& m) { return {m.mean()}; }

  /// t with P(a > t) = rho, for rho in (0, 1].
  SIDCO_HOST_DEVICE double upper_quantile(double rho) const { return -mean * std::log(rho); }

  SIDCO_HOST_DEVICE double ccdf(double t) const { return t <= 0 ? 1.0 : std::exp(-t / mean); }
};

}  // namespace sidco::models
