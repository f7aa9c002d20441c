// The property sweep: every preset x adversarial inputs x densities x float/double, with and
// without error feedback. What must hold whatever the input: well-formed output, nothing
// lost, exact counts where a method promises them, a finite non-negative threshold, and a
// non-empty selection from a gradient that has non-zero values. Then agreement with the
// serial oracle at extreme scales. Runs in CI's ASan/UBSan build.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "doctest.hpp"
#include <sidco/sidco.hpp>

#include "reference.hpp"
#include "support.hpp"

// Named after the file: the test programs compile several test files as one unit.
namespace property_test {

using namespace sidco;

namespace {

template <class T>
struct adversary {
  std::string name;
  std::vector<T> values;
};

template <class T>
std::vector<adversary<T>> adversaries() {
  using limits = std::numeric_limits<T>;
  constexpr std::size_t n = 5000;
  std::mt19937_64 rng(19);
  std::normal_distribution<double> normal;
  std::vector<adversary<T>> all;
  all.push_back({"constant", std::vector<T>(n, T(0.37))});
  std::vector<T> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = T(int(i % 3) - 1);
  all.push_back({"three tied magnitudes", v});
  for (auto& x : v) x = T(int(rng() % 7) - 3);
  all.push_back({"small integers in [-3, 3]", v});
  for (auto& x : v) x = limits::denorm_min() * T(1 + rng() % 5);
  all.push_back({"denormals", v});
  for (auto& x : v) x = T(0.9 * double(limits::max()) * std::tanh(normal(rng)));
  all.push_back({"normal near the largest finite value", v});
  for (auto& x : v) x = T(normal(rng) * 1e-30);
  all.push_back({"normal at 1e-30", v});
  for (auto& x : v) x = T(normal(rng) * 1e30);
  all.push_back({"normal at 1e30", v});
  std::vector<T> outlier(n, T(1e-3));
  outlier[1234] = T(0.9 * double(limits::max()));
  all.push_back({"one huge outlier", outlier});
  std::vector<T> single(n, T(0));
  single[n - 1] = T(-2.5);
  all.push_back({"one non-zero", single});
  single[n - 1] = limits::denorm_min();
  all.push_back({"one denormal non-zero", single});
  for (std::size_t i = 0; i < n; ++i) v[i] = i % 2 ? T(-0.5) : T(0.5);
  all.push_back({"alternating signs", v});
  all.push_back({"N = 1", {T(0.75)}});
  all.push_back({"N = 1, zero", {T(0)}});
  all.push_back({"N = 2, tied", {T(-1), T(1)}});
  all.push_back({"all zero", std::vector<T>(999, T(0))});
  all.push_back({"signed zeros", {T(0), T(-0.0), T(0), T(-0.0)}});
  return all;
}

struct promise {
  bool exact_top_k = false;  // the selection is the brute-force Top-k
  bool exactly_k = false;    // k entries, whatever they are
  bool threshold = true;     // the report carries the threshold the selection used
};

template <class T, class Compressor>
void sweep(const std::string& method, promise p) {
  for (const auto& a : adversaries<T>()) {
    const std::size_t n = a.values.size();
    std::size_t nonzero = 0;
    for (T x : a.values) nonzero += x != T(0);
    // 1e-38 and the smallest double: valid densities whose 1/delta overflows integer
    // conversions.
    for (double delta : {1.0 / double(n), 0.001, 0.01, 0.5, 1.0, 1e-38}) {
      for (bool feedback : {false, true}) {
        const std::string what = method + " on " + a.name + (feedback ? " with error feedback" : "");
        INFO(what, " at delta ", delta);
        Compressor c;
        sparse_vector<T> out;
        feedback::residual<T> residual(n);
        const std::size_t k = target_count(delta, n);
        // Two calls: the second starts from the residual the first left.
        for (int call = 0; call < 2; ++call) {
          CAPTURE(call);
          const std::vector<T> before(residual.values().begin(), residual.values().end());
          bool overflows = false;
          for (std::size_t i = 0; i < n; ++i) overflows |= !std::isfinite(a.values[i] + before[i]);
          if (feedback && overflows) {
            // gradient + residual is not finite: refused, and the residual kept as it was.
            CHECK_THROWS_AS(c.template compress<T>(a.values, delta, out, residual), sidco::error);
            CHECK(std::equal(before.begin(), before.end(), residual.values().begin()));
            break;
          }
          const auto report = feedback ? c.template compress<T>(a.values, delta, out, residual)
                                       : c.template compress<T>(a.values, delta, out);
          REQUIRE(report.selected == out.size());
          std::vector<T> sent(n, T(0));
          for (std::size_t j = 0; j < out.size(); ++j) {
            const std::size_t i = out.indices()[j];
            REQUIRE(i < n);
            if (j) REQUIRE(out.indices()[j - 1] < i);
            sent[i] = out.values()[j];
          }
          if (feedback) {
            // Nothing lost: what was sent plus what is kept is gradient + old residual, bit
            // for bit (each entry goes whole to one side).
            for (std::size_t i = 0; i < n; ++i) {
              const T total = T(a.values[i] + before[i]);
              REQUIRE(sent[i] + residual.values()[i] == total);
              REQUIRE((sent[i] == T(0) || residual.values()[i] == T(0)));
            }
          } else {
            for (std::size_t j = 0; j < out.size(); ++j) REQUIRE(out.values()[j] == a.values[out.indices()[j]]);
          }
          if (p.exactly_k) CHECK(out.size() == k);
          if (p.exact_top_k && !feedback) CHECK(test::entries(out) == test::reference_top_k<T>(a.values, k));
          if (p.threshold) {
            CHECK(std::isfinite(report.threshold));
            CHECK(report.threshold >= 0);
          }
          // A gradient with non-zero values never yields an empty selection (ties at the
          // threshold are kept whole).
          if (nonzero > 0 && !feedback) {
            CHECK(out.size() >= 1);
            bool sends_nonzero = false;
            for (std::size_t j = 0; j < out.size(); ++j) sends_nonzero |= out.values()[j] != T(0);
            if (p.threshold) CHECK(sends_nonzero);
          }
        }
      }
    }
  }
}

// Every method of the registry, with the promises its entry states: exactly k, the exact
// Top-k, and a threshold in the report wherever an estimator computes one.
template <class T>
void sweep_registry() {
  methods::all::for_each([](auto entry) {
    using method = typename decltype(entry)::type;
    promise p;
    p.exact_top_k = method::about.count == methods::count_promise::top_k;
    p.exactly_k = method::about.exact_count();
    p.threshold = !std::is_same_v<typename method::estimator, estimate::none>;
    sweep<T, methods::compressor_of<method>>(std::string(method::about.name), p);
  });
}

// The density of a method on the cpu backend and on the serial oracle, for a real gradient
// scaled by s.
template <class T, class Method>
std::pair<double, double> densities_at(const std::vector<float>& g, double s, double delta) {
  std::vector<T> x(g.size());
  for (std::size_t i = 0; i < g.size(); ++i) x[i] = T(double(g[i]) * s);
  sparse_vector<T> out;
  methods::compressor_of<Method, backend::cpu> cpu;
  methods::compressor_of<Method, backend::serial> serial;
  return {cpu.template compress<T>(x, delta, out).density, serial.template compress<T>(x, delta, out).density};
}

template <class T, class Method>
void agree_at_extreme_scales() {
  const std::string what(Method::about.name);
  const auto g = test::load_gradient("ffn_it200.npy");
  for (double delta : {0.01, 0.001}) {
    const double unscaled = densities_at<T, Method>(g, 1, delta).second;
    for (double s : {1e-30, 1e-20, 1e-10, 1e10, 1e20, 1e30}) {
      // Not a structured binding: clang 14 cannot capture one in INFO.
      const auto measured = densities_at<T, Method>(g, s, delta);
      const double cpu = measured.first, serial = measured.second;
      INFO(what, " at delta ", delta, " scaled by ", s, ": cpu ", cpu, ", serial ", serial, ", unscaled ", unscaled);
      // Sums in another order move the threshold by a few ulps: the counts agree to 0.5%.
      CHECK(std::fabs(cpu / serial - 1) <= 0.005);
      // Scaling changes the values' rounding, not the estimate: within 2% of the unscaled.
      CHECK(std::fabs(serial / unscaled - 1) <= 0.02);
    }
  }
}

}  // namespace

TEST_CASE("property sweep: every method of the registry on adversarial inputs, float") { sweep_registry<float>(); }
TEST_CASE("property sweep: every method of the registry on adversarial inputs, double") { sweep_registry<double>(); }

TEST_CASE_TEMPLATE("every threshold method's cpu backend agrees with the serial oracle from 1e-30 to 1e30", T,
                   float, double) {
  methods::all::for_each([](auto entry) {
    using method = typename decltype(entry)::type;
    if constexpr (method::about.count == methods::count_promise::about_k) agree_at_extreme_scales<T, method>();
  });
}

TEST_CASE("a degenerate fit falls back to the radix threshold and says so") {
  // The original fit's exponential on integers in [-3, 3] at 1%: a NaN quantile before the
  // fallback, and nothing was selected. Now the values tied at the largest magnitude.
  std::vector<float> ints(7000);
  for (std::size_t i = 0; i < ints.size(); ++i) ints[i] = float(int(i % 7) - 3);
  sparse_vector<float> out;
  presets::sidco_e_paper<> paper;
  const auto report = paper.compress<float>(ints, 0.01, out);
  CHECK(report.fallback);
  CHECK(report.threshold == doctest::Approx(3).epsilon(1e-6));
  CHECK(report.threshold < 3);
  CHECK(out.size() == 2000);  // every 3 and -3
  // A fit that works does not fall back.
  const auto g = test::load_gradient("ffn_it200.npy");
  presets::sidco_e<> e;
  CHECK_FALSE(e.compress<float>(g, 0.01, out).fallback);
  // Under error feedback, a fit that degenerates every call still sends: the residual
  // does not grow without bound.
  std::vector<float> ties(6000);
  for (std::size_t i = 0; i < ties.size(); ++i) ties[i] = float(int(i % 3) - 1);
  presets::gaussian_k<> gk;
  feedback::residual<float> residual(ties.size());
  for (int call = 0; call < 5; ++call) {
    const auto r = gk.compress<float>(ties, 0.1, out, residual);
    CHECK(r.selected > 0);
  }
  float largest = 0;
  for (float x : residual.values()) largest = std::max(largest, std::fabs(x));
  CHECK(largest <= 2.0f);
}

TEST_CASE_TEMPLATE("all-zero input: threshold methods send nothing, exact-count methods send k zeros", T,
                   float, double) {
  const std::vector<T> g(1000, T(0));
  auto threshold_method = [&](auto c, std::string_view method) {
    const std::string what(method);
    INFO(what);
    sparse_vector<T> out;
    const auto r = c.template compress<T>(g, 0.01, out);
    CHECK(out.empty());
    CHECK(r.threshold == 0);
  };
  auto counted = [&](auto c, std::string_view method) {
    const std::string what(method);
    INFO(what);
    sparse_vector<T> out;
    c.template compress<T>(g, 0.01, out);
    CHECK(out.size() == 10);
    for (std::size_t j = 0; j < out.size(); ++j) CHECK(out.values()[j] == T(0));
  };
  methods::all::for_each([&](auto entry) {
    using method = typename decltype(entry)::type;
    if constexpr (method::about.exact_count())
      counted(methods::compressor_of<method>{}, method::about.name);
    else
      threshold_method(methods::compressor_of<method>{}, method::about.name);
  });
}

}  // namespace property_test
