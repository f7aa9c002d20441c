// Stage-count policies: how many fits (and refinement passes) a statistical estimate uses.
#pragma once

#include <algorithm>
#include <cmath>

#include "sidco/core/error.hpp"

namespace sidco::stages {

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
  void observe(double, double) {}
};

/// Exactly M stages at every density below the first-stage fraction.
template <int M>
struct fixed {
  static_assert(M >= 1, "stages::fixed<M> needs at least one stage");
  static_assert(M <= 32, "stages::fixed<M>: more than 32 stages never pays for its passes");
  static constexpr const char* name = "fixed";
  int count(double) const { return M; }
  void observe(double, double) {}
};

/// The stage count adapts over calls so that the achieved density tracks the target: every
/// `period` calls the mean of achieved/target is compared with [low, high]. Outside it, one
/// more stage (each stage is a count-corrected refinement, so more stages fit closer in
/// either direction); inside the tighter [1 - tight, 1 + tight], one fewer (cheaper).
/// The count stays within [1, max_for(delta)]. One object per tensor: it keeps state.
class adaptive {
 public:
  static constexpr const char* name = "adaptive";

  struct options {
    int initial = 0;  // 0: start at about half of max_for(delta)
    int period = 5;
    double low = 0.8;
    double high = 1.25;
    double tight = 0.05;
  };

  adaptive() = default;
  explicit adaptive(options o) : options_(o) {
    if (o.initial < 0) detail::fail("adaptive stages: initial = ", o.initial, " is negative");
    if (o.period < 1) detail::fail("adaptive stages: period = ", o.period, " is below 1");
    if (!(o.low > 0 && o.low < 1 && o.high > 1))
      detail::fail("adaptive stages: band [", o.low, ", ", o.high, "] must contain 1");
    if (!(o.tight >= 0 && 1 - o.tight > o.low && 1 + o.tight < o.high))
      detail::fail("adaptive stages: tight = ", o.tight, " must lie inside the band");
    current_ = o.initial;
  }

  int count(double delta) const {
    const int top = max_for(delta);
    const int start = current_ > 0 ? current_ : (top + 1) / 2;
    return std::clamp(start, 1, top);
  }

  /// Called after every compress with achieved/target density.
  void observe(double ratio, double delta) {
    current_ = count(delta);
    sum_ratio_ += ratio;
    if (++seen_ < options_.period) return;
    const double mean = sum_ratio_ / seen_;
    seen_ = 0;
    sum_ratio_ = 0;
    if (mean < options_.low || mean > options_.high)
      current_ = std::min(current_ + 1, max_for(delta));
    else if (std::fabs(mean - 1) <= options_.tight)
      current_ = std::max(current_ - 1, 1);
  }

  int current() const { return current_; }

 private:
  options options_{};
  int current_ = 0;
  int seen_ = 0;
  double sum_ratio_ = 0;
};

}  // namespace sidco::stages
