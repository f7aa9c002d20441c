// Selections that collect candidates above a threshold and keep the top of them (exact_k,
// trimmed, top_k), over any number of segments at once: Top-k's coarse bins of every
// segment in one pass, one candidate pass over every segment, band rescans only for the
// segments that came short, one merge, one keep_top_k over every segment's run and one
// mark_sent. On a device that is one host wait for the candidates, one per rescan and one
// for Top-k's coarse bins, whatever the layer count; a compressor runs it over one segment.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <span>
#include <type_traits>

#include "sidco/backend/concept.hpp"
#include "sidco/core/moments.hpp"
#include "sidco/core/radix_select.hpp"
#include "sidco/core/segment.hpp"
#include "sidco/select/concept.hpp"
#include "sidco/select/result.hpp"

namespace sidco::select {

/// Most band rescans one segment may need (exact_k: its halvings, then 0, then everything).
inline constexpr std::size_t bands_per_segment = 10;

/// Where a segment's candidate pass starts: |x| > threshold, about hint of them.
struct candidate_start {
  double threshold = 0;
  std::size_t hint = 0;
};

// A selection that ranks candidates: start(backend, source, threshold, k) gives its
// candidate pass's start (or, when it starts_from_kth_bin, start_from_bin<T>(bin) from the
// coarse radix bin of its k-th largest, found for every segment from one coarse_histograms
// pass), keep(k, candidates) how many of the candidates it keeps, and widen(backend, source,
// k, threshold, out, count, result, band_starts), where it declares widens = true, appends
// bands (ascending runs) until count reaches k. Whether a selection does is its declared
// flag, read by contract::declares_ranks_candidates (select/concept.hpp).

/// Per segment s: thresholds[s] (the estimate in; where its candidates start out),
/// targets[s] (k in; how many it keeps out), counts[s] (its candidates), results[s], bins[s]
/// (the coarse bin of its k-th largest, for selections that start from one) and
/// bands_per_segment band starts a segment.
struct candidate_scratch {
  std::span<double> thresholds;
  std::span<std::size_t> targets;
  std::span<std::size_t> counts;
  std::span<selection_result> results;
  std::span<key_bin> bins;
  std::span<std::size_t> band_starts;
  /// The backend holds every segment's coarse histogram from this call's coarse_histograms
  /// (the pipeline's first pass, for Top-k): a kth-bin start makes no pass of its own.
  bool histograms_kept = false;

  /// How many entries segment s holds in the output.
  std::size_t selected(std::size_t s) const { return std::min(targets[s], counts[s]); }
};

namespace detail {

/// Each segment's candidate start into work.thresholds; returns the expected candidates.
template <class Backend, class Source, class SelectionOf>
std::size_t start_candidates(Backend& backend, const Source& source, std::span<const segment> layout,
                             SelectionOf& selection_of, const candidate_scratch& work) {
  using Selection = std::remove_cvref_t<decltype(selection_of(std::size_t{}))>;
  const std::size_t n = layout.size();
  std::size_t hint = 0;
  if constexpr (contract::declares_starts_from_kth_bin<Selection>()) {
    if (!work.histograms_kept) backend.coarse_histograms(source, layout, std::span<moments>{});
    backend.kth_largest_bins(std::span<const std::size_t>(work.targets.first(n)), work.bins.first(n));
    for (std::size_t s = 0; s < n; ++s) {
      const candidate_start start = selection_of(s).template start_from_bin<typename Source::value_type>(work.bins[s]);
      work.thresholds[s] = start.threshold;
      hint += start.hint;
    }
  } else {
    for (std::size_t s = 0; s < n; ++s) {
      const auto part = source.slice(layout[s].offset, layout[s].size);
      const candidate_start start = selection_of(s).start(backend, part, work.thresholds[s], work.targets[s]);
      work.thresholds[s] = start.threshold;
      hint += start.hint;
    }
  }
  return hint;
}

}  // namespace detail

/// Appends, for each segment s of layout (which tiles source in order), the selection of
/// selection_of(s) aiming at work.targets[s] entries, with global indices in index order.
template <backend::backend Backend, class Source, class Out, class SelectionOf>
void select_candidates(Backend& backend, const Source& source, std::span<const segment> layout,
                       SelectionOf&& selection_of, Out& out, const candidate_scratch& work) {
  const std::size_t n = layout.size(), begin = out.size();
  for (std::size_t s = 0; s < n; ++s) work.targets[s] = std::min(work.targets[s], layout[s].size);
  const std::size_t hint = detail::start_candidates(backend, source, layout, selection_of, work);
  backend.template select_above<false>(source, layout, std::span<const double>(work.thresholds), out, hint,
                                       work.counts);
  std::size_t bands = 0;
  for (std::size_t s = 0; s < n; ++s) {
    work.results[s] = {work.counts[s], 0};
    auto& selection = selection_of(s);
    if constexpr (contract::declares_widens<std::remove_cvref_t<decltype(selection)>>()) {
      if (work.counts[s] >= work.targets[s]) continue;
      const auto part = source.slice(layout[s].offset, layout[s].size);
      selection.widen(backend, part, work.targets[s], work.thresholds[s], out, work.counts[s], work.results[s],
                      work.band_starts.subspan(bands, bands_per_segment));
      bands += std::size_t(work.results[s].rescans);
    }
  }
  if (bands) backend.merge_runs(out, begin, std::span<const std::size_t>(work.band_starts.first(bands)));
  for (std::size_t s = 0; s < n; ++s) work.targets[s] = selection_of(s).keep(work.targets[s], work.counts[s]);
  backend.keep_top_k(out, begin, std::span<const std::size_t>(work.counts), std::span<const std::size_t>(work.targets));
  backend.mark_sent(source, out, begin);
}

/// The same over source as one segment: what a ranking selection's select() runs.
template <backend::backend Backend, class Source, class Out, class Selection>
selection_result select_candidates_whole(Backend& backend, const Source& source, Selection& selection,
                                         double threshold, std::size_t k, Out& out) {
  const segment whole{0, source.size};
  std::size_t count = 0;
  selection_result result;
  key_bin bin;
  std::array<std::size_t, bands_per_segment> band_starts{};
  select_candidates(backend, source, std::span<const segment>(&whole, 1),
                    [&selection](std::size_t) -> Selection& { return selection; }, out,
                    candidate_scratch{{&threshold, 1}, {&k, 1}, {&count, 1}, {&result, 1}, {&bin, 1}, band_starts});
  return result;
}

}  // namespace sidco::select
