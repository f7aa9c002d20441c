// Exponential density truncated to [0, width], its rate set by its mean: what the values
// between two measured tail points look like to the estimator's last stage. Its rate may be
// negative (the values pile up at the upper end); at rate 0 it is uniform. An exponential
// tail through both points has the mean that log-linear interpolation of the count assumes,
// so over such values the two agree; values piled at one end move the quantile toward it.
#pragma once

#include <algorithm>
#include <cmath>
#include <utility>

namespace sidco::models {

struct truncated_exponential {
  double width = 1;
  double rate = 0;  // times width: the density is proportional to exp(-rate * t / width)

  /// The model on [0, width] whose mean is `mean`, for 0 < mean < width.
  static truncated_exponential with_mean(double mean, double width) {
    const double place = mean / width;
    // mean_share is odd about 1/2 in the rate: solve for a place <= 1/2 (rate >= 0).
    const bool upper = place > 0.5;
    const double u = upper ? 1 - place : place;
    // Safeguarded Newton on mean_share(b) = u, which falls from 1/2 at b = 0 toward 0; the
    // root lies in [0, 1/u] (mean_share(b) < 1/b). The start, 1/u - 1/(1 - u), is exact at
    // both ends (b ~ 1/u as u -> 0, b = 0 at u = 1/2): two or three steps reach 1e-10.
    double low = 0, high = 1 / u;
    double b = 1 / u - 1 / (1 - u);
    for (int i = 0; i < 50; ++i) {
      const auto [share, slope] = mean_share_and_slope(b);
      const double miss = share - u;
      if (miss > 0) low = b; else high = b;
      if (std::fabs(miss) <= 1e-10 * u || high - low <= 1e-12 * high) break;
      const double next = b - miss / slope;
      b = next > low && next < high ? next : (low + high) / 2;
    }
    return {width, upper ? -b : b};
  }

  /// The mean over [0, width].
  double mean() const {
    const double share = rate >= 0 ? mean_share_and_slope(rate).first : 1 - mean_share_and_slope(-rate).first;
    return width * share;
  }

  /// P(a > t) for t in [0, width].
  double ccdf(double t) const {
    const double s = std::clamp(t / width, 0.0, 1.0);
    if (std::fabs(rate) < 1e-12) return 1 - s;
    // (exp(-r s) - exp(-r)) / (1 - exp(-r)), with the larger exponential factored out.
    if (rate > 0) return std::expm1(-rate * (1 - s)) / std::expm1(-rate) * std::exp(-rate * s);
    return std::expm1(rate * (1 - s)) / std::expm1(rate);
  }

  /// t with P(a > t) = rho, for rho in [0, 1].
  double upper_quantile(double rho) const {
    if (std::fabs(rate) < 1e-12) return width * (1 - rho);
    // exp(-r s) = rho + (1 - rho) exp(-r), solved for s; for r < 0 with exp(-r) factored out.
    const double s = rate > 0 ? -std::log1p((1 - rho) * std::expm1(-rate)) / rate
                              : 1 + std::log1p(rho * std::expm1(rate)) / -rate;
    return width * std::clamp(s, 0.0, 1.0);
  }

 private:
  // The mean on [0, 1] at rate b >= 0, 1/b - 1/(e^b - 1), and its slope in b,
  // -1/b^2 + e^b/(e^b - 1)^2 (series near 0), from one exponential.
  static std::pair<double, double> mean_share_and_slope(double b) {
    if (b < 1e-4) return {0.5 - b / 12 + b * b * b / 720, -1.0 / 12 + b * b / 240};
    const double tail = std::exp(-b);
    const double rest = b < 0.01 ? std::expm1(-b) : tail - 1;  // -(1 - e^-b), < 0
    return {1 / b + tail / rest, -1 / (b * b) + tail / (rest * rest)};
  }
};

}  // namespace sidco::models
