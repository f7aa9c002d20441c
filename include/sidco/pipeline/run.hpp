// The one compression pipeline, over a layout of one or many segments:
//   analyze  one moments pass over every segment, with the tails each estimator probes (for
//            Top-k, its coarse histograms' pass, which counts the same);
//   check    non-finite input is refused before anything is written;
//   budget   each segment's density;
//   estimate each segment's threshold (with the estimator's own passes, or the fallback;
//            spread over threads where the backend can);
//   select   one pass over every segment when the selection fuses layers or ranks candidates
//            (then one keep_top_k over all), else per segment;
//   report   each segment's report (adaptive estimators learn from it).
// compressor runs it over one segment, segmented over many.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <type_traits>

#include "sidco/core/checks.hpp"
#include "sidco/core/error.hpp"
#include "sidco/core/moments.hpp"
#include "sidco/core/segment.hpp"
#include "sidco/core/sparse_vector.hpp"
#include "sidco/pipeline/scratch.hpp"
#include "sidco/select/candidates.hpp"

namespace sidco::pipeline {

/// How many probes a moments pass over Source measures per segment: two under error
/// feedback, one without. With feedback, what the last call left in the residual piles up
/// under its threshold, so the tail near the cut changes shape from call to call and the
/// count above the last threshold, measured on this call's values, is worth its cost (about
/// a fifth of a call without feedback, where the tail keeps its shape and the base alone
/// serves; docs/RESULTS.md).
template <class Source>
inline constexpr std::size_t probe_limit = Source::has_state ? 2 : 1;

/// The most probes any of states asks for, at most limit: the probe slots each segment gets.
template <class State>
std::size_t probes_per_segment(std::span<const State> states, std::size_t limit) {
  std::size_t per = 0;
  for (const auto& s : states) per = std::max(per, s.probe_count(limit));
  return per;
}

/// Throws sidco::nonfinite_error naming what and the first non-finite value when the moments
/// pass found any (nonfinite of them). Reads only; nothing has been written yet.
template <class Backend, class Source>
void check_finite(Backend& backend, const Source& source, std::uint64_t nonfinite, const char* what) {
  if (nonfinite == 0) return;
  const auto first = backend.first_nonfinite(source);
  throw nonfinite_error(sidco::detail::message(what, " contains ", nonfinite, " non-finite value(s); the first is ",
                                               first.value, " at index ", source.base + first.index));
}

/// Runs the pipeline for source over layout (which tiles it), state s serving segment s;
/// work.per must be probes_per_segment(states, probe_limit<Source>). budget(work) writes
/// work.densities after the moments pass (it may throw: nothing is written yet). out is
/// cleared and gets every segment's selection with global indices; work.reports gets each
/// segment's report.
template <class Statistics, class Selection, class State, class Backend, class Source, class T, class Index,
          class Memory, class Budget>
void run(Backend& backend, std::span<State> states, std::span<const segment> layout, const Source& source,
         const char* what, sparse_vector<T, Index, Memory>& out, const scratch& work, Budget&& budget) {
  const std::size_t n = layout.size();
  std::fill(work.probes.begin(), work.probes.end(), std::numeric_limits<double>::infinity());
  for (std::size_t s = 0; s < n; ++s)
    states[s].probe_thresholds(work.probes.subspan(s * work.per, states[s].probe_count(work.per)));
  // Top-k's coarse histograms count what a counts-only moments pass would: that pass is its
  // input check, and the histograms wait in the backend for the targets.
  constexpr bool histograms_first =
      !Statistics::sums && select::contract::declares_starts_from_kth_bin<Selection>();
  const bool histograms_kept = histograms_first && work.per == 0;
  if (histograms_kept)
    backend.coarse_histograms(source, layout, work.measured);
  else
    backend.template analyze<Statistics>(source, layout, std::span<const double>(work.probes), work.measured);

  std::uint64_t nonfinite = 0;
  for (std::size_t s = 0; s < n; ++s) nonfinite += work.all_of(s).nonfinite;
  check_finite(backend, source, nonfinite, what);
  budget(work);
  out.clear(source.size);

  if constexpr (Selection::fuses_layers || select::contract::declares_ranks_candidates<Selection>()) {
    const auto estimate = [&](std::size_t s, auto& on) {
      const auto part = source.slice(layout[s].offset, layout[s].size);
      work.estimates[s] = states[s].estimate(on, part, work.all_of(s), work.probes_of(s), work.densities[s]);
      work.thresholds[s] = work.estimates[s].estimate.threshold;
      work.targets[s] = target_count(work.densities[s], layout[s].size);
    };
    // A backend that can spreads the segments' estimates over its threads (segment s's
    // estimate touches only state s and slot s); an estimator that computes no threshold
    // (Top-k's) is not worth starting them for.
    using Estimator = std::remove_cvref_t<decltype(states[0].estimator())>;
    if constexpr (Estimator::provides_threshold &&
                  requires { backend.for_each_segment(backend, layout, estimate); })
      backend.for_each_segment(backend, layout, estimate);
    else
      for (std::size_t s = 0; s < n; ++s) estimate(s, backend);
    if constexpr (Selection::fuses_layers) {
      std::size_t hint = 0;
      for (std::size_t s = 0; s < n; ++s) hint += work.targets[s];
      backend.template select_above<true>(source, layout, std::span<const double>(work.thresholds), out, hint,
                                          work.kept);
      for (std::size_t s = 0; s < n; ++s)
        work.reports[s] = states[s].report(work.estimates[s], {work.kept[s], 0}, work.kept[s], work.all_of(s),
                                           work.densities[s], layout[s].size);
    } else {
      auto candidates = work.candidates();
      candidates.histograms_kept = histograms_kept;
      select::select_candidates(backend, source, layout,
                                [states](std::size_t s) -> Selection& { return states[s].selection(); }, out,
                                candidates);
      for (std::size_t s = 0; s < n; ++s)
        work.reports[s] = states[s].report(work.estimates[s], work.picked[s], candidates.selected(s),
                                           work.all_of(s), work.densities[s], layout[s].size);
    }
  } else {
    for (std::size_t s = 0; s < n; ++s) {
      const auto part = source.slice(layout[s].offset, layout[s].size);
      const auto outcome = states[s].estimate(backend, part, work.all_of(s), work.probes_of(s), work.densities[s]);
      const std::size_t before = out.size();
      const auto picked = states[s].select(backend, part, outcome.estimate.threshold,
                                           target_count(work.densities[s], layout[s].size), out);
      work.reports[s] = states[s].report(outcome, picked, out.size() - before, work.all_of(s), work.densities[s],
                                         layout[s].size);
    }
  }
}

}  // namespace sidco::pipeline
