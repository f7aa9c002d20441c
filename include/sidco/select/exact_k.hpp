// exact_k: a statistical threshold made safe for fixed-size all-gathers. The result is
// identical to exact Top-k (same tie rule) at close to the cost of a threshold selection.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <span>

#include "sidco/backend/concept.hpp"
#include "sidco/core/error.hpp"
#include "sidco/select/candidates.hpp"
#include "sidco/select/result.hpp"

namespace sidco::select {

/// The estimator aims at delta (1 + slack); the candidates above its threshold are collected
/// in one pass (error feedback settled in it), and the top k among them kept. Too few
/// candidates: the threshold is halved (up to 8 times, then 0, then everything) and only the
/// band between the two thresholds is read again.
struct exact_k {
  static constexpr const char* name = "exact-k";
  static constexpr bool needs_threshold = true;
  static constexpr bool fuses_layers = false;
  static constexpr bool ranks_candidates = true;
  static constexpr bool widens = true;
  static constexpr int halvings = 8;

  double slack = 0.5;

  exact_k() = default;
  explicit exact_k(double estimate_slack) : slack(estimate_slack) {
    if (!(slack >= 0 && slack <= 100))
      sidco::detail::fail("exact_k: slack = ", slack, " is outside [0, 100]; exact_k keeps exactly the k largest "
                          "values, and slack is how far above delta its estimator aims, delta (1 + slack), so that "
                          "one pass finds at least k candidates");
  }

  double estimation_density(double delta) const { return std::min(1.0, delta * (1 + slack)); }

  template <backend::backend Backend, class Source, class Out>
  selection_result select(Backend& backend, const Source& source, double threshold, std::size_t k, Out& out) {
    return select_candidates_whole(backend, source, *this, threshold, k, out);
  }

  /// A threshold that is not finite (a degenerate fit) cannot be halved: take everything.
  template <class Backend, class Source>
  candidate_start start(Backend&, const Source& source, double threshold, std::size_t k) const {
    return {k == source.size || !std::isfinite(threshold) ? -1.0 : threshold, std::size_t(double(k) * (1 + slack))};
  }

  /// Bands below t, each an ascending run: at most halvings, then (0, t], then all.
  template <class Backend, class Source, class Out>
  void widen(Backend& backend, const Source& source, std::size_t k, double t, Out& out, std::size_t& count,
             selection_result& result, std::span<std::size_t> band_starts) const {
    static_assert(halvings + 2 <= bands_per_segment);
    while (count < k) {
      const double lower = t > 0 && result.rescans < halvings ? t / 2 : (t > 0 ? 0.0 : -1.0);
      const std::size_t band_start = out.size();
      band_starts[std::size_t(result.rescans)] = band_start;
      backend.select_band(source, lower, t, out);
      count += out.size() - band_start;
      t = lower;
      ++result.rescans;
    }
  }

  std::size_t keep(std::size_t k, std::size_t) const { return k; }
};

}  // namespace sidco::select
