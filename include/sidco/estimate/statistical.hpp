// SIDCo's statistical threshold estimator: a distribution model fitted in one or more stages.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <type_traits>

#include "sidco/backend/pass_statistics.hpp"
#include "sidco/core/checks.hpp"
#include "sidco/core/error.hpp"
#include "sidco/core/moments.hpp"
#include "sidco/core/state_io.hpp"
#include "sidco/models/concept.hpp"
#include "sidco/models/normal.hpp"
#include "sidco/models/truncated_exponential.hpp"
#include "sidco/models/truncated_log_quadratic.hpp"
#include "sidco/estimate/result.hpp"
#include "sidco/stages/stages.hpp"

namespace sidco::fit {

/// Default. Exact zeros are counted and left out of the fit, and the target is rescaled to a
/// fraction of the non-zeros. Stage m aims at its geometric share of the remaining ratio as
/// measured by the previous pass (not a fixed fraction), so stage errors do not compound; a
/// stage that overshoots is bracketed and the next threshold interpolates between the two
/// measured points of the tail. From the second call on a tensor, the moments pass also
/// measures the tail above where the last stage started the call before (the base) and above
/// the last call's threshold, so the last stage fits from that one pass and no refinement
/// pass is needed.
struct zero_aware {
  static constexpr const char* name = "zero-aware";
};

/// The original SIDCo fit, kept for comparison: zeros are part of the sample, stage 1 keeps
/// the first-stage fraction d1 and every later stage (delta/d1)^(1/(M-1)) of its input,
/// whatever the passes measured. Every stage after the first makes a pass of its own.
struct paper {
  static constexpr const char* name = "paper";
};

}  // namespace sidco::fit

namespace sidco::estimate {

/// First fits the magnitudes in stage 1; Tail fits the excesses over the previous threshold
/// in later stages (peaks over threshold). Stages picks the stage count (and, adaptive, the
/// closed loop on the density); Fit is fit::zero_aware or fit::paper.
///
/// A Pass gives `pass.template tail<Log>(t)`: the moments of |x| - t over |x| > t, from a
/// pass of its own. Probes are tails the moments pass measured at probe_thresholds().
template <class First, class Tail = First, class Stages = stages::adaptive,
          class Fit = fit::zero_aware>
class statistical {
  static_assert(std::is_same_v<Fit, fit::zero_aware> || std::is_same_v<Fit, fit::paper>,
                "statistical<..., Fit>: Fit must be fit::zero_aware or fit::paper");
  static_assert(!stages::stage_policy<First> && !stages::stage_policy<Tail>,
                "estimate::statistical<First, Tail, Stages, Fit>: a stages policy was given as a distribution "
                "model; First and Tail are models (models::exponential, gamma, generalized_pareto), the stages "
                "come third: statistical<models::exponential, models::exponential, stages::fixed<3>>");
  static constexpr bool stages_as_model = stages::stage_policy<First> || stages::stage_policy<Tail>;
  static_assert([] {  // the models' own checks only when the sentence above did not fire
    if constexpr (stages_as_model)
      return true;
    else
      return models::diagnose<First>() && models::diagnose<Tail>();
  }());
  // Whether the models keep their contract: when not, estimate() compiles to nothing, so that
  // the sentence above is the whole error, not the first of the calls into a broken model.
  static constexpr bool models_usable = [] {
    if constexpr (stages_as_model)
      return false;
    else
      return models::distribution_model<First> && models::distribution_model<Tail>;
  }();
  template <class M>
  static constexpr bool needs_log_of() {
    if constexpr (models::contract::named<M>)
      return M::needs_log;
    else
      return false;
  }

 public:
  using first_model = First;
  using tail_model = Tail;
  using stage_policy = Stages;
  static constexpr const char* name = "statistical";
  static constexpr bool provides_threshold = true;
  /// Hooks (estimate/concept.hpp): adaptive stages learn from each call's density; the
  /// moments pass measures the tail where the last stage started.
  static constexpr bool observes = true;
  static constexpr bool probes = true;
  /// The moments pass gathers ln|x| only when stage 1 needs it, ln of the probes' excesses
  /// only when the tail model does.
  using statistics = backend::pass_statistics<true, needs_log_of<First>(), needs_log_of<Tail>()>;

  struct options {
    double first_fraction = 0.25;  // d1: what stage 1 keeps when there are several stages
  };

  statistical() = default;
  explicit statistical(Stages stage_policy, options o = {}) : stages_(stage_policy), options_(o) {
    if (!(o.first_fraction > 0 && o.first_fraction < 1))
      detail::fail("statistical estimator: first_fraction = ", o.first_fraction,
                   " is outside (0, 1)");
  }

  /// How many tails the next moments pass should measure, and where: the base, then the last
  /// threshold. The pipeline asks for the second only under error feedback (see
  /// pipeline::probe_limit).
  std::size_t probe_count() const { return base_ > 0 ? (last_threshold_ > 0 ? 2 : 1) : 0; }
  void probe_thresholds(std::span<double> out) const {
    if (!out.empty()) out[0] = base_;
    if (out.size() > 1) out[1] = last_threshold_;
  }

  template <class Pass>
  threshold_estimate estimate(const moments& all, std::span<const moments> probes, double delta,
                              Pass& pass) {
    if constexpr (!models_usable)
      return {};
    else if constexpr (std::is_same_v<Fit, fit::paper>)
      return estimate_paper(all.with_zeros_as_sample(), delta, pass);
    else
      return estimate_zero_aware(all, probes, delta, pass);
  }

  /// Feeds the achieved density of the last call back to the stage policy. A base placed as
  /// a bracket stays only while the threshold it leads to lands within a factor of
  /// max_bracket_miss of delta: beyond, the bracket no longer describes the tail, and the
  /// next call measures it afresh.
  void observe(double achieved_density, double delta) {
    const double ratio = achieved_density / delta;
    stages_.observe(ratio, delta);
    if (base_brackets() && !(ratio >= 1 / max_bracket_miss && ratio <= max_bracket_miss)) base_ = -1;
  }

  const Stages& stage_policy_state() const { return stages_; }
  const options& settings() const { return options_; }
  /// Where the next moments pass measures the tail (negative: nowhere).
  double base() const { return base_; }

  /// The stage policy's state, where the next call probes, and the last threshold.
  void save_state(state_writer& out) const {
    out.name(First::name);
    out.name(Tail::name);
    out.name(Stages::name);
    out.name(Fit::name);
    if constexpr (stateful<Stages>) stages_.save_state(out);
    out.number(base_);
    out.number(last_threshold_);
    out.name(mean_field);
    out.number(last_mean_);
  }
  void load_state(state_reader& in) {
    in.expect(First::name);
    in.expect(Tail::name);
    in.expect(Stages::name);
    in.expect(Fit::name);
    Stages stages = stages_;
    if constexpr (stateful<Stages>) stages.load_state(in);
    // Each is -1 (none yet) or a finite threshold or mean >= 0.
    const double base = detail::unset_or_finite_state(in.number("statistical: base"), "statistical: base", "threshold");
    const double last = detail::unset_or_finite_state(in.number("statistical: last threshold"),
                                                      "statistical: last threshold", "threshold");
    // States saved before the field have no mean: the next call follows no drift.
    double mean = -1;
    if (in.next_name_is(mean_field)) {
      in.expect(mean_field);
      mean = detail::unset_or_finite_state(in.number("statistical: last mean"), "statistical: last mean", "mean");
    }
    stages_ = stages;
    base_ = base;
    last_threshold_ = last;
    last_mean_ = mean;
  }

 private:
  static constexpr const char* mean_field = "last-mean";

  // A measured point of the tail: n values of |x| lie above t; excess holds their moments.
  struct tail_point {
    double t;
    double n;
    moments excess;
  };

  // What a call measured and aimed at, from which finish places the next call's base.
  struct call_points {
    const tail_point& candidate;  // below the cut, nearest `wanted` (t <= 0: none measured)
    double bracket;               // the measured upper end close to k (0: none)
    double k;                     // the count the call keeps
    double wanted;                // where an M-stage schedule starts its last stage
  };

  // Log-linear interpolation of the count between two tail points (an exponential tail
  // through both), solved for n = k.
  static double interpolate(const tail_point& lo, const tail_point& hi, double k) {
    if (!(lo.n > hi.n) || hi.n <= 0) return hi.t;
    return lo.t + (hi.t - lo.t) * std::log(lo.n / k) / std::log(lo.n / hi.n);
  }

  // The same between two measured points with their moments, which give the count and the
  // mean of the values between them: those values as an exponential density truncated to
  // the bracket with that mean (models::truncated_exponential). Over an exponential tail
  // it is the log-linear interpolation; where the values pile up at one end of the bracket
  // (a tail steeper or flatter than exponential across it, or a cliff of near-equal values)
  // the cut moves toward that end, where the log-linear line would miss by a large factor.
  // With enough values between them their mean square adds the curvature of the log density
  // (models::truncated_log_quadratic): a bell-shaped bulk falls faster toward the cut than an
  // exponential with its mean, which would place the cut too high. A bell well within the
  // bracket, which that fit refuses as too steep or which has fewer values, is the normal's.
  static double interpolate_measured(const tail_point& lo, const tail_point& hi, double k) {
    const double loglinear = interpolate(lo, hi, k);
    const double inside = lo.n - hi.n;
    const double width = hi.t - lo.t;
    if (!(inside >= 2 && width > 0 && k > hi.n && k < lo.n)) return loglinear;
    // The inside's sum of |x|: each tail's excess sum plus its count times its threshold.
    const double inside_sum = (lo.excess.sum + lo.n * lo.t) - (hi.excess.sum + hi.n * hi.t);
    const double mean = inside_sum / inside - lo.t;
    if (!(mean > 0 && mean < width)) return loglinear;
    const double share = (k - hi.n) / inside;
    // The inside's mean of (|x| - lo.t)^2: the upper tail's values are its excesses plus width.
    const double mean_square =
        (lo.excess.sum_sq - (hi.excess.sum_sq + 2 * width * hi.excess.sum + hi.n * width * width)) / inside;
    double t = 0;
    if (inside >= two_moment_inside) {
      if (const auto model = models::truncated_log_quadratic::with_moments(mean, mean_square, width))
        t = lo.t + model->upper_quantile(share);
    }
    if (!(t > lo.t)) t = lo.t + bell_quantile(mean, mean_square - mean * mean, width, share);
    if (!(t > lo.t)) t = lo.t + models::truncated_exponential::with_mean(mean, width).upper_quantile(share);
    return t > lo.t && t < hi.t ? t : loglinear;
  }

  // Where the inside is a bell well within the bracket (its mean at least bell_margin
  // deviations from both ends: a spike of near-equal values, or a bulk the bracket's ends do
  // not cut), the cut above which the normal with its mean and variance keeps `share`: the
  // truncated log-quadratic's limit as its slope steepens past what its quadrature resolves.
  // NaN otherwise, or where that cut leaves the bracket.
  static double bell_quantile(double mean, double variance, double width, double share) {
    if (!(variance > 0)) return std::nan("");
    const double deviation = std::sqrt(variance);
    if (!(mean > bell_margin * deviation && mean + bell_margin * deviation < width)) return std::nan("");
    // P(X > mean + d) = share is P(|X - mean| > d) = 2 share: the half-normal's quantile.
    const double cut = mean + models::normal{deviation}.upper_quantile(2 * share);
    return cut > 0 && cut < width ? cut : std::nan("");
  }

  // The stage a measured point of n >= k values starts: as many stages follow as its distance
  // from k needs at the schedule's last-stage ratio (one, within 2x of where the last stage
  // starts). A ratio of 1 (the last stage starts at k: the corrected aim reached stage 1's
  // fraction) needs endless stages, so stage 1; counted in double, as int(inf) is undefined.
  // So is int(-7e15): the ratio rounded to just below 1 (wanted a rounding under k) gives a
  // huge negative count, the same endless case.
  static int stage_from(double n, double k, double wanted, int stage_count) {
    const double remaining = n <= 2 * wanted ? 1.0 : std::ceil(std::log(n / k) / std::log(wanted / k) - 1e-9);
    if (!(remaining > 0 && remaining < double(stage_count))) return 1;
    return std::max(1, stage_count - int(remaining));
  }

  // The last stage's extrapolation ratio in an M-stage schedule: stage 1 keeps `first`
  // values, the others share the rest geometrically.
  double base_ratio(double first, double k, int stage_count) const {
    return std::pow(first / k, 1.0 / double(stage_count - 1));
  }

  template <class Pass>
  threshold_estimate estimate_zero_aware(const moments& all, std::span<const moments> probes,
                                         double delta, Pass& pass) {
    const double aim = stages_.aim(delta);
    const double nonzero = double(all.nonzero());
    const double k = double(target_count(aim, std::size_t(all.count)));
    // Nothing to fit: keep every non-zero (all of them are within budget, or they are all
    // equal and no threshold can split them).
    if (nonzero <= k || all.max == all.min) {
      base_ = -1;
      return {0.0, 0};
    }

    const int stage_count = stages_.count(delta);
    const double target = k / nonzero;
    // One fit, no pass, when delta itself is past stage 1's fraction. Decided on delta, not on
    // the corrected aim: a correction that raises the aim past it must not drop the measured
    // stages it was correcting for (a model that misses would then miss unmeasured).
    const double asked = double(target_count(delta, std::size_t(all.count))) / nonzero;
    const bool one_step = stage_count == 1 || asked >= options_.first_fraction;
    // Stage 1 keeps first_fraction of the non-zeros, or the target when the aim is past it.
    const double first_kept = std::max(options_.first_fraction, target);
    // Where an M-stage schedule starts its last stage: the count the base aims at.
    const double wanted = one_step ? k : base_ratio(first_kept * nonzero, k, stage_count) * k;
    tail_point lo{0.0, nonzero, all};
    // Upper end of the bracket: at least one value reaches the maximum. Becomes a measured
    // point once a pass finds fewer than k values above a threshold.
    tail_point hi{all.max, 1, {}};
    bool hi_measured = false;
    int stage = 0;
    tail_point candidate = lo;  // measured points nearest `wanted`: the next call's base

    if (!one_step && !probes.empty() && base_ > 0 && base_ < all.max) {
      const moments& measured = probes[0];
      const double n = double(measured.count);
      if (n >= k) {
        // The probe is a measured stage.
        lo = {base_, n, measured};
        candidate = lo;
        stage = stage_from(n, k, wanted, stage_count);
      } else {
        // The base keeps too few: it brackets the tail from above. Placed as that bracket
        // (see finish) and still close to k, its interpolation is the last stage; otherwise
        // the tail moved: refit from stage 1.
        hi = {base_, n, measured};
        hi_measured = true;
        if (base_brackets() && n >= k / close_bracket) stage = stage_count - 1;
      }
    }

    // The last call's threshold, measured on this gradient: most calls it lies close to k, on
    // either side. Below the cut it is the last stage's start, and with the base below it a
    // second point for the last stage's slope; above, an upper bracket.
    // (Measured only when asked for: probes holds more slots when other segments asked more.)
    tail_point below_last{-1, 0, {}};
    if (!one_step && std::min(probes.size(), probe_count()) > 1 && last_threshold_ < all.max) {
      const moments& measured = probes[1];
      const double n = double(measured.count);
      if (n >= k) {
        if (last_threshold_ > lo.t) {
          if (lo.t > 0) below_last = lo;
          lo = {last_threshold_, n, measured};
          if (candidate.t <= 0) candidate = lo;
          stage = std::max(stage, stage_from(n, k, wanted, stage_count));
        }
      } else if (last_threshold_ < hi.t) {
        hi = {last_threshold_, n, measured};
        hi_measured = true;
        if (lo.t > 0 && n >= k / close_bracket) stage = std::max(stage, stage_count - 1);
      }
    }

    // Up to the upper end: through the values between both ends once it is measured.
    const auto to_upper_end = [&](double count) {
      return hi_measured ? interpolate_measured(lo, hi, count) : interpolate(lo, hi, count);
    };
    for (int extra = 0;;) {
      const double bracket = hi_measured && hi.n >= k / close_bracket ? hi.t : 0.0;
      const bool last = stage >= stage_count - 1 || one_step;
      // The count this stage aims at: k at the last, otherwise the schedule's step from lo
      // (so that a stage before the last measures a point below the cut, the next call's base).
      const double stage_count_aim = last ? k : lo.n * std::pow(k / lo.n, 1.0 / double(stage_count - stage));
      if (lo.n == k) return finish(all, {candidate, bracket, k, wanted}, lo.t, stage_count, values_drift<Pass>());
      double t;
      bool fitted = true;
      if (bracket > 0) {
        t = to_upper_end(stage_count_aim);
      } else {
        if (stage == 0) {
          t = First::fit(all).upper_quantile(one_step ? target : first_kept);
        } else {
          const double rho = std::pow(k / lo.n, 1.0 / double(std::max(1, stage_count - stage)));
          t = lo.t + fit_tail(lo.excess, rho);
          // Two measured points below the cut: the line through them (log count against
          // threshold) caps the fit. Where the tail is heavier than the model near the cut (its
          // mean excess drawn out by the few largest values), the fit alone steps too far up
          // and keeps too few.
          if (below_last.t > 0 && below_last.n > lo.n && stage >= stage_count - 1) {
            const double secant = interpolate(below_last, lo, k);
            if (secant > lo.t && !(t <= secant)) t = secant;
          }
        }
        // A fit that is not finite, or lands outside the bracket, is replaced by the
        // interpolation, which cannot leave it.
        if (!(t > lo.t && t < hi.t)) {
          t = to_upper_end(k);
          fitted = false;
        }
        t = std::min(t, std::nextafter(hi.t, 0.0));
      }
      if (last && (fitted || hi_measured || extra == max_extra_passes))
        return finish(all, {candidate, bracket, k, wanted}, t, stage_count, values_drift<Pass>());
      if (last) {
        // The model does not reach k inside the data and nothing above was measured:
        // measure halfway to the maximum, which brackets the tail or raises the lower end.
        ++extra;
        t = lo.t + (hi.t - lo.t) / 2;
      }

      const moments excess = pass.template tail<Tail::needs_log>(t);
      const double n = double(excess.count);
      if (n >= k) {
        lo = {t, n, excess};
        if (std::fabs(std::log(n / wanted)) < std::fabs(std::log(candidate.n / wanted))) candidate = lo;
      } else {
        hi = {t, n, excess};
        hi_measured = true;
      }
      stage = std::min(stage + 1, stage_count - 1);
    }
  }

  // Whether a Pass's values move between calls by themselves: under error feedback (the
  // pipeline's passes say whether they are); a Pass that does not say is taken to.
  template <class Pass>
  static constexpr bool values_drift() {
    if constexpr (requires { Pass::feedback; })
      return Pass::feedback;
    else
      return true;
  }

  static double bounded_drift(double ratio) { return std::clamp(ratio, 1 / max_drift, max_drift); }

  // A last stage whose model leaves the data measures at most this many more points.
  static constexpr int max_extra_passes = 2;
  // From this many values between the two ends, their mean square shapes the last stage's
  // interpolation too. Its fit (about 2 us, bench/interpolation_bench.cpp) costs about one
  // compress of 8,192 values, paid only by calls that interpolate to a measured upper point.
  static constexpr double two_moment_inside = 8192;
  // A bell this many deviations from both ends of its bracket is the normal's.
  static constexpr double bell_margin = 4;
  // A measured upper bracket within this factor of k is close enough to interpolate to
  // (an exponential tail through both ends); farther, the model's fit is better.
  static constexpr double close_bracket = 4;
  // The base follows the threshold's drift from call to call by at most this factor.
  static constexpr double max_drift = 1.25;
  // A bracket base moved up from a misread fit lies this factor past max_drift times t.
  static constexpr double past_drift = 1.1;
  // A bracket base whose threshold misses delta by more than this factor is dropped.
  static constexpr double max_bracket_miss = 2;

  // A base placed as an upper bracket lies more than max_drift above the last threshold; one
  // placed at a measured point below the cut lies at most max_drift above it (the drift),
  // unless its tail's fit moved it past the cut: a misreading that observe's check bounds.
  bool base_brackets() const { return last_threshold_ > 0 && base_ > max_drift * last_threshold_; }

  // The estimate, after choosing where the next call's moments pass measures the tail:
  // near `wanted` (where an M-stage schedule starts its last stage). The candidate is the
  // probe when it served, else the measured point nearest `wanted`; it is kept within a
  // factor of two of that count, else moved there for the next call (up along its tail's
  // fit, or down by interpolating between the non-zeros and it). Thresholds that drift (a
  // residual growing under error feedback scales every value call after call) move the
  // base along by the last step's drift, bounded.
  //
  // When no pass measured a point at or below the cut (every fit and interpolation landed
  // above k: a tail the model misreads, which only measured brackets from above settle),
  // the measured upper end close to k (bracket) becomes the base, provided it lies more
  // than max_drift above t: the next call then interpolates to it without a pass, as this
  // call's last stage did. So does it where the values do not move by themselves and the
  // candidate's tail, fitted up to k, lands at or above that bracket (or cannot be fitted):
  // a fit this call's own measurement contradicts (a spike under a few far values, whose mean
  // excess carries the fit past the spike), from which every next call would keep too few,
  // more than the loop's bounded correction makes up (under feedback the last threshold is
  // probed too). Such a bracket within max_drift of t moves just past that, still above the cut.
  threshold_estimate finish(const moments& all, const call_points& call, double t, int stages, bool drifting) {
    const auto& [candidate, bracket, k, wanted] = call;
    const bool misread = !drifting && candidate.t > 0 && bracket > 0 &&
                         !(candidate.t + fit_tail(candidate.excess, k / candidate.n) < bracket);
    const bool bracket_base = bracket > 0 && (candidate.t <= 0 || misread);
    // The drift to follow: where the values move by themselves (error feedback), and for an
    // upper bracket (which stays one by it: base_brackets), the threshold's change. Otherwise
    // that change is mostly the loop's own correction, which carried into the next call's base
    // sustains two-call cycles (docs/RESULTS.md), so the values' own change: their mean.
    const double mean = all.mean();
    const double drift = drifting || bracket_base
                             ? (last_threshold_ > 0 && t > 0 ? bounded_drift(t / last_threshold_) : 1.0)
                             : (last_mean_ > 0 && mean > 0 ? bounded_drift(mean / last_mean_) : 1.0);
    last_mean_ = mean;
    base_ = -1;
    if (bracket_base) {
      if (bracket * drift > max_drift * t)
        base_ = bracket * drift;
      else if (misread)
        base_ = std::min(past_drift * max_drift * t, std::nextafter(all.max, 0.0));
    } else if (candidate.t > 0) {
      base_ = candidate.t;
      if (!(candidate.n >= wanted / 2 && candidate.n <= 2 * wanted)) {
        double next;
        if (wanted < candidate.n) {
          next = candidate.t + fit_tail(candidate.excess, wanted / candidate.n);
        } else {
          const tail_point zero{0.0, double(all.nonzero()), all};
          next = interpolate(zero, candidate, wanted);
        }
        // A move the fit cannot make (its threshold leaves the data) is left to the
        // next call's passes.
        if (std::isfinite(next) && next > 0 && next < all.max) base_ = next;
      }
      base_ *= drift;
    }
    last_threshold_ = t;
    return {t, stages};
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
      const moments excess = pass.template tail<Tail::needs_log>(t);
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
  double base_ = -1;            // where the next moments pass measures the tail
  double last_threshold_ = -1;  // this call's threshold, for the next call's drift
  double last_mean_ = -1;       // this call's mean |x| over the non-zeros (-1: none yet)
};

}  // namespace sidco::estimate
