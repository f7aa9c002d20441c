// The composition every method is built from: estimator, selection, backend.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <span>
#include <type_traits>

#include "sidco/backend/concept.hpp"
#include "sidco/backend/source.hpp"
#include "sidco/core/checks.hpp"
#include "sidco/core/error.hpp"
#include "sidco/core/moments.hpp"
#include "sidco/core/segment.hpp"
#include "sidco/core/single_user.hpp"
#include "sidco/core/sparse_vector.hpp"
#include "sidco/core/state_io.hpp"
#include "sidco/estimate/concept.hpp"
#include "sidco/estimate/none.hpp"
#include "sidco/feedback/momentum.hpp"
#include "sidco/feedback/residual.hpp"
#include "sidco/policy_checks.hpp"
#include "sidco/select/above_threshold.hpp"
#include "sidco/select/radix_threshold.hpp"

namespace sidco {

namespace backend {
// The default backend, defined in sidco/backend/cpu.hpp (presets.hpp and sidco.hpp include
// it): this header stays free of OpenMP and Highway for users of other backends.
class cpu;
}  // namespace backend

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
  int passes = 0;              // passes the estimate made besides the moments pass
  bool fallback = false;       // the estimator's fit degenerated; the radix threshold was used

  double density_ratio() const { return density / target_density; }
};

namespace detail {

// The memory space of a backend, or host memory for a type that is not one (so that a
// type given on the wrong axis fails on the axis check alone).
template <class B>
struct memory_of {
  using type = memory::host;
};
template <class B>
  requires requires { typename B::memory; }
struct memory_of<B> {
  using type = typename B::memory;
};

// The estimator's view of the data: passes of their own over one source, counted.
template <class Backend, class Source>
struct estimator_pass {
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
  void gather_magnitudes(std::span<const std::size_t> positions, std::span<double> out) {
    backend.gather_magnitudes(source, positions, out);
  }
};

}  // namespace detail

/// compressor<Estimator, Selection, Backend>: a moments pass (which also rejects bad input
/// before anything is written, and measures the tails the estimator probes), the
/// estimator's threshold (with whatever passes of its own it asks for), then the selection.
/// All policy choice is at compile time. One compressor per tensor: estimators such as
/// adaptive stages and selections such as Random-k keep state. Buffers (output, residual)
/// live in the backend's memory space.
template <class Estimator, class Selection = select::above_threshold,
          class Backend = backend::cpu>
class compressor {
  static_assert(!detail::backend_like<Selection>,
                "compressor<Estimator, Selection, Backend>: a backend was given as the "
                "Selection. Presets take the selection first, then the backend: write "
                "sidco_e<select::above_threshold, backend::serial>, not sidco_e<backend::serial>");
  static_assert(detail::selection_policy<Selection> || detail::backend_like<Selection>,
                "compressor<Estimator, Selection, Backend>: Selection must be a selection policy "
                "(select::above_threshold, exact_k, trimmed<P>, top_k or random_k)");
  static_assert(detail::estimator_policy<Estimator>,
                "compressor<Estimator, Selection, Backend>: Estimator must be an estimator "
                "(estimate::statistical<...>, sampled, gaussian_k, redsync or none)");
  static_assert(!detail::estimator_policy<Estimator> || estimate::diagnose<Estimator>());
  static_assert(!detail::selection_policy<Backend>,
                "compressor<Estimator, Selection, Backend>: a selection was given as the "
                "Backend (backend::cpu, backend::serial or backend::cuda)");
  static_assert(detail::selection_policy<Backend> || backend::diagnose<Backend>());
  static_assert(!detail::needs_threshold<Selection>() || detail::provides_threshold<Estimator>(),
                "this selection keeps values above a threshold: pair it with an estimator "
                "that provides one (estimate::statistical, sampled, gaussian_k, redsync)");
  static_assert(!detail::selection_policy<Selection> || detail::needs_threshold<Selection>() ||
                    std::is_same_v<Estimator, estimate::none>,
                "top_k and random_k select without a threshold: use estimate::none");

  using memory = typename detail::memory_of<Backend>::type;
  template <class T>
  using view = typename memory::template view<T>;

 public:
  using estimator_type = Estimator;
  using selection_type = Selection;
  using backend_type = Backend;
  using memory_space = memory;
  /// Most tails an estimator may ask the moments pass to measure.
  static constexpr std::size_t max_probes = 4;

  compressor() = default;
  explicit compressor(Estimator estimator, Selection selection = {}, Backend backend = {})
      : estimator_(std::move(estimator)), selection_(std::move(selection)), backend_(std::move(backend)) {}

  /// Compresses gradient at density delta in (0, 1] into out (cleared first).
  template <class T, class Index>
  compress_report compress(view<const std::type_identity_t<T>> gradient, double delta,
                           sparse_vector<T, Index, memory>& out) {
    check_arguments(gradient.size(), delta, out);
    return run(backend::plain_source<T, memory>{gradient.data(), gradient.size()}, "gradient", delta, out);
  }

  /// Compresses gradient + residual and leaves in residual what was not sent.
  template <class T, class Index>
  compress_report compress(view<const std::type_identity_t<T>> gradient, double delta,
                           sparse_vector<T, Index, memory>& out, feedback::residual<T, memory>& residual) {
    check_arguments(gradient.size(), delta, out);
    check::same_size("residual", residual.size(), gradient.size());
    return run(backend::feedback_source<T, memory>{gradient.data(), residual.data(), gradient.size()},
               "gradient + residual", delta, out);
  }

  /// DGC: compresses the momentum-corrected accumulation and masks what was sent.
  template <class T, class Index>
  compress_report compress(view<const std::type_identity_t<T>> gradient, double delta,
                           sparse_vector<T, Index, memory>& out, feedback::momentum<T, memory>& state) {
    check_arguments(gradient.size(), delta, out);
    check::same_size("momentum", state.size(), gradient.size());
    return run(backend::momentum_source<T, memory>{gradient.data(), state.velocity_data(),
                                                   state.accumulation_data(), state.factor(),
                                                   gradient.size()},
               "momentum-corrected gradient", delta, out);
  }

  // Phases, for compositions such as segmented that run one pass over many tensors.

  /// How many tails the estimator asks the next moments pass to measure, and where.
  std::size_t probe_count() const {
    if constexpr (estimate::contract::declares_probes<Estimator>())
      return std::min(max_probes, estimator_.probe_count());
    else
      return 0;
  }
  void probe_thresholds(std::span<double> out) const {
    if constexpr (estimate::contract::declares_probes<Estimator>()) estimator_.probe_thresholds(out);
  }

  /// The threshold for source (moments all and probes from the moments pass), with the
  /// estimator's own passes made through backend, and the density it aimed at.
  template <class Source>
  std::pair<estimate::threshold_estimate, int> estimate_threshold(Backend& backend, const Source& source,
                                                                   const moments& all,
                                                                   std::span<const moments> probes,
                                                                   double delta) {
    detail::estimator_pass<Backend, Source> pass{backend, source};
    const double density = selection_.estimation_density(delta);
    auto estimate = estimator_.estimate(all, probes, density, pass);
    if constexpr (Estimator::statistics::sums) {
      if (!usable(estimate.threshold, all)) {
        estimate.fallback = true;
        if (all.nonzero() == 0) {
          estimate.threshold = 0;
        } else {
          ++pass.passes;
          const auto start = select::detail::bucket_of_kth_largest(backend, source, target_count(density, source.size));
          estimate.threshold = start.everything ? 0.0 : start.threshold;
        }
      }
    }
    return {estimate, pass.passes};
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

  /// The report of a call whose selection appended selected entries (candidates before
  /// trimming); adaptive estimators learn from it.
  compress_report complete(const estimate::threshold_estimate& estimate, int passes,
                           const select::selection_result& picked, std::size_t selected,
                           const moments& all, double delta, std::size_t size) {
    compress_report report;
    report.threshold = estimate.threshold;
    report.selected = selected;
    report.candidates = picked.candidates;
    report.size = size;
    report.zeros = std::size_t(all.zeros);
    report.target_density = delta;
    report.density = double(selected) / double(size);
    report.stages = estimate.stages;
    report.rescans = picked.rescans;
    report.passes = passes;
    report.fallback = estimate.fallback;
    // Adaptive estimators learn from what their threshold yielded, before any trimming.
    if constexpr (estimate::contract::declares_observes<Estimator>())
      estimator_.observe(double(picked.candidates) / double(size), selection_.estimation_density(delta));
    return report;
  }

  /// Estimate, select (appending to out, indices base + i), report: after the moments pass.
  template <class Source, class T, class Index>
  compress_report finish(Backend& backend, const Source& source, const moments& all,
                         std::span<const moments> probes, double delta, sparse_vector<T, Index, memory>& out) {
    const auto [estimate, passes] = estimate_threshold(backend, source, all, probes, delta);
    const std::size_t before = out.size();
    const auto picked = selection_.select(backend, source, estimate.threshold, target_count(delta, source.size), out);
    return complete(estimate, passes, picked, out.size() - before, all, delta, source.size);
  }

  /// Bytes this compressor keeps between calls besides its output.
  std::size_t workspace_bytes() const {
    std::size_t bytes = 0;
    if constexpr (requires { backend_.workspace_bytes(); }) bytes += backend_.workspace_bytes();
    if constexpr (requires { estimator_.workspace_bytes(); }) bytes += estimator_.workspace_bytes();
    if constexpr (requires { selection_.workspace_bytes(); }) bytes += selection_.workspace_bytes();
    return bytes;
  }

  /// What this compressor keeps between calls besides buffers (adaptive stages, where the
  /// next call probes, generators' positions), for a checkpoint: load_state of what
  /// save_state wrote makes every later call give the same bits as this compressor's would.
  /// A state of another method, or a damaged one, is refused and nothing changes.
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
  Backend& backend() { return backend_; }
  const Backend& backend() const { return backend_; }

  template <class T, class Index>
  static void check_arguments(std::size_t size, double delta, const sparse_vector<T, Index, memory>&) {
    check::density(delta);
    if (size == 0) detail::fail("gradient is empty");
    if (size > sparse_vector<T, Index, memory>::max_dense_size)
      detail::fail("gradient: size ", size, " exceeds the ", 8 * sizeof(Index),
                   "-bit index range (", sparse_vector<T, Index, memory>::max_dense_size,
                   "); use sparse_vector<T, std::uint64_t>");
  }

  /// Throws sidco::error naming what and the first non-finite value when the moments pass
  /// found any. Reads only; nothing has been written yet.
  template <class Source>
  static void check_finite(Backend& backend, const Source& source, const moments& all, const char* what) {
    if (all.nonfinite == 0) return;
    const auto first = backend.first_nonfinite(source);
    detail::fail(what, " contains ", all.nonfinite, " non-finite value(s); the first is ", first.value,
                 " at index ", source.base + first.index);
  }

 private:
  // The moments pass (probes included), checked before anything is written; then the rest.
  template <class Source, class T, class Index>
  compress_report run(const Source& source, const char* what, double delta,
                      sparse_vector<T, Index, memory>& out) {
    const detail::single_user::scope in_use(user_, "compressor::compress");
    const std::size_t probe_total = probe_count();
    std::array<double, max_probes> probes{};
    probe_thresholds(std::span<double>(probes.data(), probe_total));
    std::array<moments, 1 + max_probes> measured{};
    const segment whole{0, source.size};
    backend_.template analyze<typename Estimator::statistics>(
        source, std::span<const segment>(&whole, 1), std::span<const double>(probes.data(), probe_total),
        std::span<moments>(measured.data(), 1 + probe_total));
    check_finite(backend_, source, measured[0], what);
    out.clear(source.size);
    return finish(backend_, source, measured[0],
                  std::span<const moments>(measured.data() + 1, probe_total), delta, out);
  }

  Estimator estimator_{};
  Selection selection_{};
  Backend backend_{};
  [[no_unique_address]] detail::single_user user_;
};

}  // namespace sidco
