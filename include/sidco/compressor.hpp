// The composition every method is built from: estimator, selection, backend.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <span>
#include <type_traits>
#include <vector>

#include "sidco/backend/cpu.hpp"
#include "sidco/backend/serial.hpp"
#include "sidco/backend/source.hpp"
#include "sidco/core/error.hpp"
#include "sidco/core/moments.hpp"
#include "sidco/core/sparse_vector.hpp"
#include "sidco/estimate/none.hpp"
#include "sidco/feedback/momentum.hpp"
#include "sidco/feedback/residual.hpp"
#include "sidco/select/above_threshold.hpp"

namespace sidco {

/// What one compress call did, so that a user can check it against what was asked.
struct compress_report {
  double threshold = 0;        // the estimated threshold (-1: none was used)
  std::size_t selected = 0;    // entries in the sparse output
  std::size_t candidates = 0;  // entries above the threshold, before any trimming
  std::size_t size = 0;        // dense length
  std::size_t zeros = 0;       // exact zeros in the input
  double target_density = 0;   // delta as asked
  double density = 0;          // selected / size
  int stages = 0;              // distribution fits or estimator steps (0: none needed)
  int rescans = 0;             // extra passes a selection made because too few were found

  double density_ratio() const { return density / target_density; }
};

/// The count a method aims at: max(1, floor(delta N)).
inline std::size_t target_count(double delta, std::size_t size) {
  return std::max<std::size_t>(1, std::size_t(std::floor(delta * double(size))));
}

/// compressor<Estimator, Selection, Backend>: a moments pass (which also rejects bad input
/// before anything is written), the estimator's threshold (with whatever refinement passes it
/// asks for), then the selection. All policy choice is at compile time. One compressor per
/// tensor: estimators such as adaptive stages and selections such as Random-k keep state.
template <class Estimator, class Selection = select::above_threshold,
          class Backend = backend::cpu>
class compressor {
  static_assert(!Selection::needs_threshold || Estimator::provides_threshold,
                "this selection keeps values above a threshold: pair it with an estimator "
                "that provides one (estimate::statistical, sampled, gaussian_k, redsync)");
  static_assert(Selection::needs_threshold || std::is_same_v<Estimator, estimate::none>,
                "top_k and random_k select without a threshold: use estimate::none");

 public:
  using estimator_type = Estimator;
  using selection_type = Selection;
  using backend_type = Backend;

  compressor() = default;
  explicit compressor(Estimator estimator, Selection selection = {}, Backend backend = {})
      : estimator_(std::move(estimator)), selection_(std::move(selection)), backend_(backend) {}

  /// Compresses gradient at density delta in (0, 1] into out (cleared first).
  template <class T, class Index>
  compress_report compress(std::span<const std::type_identity_t<T>> gradient, double delta,
                           sparse_vector<T, Index>& out) {
    check_arguments(gradient.size(), delta, out);
    return run(backend::plain_source<T>{gradient.data(), gradient.size()}, "gradient", delta, out);
  }

  /// Compresses gradient + residual and leaves in residual what was not sent.
  template <class T, class Index>
  compress_report compress(std::span<const std::type_identity_t<T>> gradient, double delta,
                           sparse_vector<T, Index>& out, feedback::residual<T>& residual) {
    check_arguments(gradient.size(), delta, out);
    check_state_size("residual", residual.size(), gradient.size());
    return run(backend::feedback_source<T>{gradient.data(), residual.data(), gradient.size()},
               "gradient + residual", delta, out);
  }

  /// DGC: compresses the momentum-corrected accumulation and masks what was sent.
  template <class T, class Index>
  compress_report compress(std::span<const std::type_identity_t<T>> gradient, double delta,
                           sparse_vector<T, Index>& out, feedback::momentum<T>& state) {
    check_arguments(gradient.size(), delta, out);
    check_state_size("momentum", state.size(), gradient.size());
    return run(backend::momentum_source<T>{gradient.data(), state.velocity_data(),
                                           state.accumulation_data(), state.factor(),
                                           gradient.size()},
               "momentum-corrected gradient", delta, out);
  }

  /// Phase one, for compositions such as segmented: the moments pass (only counts when the
  /// estimator fits nothing), which throws sidco::error on a non-finite value and writes
  /// nothing the caller owns. When the last call's estimate made a refinement pass, this pass
  /// also keeps the magnitudes above a margin below that pass's threshold, for the finish
  /// that follows on the same source (its first refinement then needs no pass of its own).
  template <class Source>
  moments analyze(const Source& source, const char* what) {
    using T = std::remove_cvref_t<decltype(source.value(0))>;
    moments all;
    kept_above_ = __builtin_huge_val();
    if constexpr (Estimator::provides_threshold) {
      auto& kept = exceedance_workspace<T>();
      if (prefetch_threshold_ >= 0 && !kept.empty()) {
        bool complete = false;
        all = backend_.template magnitudes_above<Estimator::needs_log>(
            source, prefetch_threshold_, kept, kept.size(), prefetch_limit_, complete);
        if (complete)
          kept_above_ = prefetch_threshold_;
        else
          prefetch_margin_ = std::max(min_prefetch_margin, prefetch_margin_ / 2);
      } else {
        all = backend_.template magnitudes<Estimator::needs_log>(source);
      }
    } else {
      all = backend_.counts(source);
    }
    if (all.nonfinite) {
      kept_above_ = __builtin_huge_val();
      const std::size_t at = backend_.first_nonfinite(source);
      detail::fail(what, " contains ", all.nonfinite, " non-finite value(s); the first is ",
                   double(source.value(at)), " at index ", source.base + at);
    }
    return all;
  }

  /// Phase two: estimate, then append the selection (indices base + i) to out.
  template <class Source, class T, class Index>
  compress_report finish(const Source& source, const moments& all, double delta,
                         sparse_vector<T, Index>& out) {
    const double estimation_delta = selection_.estimation_density(delta);
    const std::size_t prefetched = exceedance_workspace<T>().size();
    pass<Source, T> refine{backend_, source, exceedance_workspace<T>(), kept_above_};
    const bool did_prefetch = kept_above_ < __builtin_huge_val();
    kept_above_ = __builtin_huge_val();
    const auto estimate = estimator_.estimate(all, estimation_delta, refine);
    plan_prefetch(did_prefetch, refine.first_threshold, prefetched, refine.first_count);
    const std::size_t before = out.size();
    const auto picked =
        selection_.select(backend_, source, estimate.threshold, target_count(delta, source.size), out);

    compress_report report;
    report.threshold = estimate.threshold;
    report.selected = out.size() - before;
    report.candidates = picked.candidates;
    report.size = source.size;
    report.zeros = std::size_t(all.zeros);
    report.target_density = delta;
    report.density = double(report.selected) / double(source.size);
    report.stages = estimate.stages;
    report.rescans = picked.rescans;
    // Adaptive estimators learn from what their threshold yielded, before any trimming.
    if constexpr (requires { estimator_.observe(0.0, 0.0); })
      estimator_.observe(double(picked.candidates) / double(source.size), estimation_delta);
    return report;
  }

  /// Bytes this compressor keeps between calls (the exceedances later stages scan).
  std::size_t workspace_bytes() const {
    return exceedances_float_.capacity() * sizeof(float) +
           exceedances_double_.capacity() * sizeof(double);
  }

  Estimator& estimator() { return estimator_; }
  const Estimator& estimator() const { return estimator_; }
  Selection& selection() { return selection_; }
  const Backend& backend() const { return backend_; }

  template <class T, class Index>
  static void check_arguments(std::size_t size, double delta, const sparse_vector<T, Index>&) {
    if (!(delta > 0 && delta <= 1)) detail::fail("delta = ", delta, " is outside (0, 1]");
    if (size == 0) detail::fail("gradient is empty");
    if (size > sparse_vector<T, Index>::max_dense_size)
      detail::fail("gradient: size ", size, " exceeds the ", 8 * sizeof(Index),
                   "-bit index range (", sparse_vector<T, Index>::max_dense_size,
                   "); use sparse_vector<T, std::uint64_t>");
  }

  static void check_state_size(const char* what, std::size_t state, std::size_t gradient) {
    if (state != gradient)
      detail::fail(what, ": size ", state, " does not match gradient size ", gradient);
  }

 private:
  // Checks the source (throwing before anything is written), then compresses it into out.
  template <class Source, class T, class Index>
  compress_report run(const Source& source, const char* what, double delta,
                      sparse_vector<T, Index>& out) {
    const moments all = analyze(source, what);
    out.clear(source.size);
    return finish(source, all, delta, out);
  }

  // The estimator's view of the data. Thresholds in a statistical estimate only rise between
  // stages, so the magnitudes above the first are kept and later stages scan those alone; a
  // lower threshold (a stage that overshot) reads the source again.
  template <class Source, class T>
  struct pass {
    const Backend& backend;
    const Source& source;
    std::vector<T>& exceedances;
    double kept_above = __builtin_huge_val();  // exceedances holds the |x| above this
    double first_threshold = -1;               // the first t asked for (-1: none)
    std::size_t first_count = 0;               // how many |x| exceed it

    template <bool Log>
    moments excess(double t) {
      moments m = excess_moments<Log>(t);
      if (first_threshold < 0) {
        first_threshold = t;
        first_count = std::size_t(m.count);
      }
      return m;
    }

    template <bool Log>
    moments excess_moments(double t) {
      if (t >= kept_above) {
        // The backend's moments kernel over the kept magnitudes' excesses; the values not
        // above t come out as zeros and are not part of the sample.
        moments m = backend.template magnitudes<Log>(
            backend::excess_source<T>{exceedances.data(), exceedances.size(), T(t)});
        m.count -= m.zeros;
        m.zeros = 0;
        return m;
      }
      // What the last pass kept (this call's or the last call's) sizes the next one.
      const std::size_t last_kept = exceedances.size();
      exceedances.clear();
      kept_above = t;
      return backend.template excess<Log>(source, t, exceedances, last_kept);
    }

    std::size_t count_above(double t) const { return backend.count_above(source, t); }
    double magnitude(std::size_t i) const { return std::fabs(double(source.value(i))); }
  };

  // Thresholds drift slowly between calls on one tensor, so the next moments pass keeps the
  // magnitudes above a margin below this call's first refinement threshold, at most half
  // again as many as were above it (beyond that the pass gives up keeping them, which bounds
  // the workspace where thresholds move fast). The margin doubles (to 20% at most) when a
  // first threshold fell below what was kept, and halves when the kept magnitudes
  // outnumbered those above the threshold by half.
  void plan_prefetch(bool did_prefetch, double first_threshold, std::size_t prefetched,
                     std::size_t first_count) {
    if (first_threshold < 0) {
      prefetch_threshold_ = -1;
      return;
    }
    if (did_prefetch && first_threshold < prefetch_threshold_)
      prefetch_margin_ = std::min(0.2, 2 * prefetch_margin_);
    else if (did_prefetch && double(prefetched) > 1.5 * double(first_count))
      prefetch_margin_ = std::max(min_prefetch_margin, prefetch_margin_ / 2);
    prefetch_threshold_ = (1 - prefetch_margin_) * first_threshold;
    prefetch_limit_ = first_count + first_count / 2;
  }

  template <class T>
  std::vector<T>& exceedance_workspace() {
    if constexpr (std::is_same_v<T, float>)
      return exceedances_float_;
    else
      return exceedances_double_;
  }

  Estimator estimator_{};
  Selection selection_{};
  Backend backend_{};
  // |x| above the first refinement threshold (a quarter of the non-zeros by default): kept
  // across calls so that a steady tensor allocates only on its first calls.
  std::vector<float> exceedances_float_;
  std::vector<double> exceedances_double_;
  // Set by analyze when its pass kept the magnitudes above this; used by the next finish.
  double kept_above_ = __builtin_huge_val();
  // Where the next analyze keeps magnitudes from (negative: nowhere), and how far below the
  // last first threshold that is.
  double prefetch_threshold_ = -1;
  double prefetch_margin_ = 0.05;
  std::size_t prefetch_limit_ = 0;
  static constexpr double min_prefetch_margin = 1.0 / 256;
};

}  // namespace sidco
