// A density on [0, width] whose logarithm is quadratic, set by its mean and its mean square:
// the maximum-entropy density with those two moments there. Between two measured tail points
// the estimator knows the count, the sum and the sum of squares of the values between them;
// the mean alone (models::truncated_exponential) reads a bell-shaped bulk, whose density falls
// faster toward the upper end than an exponential with its mean, as a flatter tail than the
// one at the cut. The square adds the curvature. Zero curvature is the truncated exponential.
// Integrals are by 16-point Gauss-Legendre panels, as many as the log density's steepness
// needs (one for a gentle bulk, four at max_slope), exact to about 1e-8; a fit that needs a
// steeper slope is refused (std::nullopt), and the caller keeps the one-moment model, which
// covers any rate.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <optional>

#include <boost/math/quadrature/gauss.hpp>

#include "sidco/models/truncated_exponential.hpp"

namespace sidco::models {

struct truncated_log_quadratic {
  double width = 1;
  // The density is proportional to exp(-(slope * s + curvature * s^2)), s = t / width.
  double slope = 0;
  double curvature = 0;

  /// The largest |d log density / ds| on [0, 1] the quadrature resolves.
  static constexpr double max_slope = 60;

  /// The model on [0, width] with this mean and mean square (of t, not about the mean), or
  /// nullopt when no density in the family within max_slope has them: the moments of a
  /// spike, or moments no density on [0, width] has (mean^2 < mean_square < mean * width).
  static std::optional<truncated_log_quadratic> with_moments(double mean, double mean_square, double width) {
    if (!(width > 0)) return std::nullopt;
    return with_moments(mean, mean_square, truncated_exponential::with_mean(mean, width));
  }

  /// The same, given the one-moment model with this mean (the Newton start), for a caller
  /// that already has it.
  static std::optional<truncated_log_quadratic> with_moments(double mean, double mean_square,
                                                             const truncated_exponential& same_mean) {
    const double width = same_mean.width;
    if (!(width > 0)) return std::nullopt;
    const double u1 = mean / width, u2 = mean_square / (width * width);
    if (!(u1 > 0 && u1 < 1 && u2 > u1 * u1 && u2 < u1)) return std::nullopt;
    // From the one-moment fit (the right mean, zero curvature), Newton on both moments with
    // the covariance of (s, s^2) as the Jacobian, halving steps that do not shrink the miss.
    if (!(std::fabs(same_mean.rate) <= max_slope)) return std::nullopt;
    truncated_log_quadratic model{width, same_mean.rate, 0};
    struct fit {
      double m1, m2, m3, m4;  // the model's moments of s = t / width
      double mean_miss, square_miss;
      double size;  // the two misses relative to their targets
    };
    auto fit_of = [&](const truncated_log_quadratic& m) {
      const auto s = m.power_sums<5>(0);
      fit f{s[1] / s[0], s[2] / s[0], s[3] / s[0], s[4] / s[0], 0, 0, 0};
      f.mean_miss = f.m1 - u1;
      f.square_miss = f.m2 - u2;
      f.size = std::hypot(f.mean_miss / u1, f.square_miss / u2);
      return f;
    };
    auto now = fit_of(model);
    for (int i = 0; i < 60; ++i) {
      if (now.size <= 1e-10) return model;
      // d m_j / d slope = -(m_{j+1} - m_1 m_j), d m_j / d curvature = -(m_{j+2} - m_2 m_j).
      const double a = now.m2 - now.m1 * now.m1, b = now.m3 - now.m1 * now.m2, d = now.m4 - now.m2 * now.m2;
      const double det = a * d - b * b;
      if (!(det > 0)) return std::nullopt;
      // Solve -J step = -miss with J = -[[a, b], [b, d]]: [[a, b], [b, d]] step = miss.
      double step_slope = (d * now.mean_miss - b * now.square_miss) / det;
      double step_curvature = (a * now.square_miss - b * now.mean_miss) / det;
      bool moved = false;
      for (int halving = 0; halving < 30 && !moved; ++halving) {
        const truncated_log_quadratic next{width, model.slope + step_slope, model.curvature + step_curvature};
        if (next.steepest() <= max_slope) {
          const auto there = fit_of(next);
          if (there.size < now.size) {
            model = next;
            now = there;
            moved = true;
          }
        }
        step_slope /= 2;
        step_curvature /= 2;
      }
      if (!moved) return std::nullopt;
    }
    return now.size <= 1e-8 ? std::optional(model) : std::nullopt;
  }

  /// The mean over [0, width].
  double mean() const {
    const auto s = power_sums<2>(0);
    return width * s[1] / s[0];
  }

  /// The mean of t^2 over [0, width].
  double mean_square() const {
    const auto s = power_sums<3>(0);
    return width * width * s[2] / s[0];
  }

  /// P(a > t) for t in [0, width].
  double ccdf(double t) const {
    const double s = std::clamp(t / width, 0.0, 1.0);
    return power_sums<1>(s)[0] / power_sums<1>(0)[0];
  }

  /// t with P(a > t) = rho, for rho in [0, 1]: safeguarded Newton on the ccdf, whose slope
  /// is minus the density.
  double upper_quantile(double rho) const {
    if (!(rho > 0)) return width;
    if (!(rho < 1)) return 0;
    // Started from the truncated exponential with the same mean (exact at zero curvature).
    const auto whole = power_sums<2>(0);
    const double total = whole[0];
    double low = 0, high = 1, s = truncated_exponential::with_mean(whole[1] / total, 1.0).upper_quantile(rho);
    for (int i = 0; i < 60; ++i) {
      const double miss = power_sums<1>(s)[0] / total - rho;
      if (miss > 0) low = s; else high = s;
      if (std::fabs(miss) <= 1e-10 * rho || high - low <= 1e-14) break;
      const double next = s + miss * total / density(s);
      s = next > low && next < high ? next : (low + high) / 2;
    }
    return width * s;
  }

 private:
  static constexpr int nodes = 16;
  // A 16-point panel is exact to about 1e-8 while the log density changes by at most this
  // much across it; a span gets as many panels as its steepness needs (four at max_slope).
  static constexpr double change_per_panel = 15;

  // Boost.Math's 16-point Gauss-Legendre rule, whose nodes on [-1, 1] come in pairs +-x,
  // mapped onto [0, 1].
  struct rule {
    static_assert(nodes % 2 == 0, "the nodes pair up as +-x");
    std::array<double, nodes> at{}, weight{};
    rule() {
      using legendre = boost::math::quadrature::gauss<double, nodes>;
      for (int i = 0; i < nodes / 2; ++i) {
        const double x = legendre::abscissa()[i], half_weight = legendre::weights()[i] / 2;
        at[2 * i] = (1 - x) / 2;
        at[2 * i + 1] = (1 + x) / 2;
        weight[2 * i] = weight[2 * i + 1] = half_weight;
      }
    }
  };
  static const rule& quadrature() {
    static const rule r;
    return r;
  }

  double exponent(double s) const { return slope * s + curvature * s * s; }
  // The smallest exponent on [0, 1]: the density scaled by it stays <= 1.
  double lowest_exponent() const {
    double low = std::min(0.0, exponent(1));
    if (curvature > 0) {
      const double vertex = -slope / (2 * curvature);
      if (vertex > 0 && vertex < 1) low = std::min(low, exponent(vertex));
    }
    return low;
  }
  double density(double s) const { return std::exp(lowest_exponent() - exponent(s)); }
  double steepest() const { return std::max(std::fabs(slope), std::fabs(slope + 2 * curvature)); }

  // The integrals of s^j times the (scaled) density over [from, 1], j < Count: the fit needs
  // five, the ccdf's Newton steps one.
  template <std::size_t Count>
  std::array<double, Count> power_sums(double from) const {
    const rule& r = quadrature();
    const double low = lowest_exponent(), span = 1 - from;
    const int panels = std::max(1, int(std::ceil(steepest() * span / change_per_panel)));
    const double panel_width = span / panels;
    std::array<double, Count> sums{};
    for (int panel = 0; panel < panels; ++panel)
      for (int i = 0; i < nodes; ++i) {
        const double s = from + panel_width * (panel + r.at[i]);
        double term = panel_width * r.weight[i] * std::exp(low - exponent(s));
        for (double& sum : sums) {
          sum += term;
          term *= s;
        }
      }
    return sums;
  }
};

}  // namespace sidco::models
