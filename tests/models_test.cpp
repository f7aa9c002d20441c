#include <algorithm>
#include <cmath>
#include <functional>
#include <random>
#include <utility>
#include <vector>

#include "doctest.hpp"
#include <sidco/models/exponential.hpp>
#include <sidco/models/gamma.hpp>
#include <sidco/models/generalized_pareto.hpp>
#include <sidco/models/normal.hpp>
#include <sidco/models/truncated_exponential.hpp>
#include <sidco/models/truncated_log_quadratic.hpp>
#include <sidco/models/weibull.hpp>

// Named after the file: the test programs compile several test files as one unit.
namespace models_test {

using namespace sidco;

// Spot values computed offline with SciPy 1.10 (Debian 12):
//   expon.isf(0.01, scale=2), genpareto.isf(rho, c=-k, scale), gamma.isf(rho, a, scale),
//   halfnorm.isf(rho, scale). SciPy's genpareto shape c is -k in our (Hosking) convention.
TEST_CASE("upper quantiles match SciPy") {
  CHECK(models::exponential{2.0}.upper_quantile(0.01) == doctest::Approx(9.210340371976182).epsilon(1e-13));
  CHECK(models::generalized_pareto{-0.2, 1.5}.upper_quantile(0.01) ==
        doctest::Approx(11.33914823632185).epsilon(1e-12));
  CHECK(models::generalized_pareto{0.3, 2.0}.upper_quantile(0.05) ==
        doctest::Approx(3.9527297897539704).epsilon(1e-12));
  CHECK(models::generalized_pareto{1e-10, 0.5}.upper_quantile(0.001) ==
        doctest::Approx(3.4538776382981413).epsilon(1e-9));
  CHECK(models::gamma{0.7, 3.0}.upper_quantile(0.001) == doctest::Approx(18.191218691661824).epsilon(1e-10));
  CHECK(models::gamma{2.5, 0.2}.upper_quantile(0.1) == doctest::Approx(0.9236356899781116).epsilon(1e-10));
  CHECK(models::normal{2.0}.upper_quantile(0.01) == doctest::Approx(5.151658607097801).epsilon(1e-12));
  CHECK(models::normal{0.5}.upper_quantile(0.25) == doctest::Approx(0.5751746901880039).epsilon(1e-12));
  // weibull_min.isf(rho, c=k, scale) = scale (-ln rho)^(1/k) (Python's math module).
  CHECK(models::weibull{0.5, 2.0}.upper_quantile(0.01) == doctest::Approx(42.41518488382717).epsilon(1e-13));
  CHECK(models::weibull{0.7, 3e-3}.upper_quantile(0.001) == doctest::Approx(0.04744320621882769).epsilon(1e-13));
  CHECK(models::weibull{1.8, 0.4}.upper_quantile(0.2) == doctest::Approx(0.5210495277356312).epsilon(1e-13));
}

TEST_CASE("generalized Pareto stays continuous as the shape goes to zero") {
  // Either side of the switch to the exponential form the quantile moves by O(k), not more.
  const double at_limit = models::generalized_pareto{0.0, 1.0}.upper_quantile(1e-3);
  for (double k : {1e-6, 1e-8, 1.01e-8, 0.99e-8, 1e-12, -1e-12, -1e-8, -1e-6}) {
    const double t = models::generalized_pareto{k, 1.0}.upper_quantile(1e-3);
    CHECK(std::fabs(t - at_limit) <= 50 * std::fabs(k) * at_limit + 1e-12);
  }
}

TEST_CASE("ccdf inverts upper_quantile") {
  for (double rho : {0.3, 0.01, 1e-5}) {
    CHECK(models::exponential{0.7}.ccdf(models::exponential{0.7}.upper_quantile(rho)) == doctest::Approx(rho).epsilon(1e-12));
    const models::generalized_pareto heavy{-0.3, 0.2}, bounded{0.4, 0.2};
    CHECK(heavy.ccdf(heavy.upper_quantile(rho)) == doctest::Approx(rho).epsilon(1e-10));
    CHECK(bounded.ccdf(bounded.upper_quantile(rho)) == doctest::Approx(rho).epsilon(1e-10));
    const models::gamma g{0.6, 1.3};
    CHECK(g.ccdf(g.upper_quantile(rho)) == doctest::Approx(rho).epsilon(1e-9));
    const models::normal n{1.7};
    CHECK(n.ccdf(n.upper_quantile(rho)) == doctest::Approx(rho).epsilon(1e-9));
    const models::weibull w{0.6, 0.01};
    CHECK(w.ccdf(w.upper_quantile(rho)) == doctest::Approx(rho).epsilon(1e-12));
  }
}

namespace {

// Fits the model to N = 10^6 draws and returns the fraction of draws above its threshold.
template <class Model, class Draw>
void check_fraction_above(Draw draw, const char* what) {
  std::mt19937_64 rng(20210405);
  std::vector<double> x(1000000);
  moments m;
  for (auto& v : x) {
    v = draw(rng);
    m.add<Model::needs_log>(v);
  }
  const Model fitted = Model::fit(m);
  for (double rho : {0.1, 0.01, 0.001}) {
    const double t = fitted.upper_quantile(rho);
    std::size_t above = 0;
    for (double v : x) above += v > t;
    const double fraction = double(above) / double(x.size());
    INFO(what, ": rho = ", rho, ", fraction above = ", fraction);
    // 5%: sampling noise at rho = 0.001 alone is 3.2% (one sigma of 1000 counts).
    CHECK(fraction == doctest::Approx(rho).epsilon(0.05));
  }
}

}  // namespace

TEST_CASE("each model fitted to its own draws puts rho of them above its threshold") {
  check_fraction_above<models::exponential>(
      [](auto& rng) { return std::exponential_distribution<double>(1 / 0.003)(rng); },
      "exponential, mean 0.003");
  check_fraction_above<models::gamma>(
      [](auto& rng) { return std::gamma_distribution<double>(0.6, 0.02)(rng); },
      "gamma, shape 0.6");
  check_fraction_above<models::gamma>(
      [](auto& rng) { return std::gamma_distribution<double>(2.0, 1.0)(rng); },
      "gamma, shape 2");
  check_fraction_above<models::weibull>(
      [](auto& rng) { return std::weibull_distribution<double>(0.6, 0.002)(rng); }, "Weibull, shape 0.6");
  check_fraction_above<models::weibull>(
      [](auto& rng) { return std::weibull_distribution<double>(1.5, 3.0)(rng); }, "Weibull, shape 1.5");
  for (double k : {-0.1, 0.25}) {
    check_fraction_above<models::generalized_pareto>(
        [k](auto& rng) {
          const double u = std::uniform_real_distribution<double>(0, 1)(rng);
          return 0.01 * -std::expm1(k * std::log1p(-u)) / k;  // inverse CDF, scale 0.01
        },
        k < 0 ? "generalized Pareto, k = -0.1" : "generalized Pareto, k = 0.25");
  }
  check_fraction_above<models::normal>(
      [](auto& rng) { return std::fabs(std::normal_distribution<double>(0, 0.05)(rng)); },
      "half-normal");
}

TEST_CASE("fits recover known parameters") {
  moments m;
  // Exactly known moments: values 1, 2, 3 (mean 2, variance 2/3).
  for (double a : {1.0, 2.0, 3.0}) m.add(a);
  CHECK(models::exponential::fit(m).mean == doctest::Approx(2.0));
  const auto gp = models::generalized_pareto::fit(m);
  CHECK(gp.shape == doctest::Approx(0.5 * (4.0 / (2.0 / 3) - 1)));
  CHECK(gp.scale == doctest::Approx(0.5 * 2.0 * (4.0 / (2.0 / 3) + 1)));
  // Minka: s = ln 2 - ln(6)/3.
  const double s = std::log(2.0) - std::log(6.0) / 3;
  const auto g = models::gamma::fit(m);
  CHECK(g.shape == doctest::Approx((3 - s + std::sqrt((s - 3) * (s - 3) + 24 * s)) / (12 * s)));
  CHECK(g.scale * g.shape == doctest::Approx(2.0));
  CHECK(models::normal::fit(m).sigma == doctest::Approx(std::sqrt(14.0 / 3)));
}

TEST_CASE("the Weibull fit inverts its log-moment gap and recovers known parameters") {
  // ln Gamma(1 + u) + gamma_E u at u = 0.5, 1, 2 (Python's math.lgamma).
  CHECK(models::weibull::log_moment_gap(0.5) == doctest::Approx(0.167825594815521).epsilon(1e-13));
  CHECK(models::weibull::log_moment_gap(1.0) == doctest::Approx(0.5772156649015329).epsilon(1e-13));
  CHECK(models::weibull::log_moment_gap(2.0) == doctest::Approx(1.8475785103630107).epsilon(1e-13));
  // 10^6 draws of known shape and scale, fixed seed: both within 1% (the estimator's
  // sampling error at this size is ~0.2%).
  for (const auto& known : {std::pair{0.5, 1e-3}, std::pair{1.0, 0.2}, std::pair{2.5, 7.0}}) {
    const double k = known.first, lambda = known.second;
    std::mt19937_64 rng(20210405);
    std::weibull_distribution<double> draw(k, lambda);
    moments m;
    for (int i = 0; i < 1000000; ++i) m.add<true>(draw(rng));
    const auto fitted = models::weibull::fit(m);
    INFO("shape ", k, ", scale ", lambda);
    CHECK(fitted.shape == doctest::Approx(k).epsilon(0.01));
    CHECK(fitted.scale == doctest::Approx(lambda).epsilon(0.01));
  }
  // Degenerate samples give a quantile the compressor's fallback replaces, not a throw:
  // equal values (shape infinite, the quantile at the value) and no non-zeros (NaN).
  moments equal;
  for (int i = 0; i < 5; ++i) equal.add<true>(0.25);
  CHECK(models::weibull::fit(equal).upper_quantile(0.01) == doctest::Approx(0.25));
  CHECK(std::isnan(models::weibull::fit(moments{}).upper_quantile(0.01)));
}

TEST_CASE("the truncated exponential recovers its rate from its mean, and its quantile inverts its ccdf") {
  // Rates from values piled at the upper end (-800) through uniform (0) to a steep tail (1e4).
  for (double rate : {-800.0, -50.0, -3.0, -1e-7, 0.0, 1e-7, 1e-3, 0.2, 5.0, 300.0, 1e4}) {
    const models::truncated_exponential model{2.5, rate};
    const auto fitted = models::truncated_exponential::with_mean(model.mean(), 2.5);
    INFO("rate ", rate, ", mean ", model.mean(), ", fitted rate ", fitted.rate);
    CHECK(fitted.mean() == doctest::Approx(model.mean()).epsilon(1e-9));
    if (std::fabs(rate) > 1e-3) CHECK(fitted.rate == doctest::Approx(rate).epsilon(1e-8));
    for (double rho : {0.0, 0.01, 0.3, 0.5, 0.99, 1.0}) {
      const double t = model.upper_quantile(rho);
      CHECK(t >= 0);
      CHECK(t <= 2.5);
      CHECK(model.ccdf(t) == doctest::Approx(rho).epsilon(1e-9));
    }
  }
  // Rate 0 is uniform: the mean in the middle, the quantile linear.
  const auto uniform = models::truncated_exponential::with_mean(1.25, 2.5);
  CHECK(uniform.rate == 0);
  CHECK(uniform.upper_quantile(0.3) == doctest::Approx(1.75).epsilon(1e-12));
}

TEST_CASE("the truncated exponential over an exponential tail's stretch is the log-linear interpolation") {
  // Exponential draws of mean 1 (fixed seed): between t0 and t1, the count above t falls as
  // exp(-t), so the log-linear line through (t0, n0) and (t1, n1) gives the cut for k; the
  // model fitted to the mean of the draws between them gives the same cut within the draws'
  // noise (1e6 draws: the stretch's mean is known to about 0.2%).
  std::mt19937_64 rng(5);
  std::exponential_distribution<double> draw(1.0);
  const double t0 = 0.5, t1 = 3.0;
  double n0 = 0, n1 = 0, sum = 0;
  for (int i = 0; i < 1000000; ++i) {
    const double a = draw(rng);
    n0 += a > t0;
    n1 += a > t1;
    if (a > t0 && a <= t1) sum += a;
  }
  const double inside = n0 - n1;
  const auto model = models::truncated_exponential::with_mean(sum / inside - t0, t1 - t0);
  CHECK(model.rate == doctest::Approx(t1 - t0).epsilon(0.02));
  for (double k : {0.9 * n0, 0.5 * n0, 0.2 * n0, 2 * n1}) {
    const double loglinear = t0 + (t1 - t0) * std::log(n0 / k) / std::log(n0 / n1);
    const double cut = t0 + model.upper_quantile((k - n1) / inside);
    INFO("k ", k, ": log-linear ", loglinear, ", model ", cut);
    CHECK(cut == doctest::Approx(loglinear).epsilon(0.01));
  }
}

TEST_CASE("the truncated log-quadratic recovers its shape from its two moments, and its quantile inverts its ccdf") {
  // Slopes and curvatures over the quadrature's range: bulks piled at either end, bells,
  // troughs, and zero curvature (the truncated exponential, whose closed forms it must match).
  int fitted_count = 0;
  for (double slope : {-55.0, -8.0, -1.0, 0.0, 0.5, 3.0, 20.0, 55.0})
    for (double curvature : {-25.0, -3.0, 0.0, 1e-3, 2.0, 12.0}) {
      const models::truncated_log_quadratic model{2.5, slope, curvature};
      if (std::max(std::fabs(slope), std::fabs(slope + 2 * curvature)) > models::truncated_log_quadratic::max_slope)
        continue;
      const auto fitted = models::truncated_log_quadratic::with_moments(model.mean(), model.mean_square(), 2.5);
      INFO("slope ", slope, ", curvature ", curvature);
      REQUIRE(fitted.has_value());
      ++fitted_count;
      CHECK(fitted->slope == doctest::Approx(slope).epsilon(1e-6).scale(1));
      CHECK(fitted->curvature == doctest::Approx(curvature).epsilon(1e-6).scale(1));
      for (double rho : {0.0, 1e-4, 0.01, 0.3, 0.5, 0.99, 1.0}) {
        const double t = fitted->upper_quantile(rho);
        CHECK(t >= 0);
        CHECK(t <= 2.5);
        CHECK(fitted->ccdf(t) == doctest::Approx(rho).epsilon(1e-7).scale(1e-12));
        if (curvature == 0 && rho > 0 && rho < 1) {  // the ends are exact here, rounded there
          const models::truncated_exponential same{2.5, slope};
          CHECK(t == doctest::Approx(same.upper_quantile(rho)).epsilon(1e-8).scale(1));
        }
      }
    }
  CHECK(fitted_count == 45);
  // Moments no density on [0, width] has, a width that is not positive, and a spike steeper
  // than the quadrature resolves: refused, so that the caller keeps the one-moment model.
  CHECK_FALSE(models::truncated_log_quadratic::with_moments(1.0, 1.0, 2.0).has_value());  // variance 0
  CHECK_FALSE(models::truncated_log_quadratic::with_moments(1.0, 2.0, 2.0).has_value());  // all at the ends
  CHECK_FALSE(models::truncated_log_quadratic::with_moments(1.0, 1.2, 0.0).has_value());
  CHECK_FALSE(models::truncated_log_quadratic::with_moments(1.0, 1.2, -2.0).has_value());
  CHECK_FALSE(models::truncated_log_quadratic::with_moments(0.001, 2e-6, 2.0).has_value());  // rate ~2000
  CHECK_FALSE(models::truncated_log_quadratic::with_moments(1.0, 1.0 + 1e-6, 2.0).has_value());  // a spike at 1
}

TEST_CASE("over a bell-shaped bulk the two-moment model finds the cut the one-moment model misses") {
  // Half-normal draws (fixed seed, 10^6): between 0 and 2.5 the density falls as exp(-t^2/2),
  // faster toward the upper end than any exponential with the stretch's mean. The count above
  // the cut for k comes from the draws themselves; the two-moment model lands on it within
  // 0.5% where the mean alone, from k = 10% of the draws down, places it 5-10% too high.
  std::mt19937_64 rng(11);
  std::normal_distribution<double> draw(0.0, 1.0);
  std::vector<double> values(1000000);
  for (double& a : values) a = std::fabs(draw(rng));
  const double t1 = 2.5;
  double n1 = 0, sum = 0, sum_sq = 0;
  for (double a : values) {
    if (a > t1) ++n1; else { sum += a; sum_sq += a * a; }
  }
  const double inside = double(values.size()) - n1;
  const auto two = models::truncated_log_quadratic::with_moments(sum / inside, sum_sq / inside, t1);
  REQUIRE(two.has_value());
  CHECK(two->curvature == doctest::Approx(t1 * t1 / 2).epsilon(0.03));  // exp(-t^2 / 2) on s = t / t1
  const auto one = models::truncated_exponential::with_mean(sum / inside, t1);
  std::sort(values.begin(), values.end(), std::greater<>());
  for (double k : {0.3e6, 0.1e6, 0.05e6, 2 * n1}) {
    const double exact = values[std::size_t(k)];
    const double share = (k - n1) / inside;
    INFO("k ", k, ": exact ", exact, ", two moments ", two->upper_quantile(share), ", one ", one.upper_quantile(share));
    CHECK(two->upper_quantile(share) == doctest::Approx(exact).epsilon(0.005));
    if (k <= 0.1e6) CHECK(one.upper_quantile(share) > 1.05 * exact);  // 1.8 where 1.64 is exact
  }
}

}  // namespace models_test
