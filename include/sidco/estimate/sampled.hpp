// DGC's threshold: the top of a random sample of the magnitudes (Lin et al., ICLR 2018).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <span>
#include <vector>

#include "sidco/backend/pass_statistics.hpp"
#include "sidco/core/checks.hpp"
#include "sidco/core/error.hpp"
#include "sidco/core/moments.hpp"
#include "sidco/core/splitmix.hpp"
#include "sidco/core/state_io.hpp"
#include "sidco/estimate/result.hpp"

namespace sidco::estimate {

/// Samples about sample_fraction of the values (at least ceil(2/delta), up to
/// max_density_samples for that minimum) at random positions,
/// takes the ceil(delta s)-th largest sampled magnitude as t and keeps |x| >= t (t = 0: |x| > 0). While fewer
/// than k values reach t, t is lowered by lower_factor (at most max_lowerings times).
/// The sample positions come from a seeded generator that advances every call; the backend
/// draws them where the values are (core/splitmix.hpp: a GPU uploads no positions) and
/// returns the magnitudes there.
class sampled {
 public:
  static constexpr const char* name = "dgc-sampled";
  static constexpr bool provides_threshold = true;
  using statistics = backend::pass_statistics<false>;  // counts: the input check and N

  /// The most samples the 2/delta minimum asks for: at a density near 1/N it would sample
  /// (and keep 8 bytes a sample for) nearly the whole vector; past this the lowering loop
  /// below finds the threshold.
  static constexpr double max_density_samples = double(1 << 20);

  struct options {
    double sample_fraction = 0.01;
    double lower_factor = 0.8;
    int max_lowerings = 10;
    std::uint64_t seed = 0xd6c;
  };

  sampled() = default;
  explicit sampled(options o) : options_(o), rng_{o.seed} {
    if (!(o.sample_fraction > 0 && o.sample_fraction <= 1))
      detail::fail("sampled estimator: sample_fraction = ", o.sample_fraction,
                   " is outside (0, 1]");
    if (!(o.lower_factor > 0 && o.lower_factor < 1))
      detail::fail("sampled estimator: lower_factor = ", o.lower_factor, " is outside (0, 1)");
    if (o.max_lowerings < 0)
      detail::fail("sampled estimator: max_lowerings = ", o.max_lowerings, " is negative");
  }

  template <class Pass>
  threshold_estimate estimate(const moments& all, std::span<const moments>, double delta, Pass& pass) {
    const std::size_t n = std::size_t(all.count);
    const double wanted =
        std::max(options_.sample_fraction * double(n), std::min(std::ceil(2 / delta), max_density_samples));
    // Clamp before converting: 2/delta overflows size_t for tiny (valid) densities.
    const std::size_t samples = wanted >= double(n) ? n : std::size_t(wanted);
    sample_.resize(samples);
    pass.sample_magnitudes(rng_.state, sample_);
    rng_.skip(samples);
    const std::size_t top = std::min(samples, std::size_t(std::ceil(delta * double(samples))));
    double t = kth_largest(sample_, top);
    const double k = double(target_count(delta, n));
    int passes = 0;
    // |x| >= t is |x| > (the double just below t): the selection's comparison.
    auto at_least = [](double v) { return std::nextafter(v, -std::numeric_limits<double>::infinity()); };
    while (passes < options_.max_lowerings && t > 0 &&
           double(pass.count_above(at_least(t))) < k) {
      t *= options_.lower_factor;
      ++passes;
    }
    // A sample of zeros alone gives 0: every non-zero is kept (never the zeros). A sample
    // is not a fit (stages 0); each lowering is a pass of its own (report.passes).
    return {t > 0 ? at_least(t) : 0.0, 0};
  }

  /// The k-th largest of values (1 <= k <= its size), which it reorders. A few of many (a
  /// small layer's sample keeps 2 of 2,000): a min-heap of the k largest so far, which most
  /// values pass by with one comparison; else std::nth_element. Either gives the same value.
  static double kth_largest(std::span<double> values, std::size_t k) {
    const auto heap_end = values.begin() + std::ptrdiff_t(k);
    if (k > values.size() / 16) {
      std::nth_element(values.begin(), heap_end - 1, values.end(), std::greater<double>());
      return values[k - 1];
    }
    std::make_heap(values.begin(), heap_end, std::greater<double>());
    for (auto v = heap_end; v != values.end(); ++v) {
      if (!(*v > values.front())) continue;
      std::pop_heap(values.begin(), heap_end, std::greater<double>());
      *(heap_end - 1) = *v;
      std::push_heap(values.begin(), heap_end, std::greater<double>());
    }
    return values.front();
  }

  /// The sample's buffer, kept between calls.
  std::size_t workspace_bytes() const { return sample_.capacity() * sizeof(double); }

  /// The generator's position (the seed it started from is an option).
  void save_state(state_writer& out) const {
    out.name(name);
    out.word(rng_.state);
  }
  void load_state(state_reader& in) {
    in.expect(name);
    rng_.state = in.word("dgc_sampled: generator");
  }

 private:
  options options_{};
  splitmix64 rng_{0xd6c};
  std::vector<double> sample_;
};

}  // namespace sidco::estimate
