// exact_k: a statistical threshold made safe for fixed-size all-gathers. The result is
// identical to exact Top-k (same tie rule) at close to the cost of a threshold selection.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <span>

#include "sidco/backend/concept.hpp"
#include "sidco/core/error.hpp"
#include "sidco/select/result.hpp"
#include "sidco/select/single_threshold.hpp"

namespace sidco::select {

/// The estimator aims at delta (1 + slack); the candidates above its threshold are collected
/// in one pass (error feedback settled in it), and the top k among them kept. Too few
/// candidates: the threshold is halved (up to 8 times, then 0, then everything) and only the
/// band between the two thresholds is read again.
struct exact_k {
  static constexpr const char* name = "exact_k";
  static constexpr bool needs_threshold = true;
  static constexpr bool fuses_layers = false;
  static constexpr int halvings = 8;

  double slack = 0.5;

  exact_k() = default;
  explicit exact_k(double estimate_slack) : slack(estimate_slack) {
    if (!(slack >= 0 && slack <= 100))
      sidco::detail::fail("exact_k: slack = ", slack, " is outside [0, 100]");
  }

  double estimation_density(double delta) const { return std::min(1.0, delta * (1 + slack)); }

  template <backend::backend Backend, class Source, class Out>
  selection_result select(Backend& backend, const Source& source, double threshold, std::size_t k, Out& out) {
    const std::size_t begin = out.size();
    k = std::min(k, source.size);
    // A threshold that is not finite (a degenerate fit) cannot be halved: take everything.
    double t = k == source.size || !std::isfinite(threshold) ? -1.0 : threshold;
    selection_result result{detail::select_above<false>(backend, source, t, out,
                                                        std::size_t(double(k) * (1 + slack))),
                            0};
    // Each band is a run ascending by index: at most halvings, then (0, t], then all.
    std::array<std::size_t, halvings + 2> band_starts{};
    while (out.size() - begin < k) {
      const double lower = t > 0 && result.rescans < halvings ? t / 2 : (t > 0 ? 0.0 : -1.0);
      band_starts[std::size_t(result.rescans)] = out.size();
      backend.select_band(source, lower, t, out);
      t = lower;
      ++result.rescans;
    }
    if (result.rescans)
      backend.merge_runs(out, begin, std::span<const std::size_t>(band_starts.data(), std::size_t(result.rescans)));
    backend.keep_top_k(out, begin, k);
    backend.mark_sent(source, out, begin);
    return result;
  }
};

/// DGC's selection: keep |x| above the threshold; only when more than k (1 + SlackPercent/100)
/// are kept, trim to the k largest by magnitude (not by position, as the reference code does).
/// trimmed<0> trims to exactly k whenever there are more (RedSync's trimmed variant).
template <int SlackPercent = 20>
struct trimmed {
  static_assert(SlackPercent >= 0, "trimmed<SlackPercent>: the slack cannot be negative");
  static constexpr const char* name = "trimmed";
  static constexpr bool needs_threshold = true;
  static constexpr bool fuses_layers = false;

  double estimation_density(double delta) const { return delta; }

  template <backend::backend Backend, class Source, class Out>
  selection_result select(Backend& backend, const Source& source, double threshold, std::size_t k, Out& out) {
    const std::size_t begin = out.size();
    const std::size_t candidates = detail::select_above<false>(backend, source, threshold, out, k);
    if (double(candidates) > double(k) * (1 + SlackPercent / 100.0)) backend.keep_top_k(out, begin, k);
    backend.mark_sent(source, out, begin);
    return {candidates, 0};
  }
};

}  // namespace sidco::select
