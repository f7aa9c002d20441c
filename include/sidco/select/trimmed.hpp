// DGC's selection: a threshold's candidates, trimmed to the k largest when there are too many.
#pragma once

#include <cstddef>

#include "sidco/backend/concept.hpp"
#include "sidco/select/candidates.hpp"
#include "sidco/select/result.hpp"

namespace sidco::select {

/// DGC's selection: keep |x| above the threshold; only when more than k (1 + SlackPercent/100)
/// are kept, trim to the k largest by magnitude (not by position, as the reference code does).
/// trimmed<0> trims to exactly k whenever there are more (RedSync's trimmed variant).
template <int SlackPercent = 20>
struct trimmed {
  static_assert(SlackPercent >= 0, "trimmed<SlackPercent>: the slack cannot be negative");
  static constexpr const char* name = "trimmed";
  static constexpr bool needs_threshold = true;
  static constexpr bool fuses_layers = false;
  static constexpr bool ranks_candidates = true;

  double estimation_density(double delta) const { return delta; }

  template <backend::backend Backend, class Source, class Out>
  selection_result select(Backend& backend, const Source& source, double threshold, std::size_t k, Out& out) {
    return select_candidates_whole(backend, source, *this, threshold, k, out);
  }

  template <class Backend, class Source>
  candidate_start start(Backend&, const Source&, double threshold, std::size_t k) const {
    return {threshold, k};
  }

  std::size_t keep(std::size_t k, std::size_t candidates) const {
    return double(candidates) > double(k) * (1 + SlackPercent / 100.0) ? k : candidates;
  }
};

}  // namespace sidco::select
