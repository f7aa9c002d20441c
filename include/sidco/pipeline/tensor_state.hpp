// One method's per-tensor state, its estimator and selection, and the phases the pipeline
// runs with it: where to probe, the threshold (with the radix fallback), the selection and
// the report. A compressor holds one; segmented holds one per segment.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <utility>

#include "sidco/core/checks.hpp"
#include "sidco/core/moments.hpp"
#include "sidco/core/state_io.hpp"
#include "sidco/estimate/concept.hpp"
#include "sidco/estimate/result.hpp"
#include "sidco/pipeline/report.hpp"
#include "sidco/select/radix_threshold.hpp"
#include "sidco/select/result.hpp"

namespace sidco::pipeline {

/// The estimator's view of the data: passes of its own over one source, counted.
template <class Backend, class Source>
struct estimator_pass {
  /// Whether the values are a gradient plus an error-feedback residual, which moves them
  /// from call to call by itself.
  static constexpr bool feedback = Source::has_state;
  Backend& backend;
  const Source& source;
  int passes = 0;

  template <bool Log>
  moments tail(double t) {
    ++passes;
    return backend.template tail<Log>(source, t);
  }
  std::size_t count_above(double t) {
    ++passes;
    return backend.count_above(source, t);
  }
  void sample_magnitudes(std::uint64_t state, std::span<double> out) {
    backend.sample_magnitudes(source, state, out);
  }
};

/// One segment's estimate: the threshold, the passes the estimator made of its own, and the
/// density it aimed at (the selection's estimation density for the segment's delta).
struct estimate_outcome {
  estimate::threshold_estimate estimate;
  int passes = 0;
  double aimed = 0;
};

template <class Estimator, class Selection>
class tensor_state {
 public:
  /// Most tails an estimator may ask the moments pass to measure (the backends' moments
  /// passes take at most two probes per segment).
  static constexpr std::size_t max_probes = 2;

  tensor_state() = default;
  tensor_state(Estimator estimator, Selection selection)
      : estimator_(std::move(estimator)), selection_(std::move(selection)) {}

  /// How many tails the estimator asks the next moments pass to measure (at most limit), and
  /// where (the first probe_count(limit) of its probes).
  std::size_t probe_count(std::size_t limit) const {
    if constexpr (estimate::contract::declares_probes<Estimator>())
      return std::min({limit, max_probes, estimator_.probe_count()});
    else
      return 0;
  }
  void probe_thresholds(std::span<double> out) const {
    if constexpr (estimate::contract::declares_probes<Estimator>()) estimator_.probe_thresholds(out);
  }

  /// The threshold for source at density delta, from the moments pass's all and probes,
  /// with the estimator's own passes made through backend.
  template <class Backend, class Source>
  estimate_outcome estimate(Backend& backend, const Source& source, const moments& all,
                            std::span<const moments> probes, double delta) {
    estimator_pass<Backend, Source> pass{backend, source};
    estimate_outcome outcome;
    outcome.aimed = selection_.estimation_density(delta);
    outcome.estimate = estimator_.estimate(all, probes, outcome.aimed, pass);
    if constexpr (Estimator::statistics::sums) {
      auto& estimate = outcome.estimate;
      if (!usable(estimate.threshold, all)) {
        estimate.fallback = true;
        if (all.nonzero() == 0) {
          estimate.threshold = 0;
        } else {
          ++pass.passes;
          const auto start =
              select::detail::bucket_of_kth_largest(backend, source, target_count(outcome.aimed, source.size));
          estimate.threshold = start.everything ? 0.0 : start.threshold;
        }
      }
    }
    outcome.passes = pass.passes;
    return outcome;
  }

  /// A threshold the selection can use: finite, not negative, and below the largest
  /// magnitude when there is a non-zero (else |x| > t keeps nothing). Fits degenerate on
  /// ties, one value, denormals or sums that overflow; such thresholds are replaced by the
  /// lower edge of the radix bucket that holds the k-th largest magnitude (one histogram
  /// pass): at least k values, and every value sharing that bucket, are kept.
  static bool usable(double threshold, const moments& all) {
    if (!(threshold >= 0)) return false;
    return all.nonzero() == 0 ? std::isfinite(threshold) : threshold < all.max;
  }

  /// Appends the selection for source to out (k: the target count).
  template <class Backend, class Source, class Out>
  select::selection_result select(Backend& backend, const Source& source, double threshold, std::size_t k,
                                  Out& out) {
    return selection_.select(backend, source, threshold, k, out);
  }

  /// The report of a segment whose selection appended `selected` entries; adaptive
  /// estimators learn from the candidates (before any trimming).
  compress_report report(const estimate_outcome& outcome, const select::selection_result& picked,
                         std::size_t selected, const moments& all, double delta, std::size_t size) {
    compress_report report;
    report.threshold = outcome.estimate.threshold;
    report.selected = selected;
    report.candidates = picked.candidates;
    report.size = size;
    report.zeros = std::size_t(all.zeros);
    report.target_density = delta;
    report.density = double(selected) / double(size);
    report.stages = outcome.estimate.stages;
    report.rescans = picked.rescans;
    report.passes = outcome.passes;
    report.fallback = outcome.estimate.fallback;
    if constexpr (estimate::contract::declares_observes<Estimator>())
      estimator_.observe(double(picked.candidates) / double(size), outcome.aimed);
    return report;
  }

  /// Bytes kept between calls.
  std::size_t workspace_bytes() const {
    std::size_t bytes = 0;
    if constexpr (requires { estimator_.workspace_bytes(); }) bytes += estimator_.workspace_bytes();
    if constexpr (requires { selection_.workspace_bytes(); }) bytes += selection_.workspace_bytes();
    return bytes;
  }

  /// What is kept between calls besides buffers (adaptive stages, where the next call
  /// probes, generators' positions): load_state of what save_state wrote makes every later
  /// call give the same bits. A state of another method, or a damaged one, is refused and
  /// nothing changes.
  void save_state(state_writer& out) const {
    out.name("sidco.compressor");
    out.name(Estimator::name);
    out.name(Selection::name);
    if constexpr (stateful<Estimator>) estimator_.save_state(out);
    if constexpr (stateful<Selection>) selection_.save_state(out);
  }
  void load_state(state_reader& in) {
    in.expect("sidco.compressor");
    in.expect(Estimator::name);
    in.expect(Selection::name);
    Estimator estimator = estimator_;
    Selection selection = selection_;
    if constexpr (stateful<Estimator>) estimator.load_state(in);
    if constexpr (stateful<Selection>) selection.load_state(in);
    estimator_ = std::move(estimator);
    selection_ = std::move(selection);
  }

  Estimator& estimator() { return estimator_; }
  const Estimator& estimator() const { return estimator_; }
  Selection& selection() { return selection_; }
  const Selection& selection() const { return selection_; }

 private:
  Estimator estimator_{};
  Selection selection_{};
};

}  // namespace sidco::pipeline
