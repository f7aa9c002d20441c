// SIDCo's statistical threshold estimator: a distribution model fitted in one or more stages.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "sidco/core/error.hpp"
#include "sidco/core/moments.hpp"
#include "sidco/estimate/result.hpp"
#include "sidco/stages/stages.hpp"

namespace sidco::fit {

/// Default. Exact zeros are counted and left out of the fit, and the target is rescaled to a
/// fraction of the non-zeros. Stage m aims at its geometric share of the remaining ratio as
/// measured by the previous pass (not a fixed fraction), so stage errors do not compound; a
/// stage that overshoots is bracketed and the next threshold interpolates between the two
/// measured points of the tail.
struct zero_aware {
  static constexpr const char* name = "zero-aware";
};

/// The original SIDCo fit, kept for comparison: zeros are part of the sample, stage 1 keeps
/// the first-stage fraction d1 and every later stage (delta/d1)^(1/(M-1)) of its input,
/// whatever the passes measured.
struct paper {
  static constexpr const char* name = "paper";
};

}  // namespace sidco::fit

namespace sidco::estimate {

/// First fits the magnitudes in stage 1; Tail fits the excesses over the previous threshold
/// in later stages (peaks over threshold). Stages picks the stage count; Fit is
/// fit::zero_aware or fit::paper.
///
/// A Pass gives `pass.template excess<Log>(t)`: the moments of |x| - t over |x| > t.
template <class First, class Tail = First, class Stages = stages::adaptive,
          class Fit = fit::zero_aware>
class statistical {
  static_assert(std::is_same_v<Fit, fit::zero_aware> || std::is_same_v<Fit, fit::paper>,
                "statistical<..., Fit>: Fit must be fit::zero_aware or fit::paper");

 public:
  using first_model = First;
  using tail_model = Tail;
  using stage_policy = Stages;
  static constexpr bool provides_threshold = true;

  struct options {
    double first_fraction = 0.25;  // d1: what stage 1 keeps when there are several stages
  };

  /// The moments pass over the whole vector gathers ln|x| only when stage 1 needs it.
  static constexpr bool needs_log = First::needs_log;

  statistical() = default;
  explicit statistical(Stages stage_policy, options o = {}) : stages_(stage_policy), options_(o) {
    if (!(o.first_fraction > 0 && o.first_fraction < 1))
      detail::fail("statistical estimator: first_fraction = ", o.first_fraction,
                   " is outside (0, 1)");
  }

  template <class Pass>
  threshold_estimate estimate(const moments& all, double delta, Pass& pass) {
    if constexpr (std::is_same_v<Fit, fit::paper>)
      return estimate_paper(all.with_zeros_as_sample(), delta, pass);
    else
      return estimate_zero_aware(all, delta, pass);
  }

  /// Feeds the achieved density of the last call back to an adaptive stage policy.
  void observe(double achieved_density, double delta) {
    stages_.observe(achieved_density / delta, delta);
  }

  const Stages& stage_policy_state() const { return stages_; }
  const options& settings() const { return options_; }

 private:
  // A measured point of the tail: n values of |x| lie above t; excess holds their moments.
  struct tail_point {
    double t;
    double n;
    moments excess;
  };

  // Log-linear interpolation of the count between two tail points (an exponential tail
  // through both), solved for n = k.
  static double interpolate(const tail_point& lo, double hi_t, double hi_n, double k) {
    if (!(lo.n > hi_n) || hi_n <= 0) return hi_t;
    return lo.t + (hi_t - lo.t) * std::log(lo.n / k) / std::log(lo.n / hi_n);
  }

  template <class Pass>
  threshold_estimate estimate_zero_aware(const moments& all, double delta, Pass& pass) {
    const double nonzero = double(all.nonzero());
    const double k = std::max(1.0, delta * double(all.count));
    // Nothing to fit: keep every non-zero (all of them are within budget, or they are all
    // equal and no threshold can split them).
    if (nonzero <= k || all.max == all.min) return {0.0, 0};

    const int stage_count = stages_.count(delta);
    const double target = k / nonzero;
    tail_point lo{0.0, nonzero, all};
    // Upper end of the bracket: at least one value reaches the maximum. Becomes a measured
    // point once a pass finds fewer than k values above a threshold.
    double hi_t = all.max, hi_n = 1;
    bool hi_measured = false;

    for (int stage = 0; stage < stage_count; ++stage) {
      double t;
      if (hi_measured) {
        t = interpolate(lo, hi_t, hi_n, k);
      } else {
        if (stage == 0) {
          const bool one_step = stage_count == 1 || target >= options_.first_fraction;
          t = First::fit(all).upper_quantile(one_step ? target : options_.first_fraction);
        } else {
          const double rho = std::pow(k / lo.n, 1.0 / double(stage_count - stage));
          t = lo.t + fit_tail(lo.excess, rho);
        }
        // A fit that is not finite, or lands outside the bracket, is replaced by the
        // interpolation, which cannot leave it.
        if (!(t > lo.t && t < hi_t)) t = interpolate(lo, hi_t, hi_n, k);
        t = std::min(t, std::nextafter(hi_t, 0.0));
      }
      if (stage == stage_count - 1) return {t, stage_count};

      const moments excess = pass.template excess<Tail::needs_log>(t);
      const double n = double(excess.count);
      if (n >= k) {
        lo = {t, n, excess};
        if (n == k) return {t, stage + 1};
      } else {
        hi_t = t;
        hi_n = n;
        hi_measured = true;
      }
    }
    return {lo.t, stage_count};  // not reached: the last stage returns above
  }

  template <class Pass>
  threshold_estimate estimate_paper(const moments& sample, double delta, Pass& pass) {
    if (sample.nonzero() == 0) return {0.0, 0};
    const int stage_count = stages_.count(delta);
    if (stage_count == 1 || delta >= options_.first_fraction)
      return {First::fit(sample).upper_quantile(delta), 1};
    const double rho = std::pow(delta / options_.first_fraction, 1.0 / double(stage_count - 1));
    double t = First::fit(sample).upper_quantile(options_.first_fraction);
    for (int stage = 1; stage < stage_count; ++stage) {
      const moments excess = pass.template excess<Tail::needs_log>(t);
      if (excess.count == 0) return {t, stage};
      t += fit_tail(excess, rho);
    }
    return {t, stage_count};
  }

  static double fit_tail(const moments& excess, double rho) {
    if (excess.nonzero() < 2 || excess.variance() <= 0) return std::nan("");
    return Tail::fit(excess).upper_quantile(rho);
  }

  Stages stages_{};
  options options_{};
};

}  // namespace sidco::estimate
