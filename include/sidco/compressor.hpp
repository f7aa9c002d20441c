// The composition every method is built from: estimator, selection, backend.
#pragma once

#include <cmath>
#include <cstddef>
#include <span>
#include <type_traits>
#include <vector>

#include "sidco/backend/serial.hpp"
#include "sidco/backend/source.hpp"
#include "sidco/core/error.hpp"
#include "sidco/core/moments.hpp"
#include "sidco/core/sparse_vector.hpp"
#include "sidco/feedback/residual.hpp"
#include "sidco/select/above_threshold.hpp"

namespace sidco {

/// What one compress call did, so that a user can check it against what was asked.
struct compress_report {
  double threshold = 0;       // kept |x| > threshold
  std::size_t selected = 0;   // entries in the sparse output
  std::size_t size = 0;       // dense length
  std::size_t zeros = 0;      // exact zeros in the input
  double target_density = 0;  // delta as asked
  double density = 0;         // selected / size
  int stages = 0;             // distribution fits used (0: none needed)

  double density_ratio() const { return density / target_density; }
};

/// compressor<Estimator, Selection, Backend>: a moments pass, the estimator's threshold (with
/// whatever refinement passes it asks for), then the selection pass. All policy choice is at
/// compile time. One compressor per tensor: estimators such as adaptive stages keep state.
template <class Estimator, class Selection = select::above_threshold,
          class Backend = backend::serial>
class compressor {
 public:
  using estimator_type = Estimator;
  using selection_type = Selection;
  using backend_type = Backend;

  compressor() = default;
  explicit compressor(Estimator estimator, Selection selection = {}, Backend backend = {})
      : estimator_(std::move(estimator)), selection_(selection), backend_(backend) {}

  /// Compresses gradient at density delta in (0, 1] into out (cleared first).
  template <class T, class Index>
  compress_report compress(std::span<const std::type_identity_t<T>> gradient, double delta,
                           sparse_vector<T, Index>& out) {
    check_arguments(gradient.size(), delta, out);
    return run(backend::plain_source<T>{gradient.data(), gradient.size()}, delta, out,
               "gradient");
  }

  /// Compresses gradient + residual and leaves in residual what was not sent.
  template <class T, class Index>
  compress_report compress(std::span<const std::type_identity_t<T>> gradient, double delta,
                           sparse_vector<T, Index>& out, feedback::residual<T>& residual) {
    check_arguments(gradient.size(), delta, out);
    if (residual.size() != gradient.size())
      detail::fail("residual: size ", residual.size(), " does not match gradient size ",
                   gradient.size());
    return run(backend::feedback_source<T>{gradient.data(), residual.data(), gradient.size()},
               delta, out, "gradient + residual");
  }

  Estimator& estimator() { return estimator_; }
  const Estimator& estimator() const { return estimator_; }
  const Backend& backend() const { return backend_; }

 private:
  template <class T, class Index>
  static void check_arguments(std::size_t size, double delta, const sparse_vector<T, Index>&) {
    if (!(delta > 0 && delta <= 1)) detail::fail("delta = ", delta, " is outside (0, 1]");
    if (size == 0) detail::fail("gradient is empty");
    if (size > sparse_vector<T, Index>::max_dense_size)
      detail::fail("gradient: size ", size, " exceeds the ", 8 * sizeof(Index),
                   "-bit index range (", sparse_vector<T, Index>::max_dense_size,
                   "); use sparse_vector<T, std::uint64_t>");
  }

  // The estimator's view of the data: moments of the excesses over a threshold. Thresholds
  // only rise between stages, so the values above the first one are kept and later stages
  // scan those alone; a lower threshold (a stage that overshot) reads the source again.
  template <class Source, class T>
  struct pass {
    const Backend& backend;
    const Source& source;
    std::vector<T>& exceedances;
    double kept_above = __builtin_huge_val();

    template <bool Log>
    moments excess(double t) {
      if (t >= kept_above) {
        moments m;
        for (const T a : exceedances)
          if (double(a) > t) m.template add<Log>(double(a) - t);
        return m;
      }
      exceedances.clear();
      kept_above = t;
      return backend.template excess<Log>(source, t, exceedances);
    }
  };

  template <class T>
  std::vector<T>& exceedance_workspace() {
    if constexpr (std::is_same_v<T, float>)
      return exceedances_float_;
    else
      return exceedances_double_;
  }

  template <class Source, class T, class Index>
  compress_report run(const Source& source, double delta, sparse_vector<T, Index>& out,
                      const char* what) {
    // Everything that can reject the input happens before the first write.
    const moments all = backend_.template magnitudes<Estimator::needs_log>(source);
    if (all.nonfinite) {
      const std::size_t at = backend_.first_nonfinite(source);
      detail::fail(what, " contains ", all.nonfinite, " non-finite value(s); the first is ",
                   double(source.value(at)), " at index ", at);
    }
    pass<Source, T> refine{backend_, source, exceedance_workspace<T>()};
    const auto estimate = estimator_.estimate(all, delta, refine);

    out.clear(source.size);
    selection_.select(backend_, source, estimate.threshold, out);

    compress_report report;
    report.threshold = estimate.threshold;
    report.selected = out.size();
    report.size = source.size;
    report.zeros = std::size_t(all.zeros);
    report.target_density = delta;
    report.density = double(out.size()) / double(source.size);
    report.stages = estimate.stages;
    if constexpr (requires { estimator_.observe(report.density, delta); })
      estimator_.observe(report.density, delta);
    return report;
  }

  Estimator estimator_{};
  Selection selection_{};
  Backend backend_{};
  // |x| above the first refinement threshold (a quarter of the non-zeros by default): kept
  // across calls so that a steady tensor allocates only on its first calls.
  std::vector<float> exceedances_float_;
  std::vector<double> exceedances_double_;
};

}  // namespace sidco
