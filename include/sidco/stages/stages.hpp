// Stage-count policies: how many fits a statistical estimate uses, and (adaptive) the
// closed loop that makes the achieved density converge to the one asked for.
#pragma once

#include <algorithm>
#include <cmath>
#include <concepts>
#include <cstdint>
#include <limits>

#include "sidco/core/error.hpp"
#include "sidco/core/state_io.hpp"

namespace sidco::stages {

/// What a stage-count policy has (single, fixed<M>, adaptive): to tell one given in a
/// distribution model's slot.
template <class S>
concept stage_policy = requires(S s, const S& c) {
  { c.count(0.1) } -> std::convertible_to<int>;
  { c.aim(0.1) } -> std::convertible_to<double>;
  s.observe(0.1, 0.1);
};

/// The most stages that make sense at density delta: ceil(log2(1/delta)), at least 1 and at
/// most 64 (1/delta is infinite for the smallest doubles; no int holds that).
inline int max_for(double delta) {
  const double stages = std::ceil(std::log2(1.0 / delta) - 1e-9);
  return stages >= 64 ? 64 : std::max(1, int(stages));
}

/// One fit on the whole vector, as in the single-stage SIDCo.
struct single {
  static constexpr const char* name = "single";
  int count(double) const { return 1; }
  double aim(double delta) const { return delta; }
  void observe(double, double) {}
};

/// Exactly M stages at every density below the first-stage fraction.
template <int M>
struct fixed {
  static_assert(M >= 1, "stages::fixed<M> needs at least one stage");
  static_assert(M <= 32, "stages::fixed<M>: more than 32 stages never pays for its passes");
  static constexpr const char* name = "fixed";
  int count(double) const { return M; }
  double aim(double delta) const { return delta; }
  void observe(double, double) {}
};

/// Closed-loop density. After every call, the density the estimate aims at is corrected from
/// what was achieved: ln(correction) -= gain ln(achieved / target), an integral controller
/// bounded to [1/max_correction, max_correction], so the mean achieved density converges to
/// the target within a few dozen calls and follows a drifting gradient. Every `period`
/// calls, a correction outside [low, high] (a model that misses by that much on its own)
/// adds a stage, up to max_for(delta): more stages start the last fit closer to the target.
/// One object per tensor: it keeps state.
class adaptive {
 public:
  static constexpr const char* name = "adaptive";

  struct options {
    int initial = 0;  // 0: start at about half of max_for(delta)
    int period = 5;
    double low = 0.8;
    double high = 1.25;
    double gain = 0.3;            // 0: no correction (the stage count alone adapts)
    double max_correction = 4.0;  // the aim stays within [delta / 4, 4 delta] (and <= 1)
  };

  adaptive() = default;
  explicit adaptive(options o) : options_(o) {
    if (o.initial < 0) detail::fail("adaptive stages: initial = ", o.initial, " is negative");
    if (o.period < 1) detail::fail("adaptive stages: period = ", o.period, " is below 1");
    if (!(o.low > 0 && o.low < 1 && o.high > 1))
      detail::fail("adaptive stages: band [", o.low, ", ", o.high, "] must contain 1");
    if (!(o.gain >= 0 && o.gain <= 1)) detail::fail("adaptive stages: gain = ", o.gain, " is outside [0, 1]");
    if (!(o.max_correction >= 1 && o.max_correction <= 1e6))
      detail::fail("adaptive stages: max_correction = ", o.max_correction, " is outside [1, 1e6]");
    current_ = o.initial;
  }

  int count(double delta) const {
    const int top = max_for(delta);
    const int start = current_ > 0 ? current_ : (top + 1) / 2;
    return std::clamp(start, 1, top);
  }

  /// The density to aim the estimate at: delta times the correction, at most 1.
  double aim(double delta) const { return std::min(1.0, delta * correction()); }

  /// Called after every compress with achieved/target density.
  void observe(double ratio, double delta) {
    current_ = count(delta);
    if (options_.gain > 0) {
      // One call moves the aim by a bounded step (at most gain ln 2), so that an outlying
      // call (one that kept nothing, or far too much) does not throw the loop off.
      const double bounded = std::clamp(ratio, 0.5, 2.0);
      const double limit = std::log(options_.max_correction);
      log_correction_ = std::clamp(log_correction_ - options_.gain * std::log(bounded), -limit, limit);
    }
    sum_ratio_ += ratio;
    if (++seen_ < options_.period) return;
    const double mean = sum_ratio_ / seen_;
    seen_ = 0;
    sum_ratio_ = 0;
    // Without a correction, the window's mean ratio is what the model misses by.
    const double miss = options_.gain > 0 ? 1 / correction() : mean;
    if (miss < options_.low || miss > options_.high) current_ = std::min(current_ + 1, max_for(delta));
  }

  int current() const { return current_; }
  /// The factor the aimed density is multiplied by (1: none yet).
  double correction() const { return std::exp(log_correction_); }
  const options& settings() const { return options_; }

  /// The loop's state (not its options, which the constructor sets).
  void save_state(state_writer& out) const {
    out.name(name);
    out.word(std::uint64_t(current_));
    out.word(std::uint64_t(seen_));
    out.number(sum_ratio_);
    out.number(log_correction_);
  }
  void load_state(state_reader& in) {
    in.expect(name);
    const double limit = std::log(options_.max_correction);
    const int current = int(detail::checked_state(double(in.word("adaptive stages: current")), 0, 64,
                                                  "adaptive stages: current"));
    const int seen = int(detail::checked_state(double(in.word("adaptive stages: seen")), 0, options_.period,
                                               "adaptive stages: seen"));
    const double sum_ratio = detail::checked_state(in.number("adaptive stages: sum of ratios"), 0,
                                                   std::numeric_limits<double>::max(), "adaptive stages: sum of ratios");
    const double log_correction = detail::checked_state(in.number("adaptive stages: correction"), -limit, limit,
                                                        "adaptive stages: log correction");
    current_ = current;
    seen_ = seen;
    sum_ratio_ = sum_ratio;
    log_correction_ = log_correction;
  }

 private:
  options options_{};
  int current_ = 0;
  int seen_ = 0;
  double sum_ratio_ = 0;
  double log_correction_ = 0;
};

}  // namespace sidco::stages
