#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <string_view>
#include <thread>
#include <type_traits>
#include <vector>

#include "doctest.hpp"
#include <sidco/comm/reduce/core.hpp>
#include <sidco/sidco.hpp>

#include "support.hpp"

// Named after the file: the test programs compile several test files as one unit.
namespace compressor_test {

using namespace sidco;

namespace {

// Laplace-like values with a share of exact zeros, as real gradients have.
template <class T>
std::vector<T> synthetic_gradient(std::size_t n, double zero_share, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::exponential_distribution<double> magnitude(1000.0);
  std::uniform_real_distribution<double> u(0, 1);
  std::vector<T> g(n);
  for (auto& v : g) v = u(rng) < zero_share ? T(0) : T((u(rng) < 0.5 ? -1 : 1) * magnitude(rng));
  return g;
}

// The output is exactly {(i, x_i) : |x_i| > threshold} in ascending order.
template <class T, class Index>
void check_selection_exact(std::span<const T> x, const sparse_vector<T, Index>& out,
                           const compress_report& report) {
  REQUIRE(out.dense_size() == x.size());
  std::size_t next = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    if (std::fabs(double(x[i])) > report.threshold) {
      REQUIRE(next < out.size());
      REQUIRE(out.indices()[next] == i);
      REQUIRE(out.values()[next] == x[i]);
      ++next;
    }
  }
  CHECK(next == out.size());
  CHECK(report.selected == out.size());
  CHECK(report.density == doctest::Approx(double(out.size()) / double(x.size())));
}

}  // namespace

// sidco_with's defaults make SIDCo-E: the tail fitted with the first stage's model, adaptive
// stages, the zero-aware fit, the threshold selection, the CPU backend.
static_assert(std::is_same_v<presets::sidco_with<models::exponential>, presets::sidco_e<>>);
static_assert(std::is_same_v<presets::sidco_with<models::generalized_pareto>, presets::sidco_gp<>>);

TEST_CASE_TEMPLATE("compress keeps exactly the values above its threshold", T, float, double) {
  const auto g = synthetic_gradient<T>(100003, 0.3, 11);
  for (double delta : {0.5, 0.1, 0.01, 0.001}) {
    presets::sidco_e<> e;
    presets::sidco_gamma_gp<> ggp;
    sparse_vector<T> out;
    auto r = e.template compress<T>(g, delta, out);
    check_selection_exact<T>(g, out, r);
    r = ggp.template compress<T>(g, delta, out);
    check_selection_exact<T>(g, out, r);
    CHECK(r.zeros == test::count_above<T>(g, -1) - test::count_above<T>(g, 0));
  }
}

TEST_CASE_TEMPLATE("zero-aware fitting hits the target where the plain fit misses", T, float,
                   double) {
  // 40% exact zeros among exponential magnitudes: the single-stage exponential fit is exact
  // for the non-zeros, so any miss comes from how the zeros are treated.
  const auto g = synthetic_gradient<T>(1000000, 0.4, 5);
  for (double delta : {0.1, 0.01, 0.001}) {
    sparse_vector<T> out;
    presets::sidco_with<models::exponential, models::exponential, stages::single, fit::zero_aware,
                        select::above_threshold, backend::serial>
        aware;
    presets::sidco_with<models::exponential, models::exponential, stages::single, fit::paper,
                        select::above_threshold, backend::serial>
        plain;
    const double aware_ratio = aware.template compress<T>(g, delta, out).density_ratio();
    const double plain_ratio = plain.template compress<T>(g, delta, out).density_ratio();
    INFO("delta = ", delta, ": zero-aware ", aware_ratio, ", plain ", plain_ratio);
    CHECK(aware_ratio == doctest::Approx(1.0).epsilon(0.05));
    // The zeros pull the plain fit's mean down, so its threshold is too low: 1.5x at 0.1,
    // 3.8x at 0.01, 9.7x at 0.001 with this seed.
    CHECK(plain_ratio > 1.4);
  }
}

TEST_CASE("multi-stage SIDCo on every real gradient file lands near the target") {
  // First call, no adaptation yet: within [0.5, 2] for every preset, file and density.
  // The generalized-Pareto presets are within [0.8, 1.25] except where the model does not
  // fit: cnn_it10 at 0.001 (excesses heavier than any moment-fitted GP: 0.63) and, for
  // Gamma-GP, lstm_it10 at 0.1 (stage 1 fits a gamma to a mixture of 11 layers: 0.77).
  for (const auto& file : test::gradient_files()) {
    const auto g = test::load_gradient(file);
    for (double delta : {0.1, 0.01, 0.001}) {
      sparse_vector<float> out;
      presets::sidco_e<> e;
      presets::sidco_gp<> gp;
      presets::sidco_gamma_gp<> ggp;
      const auto re = e.compress<float>(g, delta, out);
      const auto rgp = gp.compress<float>(g, delta, out);
      const auto rggp = ggp.compress<float>(g, delta, out);
      INFO(file, " at ", delta, ": E ", re.density_ratio(), ", GP ", rgp.density_ratio(),
           ", Gamma-GP ", rggp.density_ratio());
      for (const auto& r : {re, rgp, rggp}) {
        CHECK(r.stages >= 1);
        CHECK(r.density_ratio() >= 0.5);
        CHECK(r.density_ratio() <= 2.0);
      }
      const bool gp_misfit = file == "cnn_it10.npy" && delta == 0.001;
      if (!gp_misfit) {
        CHECK(rgp.density_ratio() >= 0.8);
        CHECK(rgp.density_ratio() <= 1.25);
        if (!(file == "lstm_it10.npy" && delta == 0.1)) {
          CHECK(rggp.density_ratio() >= 0.8);
          CHECK(rggp.density_ratio() <= 1.25);
        }
      }
    }
  }
}

TEST_CASE("adaptive stages bring SIDCo-E into [0.8, 1.25] on every real gradient file") {
  // 40 calls on the same gradient; the mean ratio of the last 20 is what a user sees once
  // the controller has settled.
  for (const auto& file : test::gradient_files()) {
    const auto g = test::load_gradient(file);
    for (double delta : {0.1, 0.01, 0.001}) {
      presets::sidco_e<> e;
      sparse_vector<float> out;
      double sum = 0;
      for (int call = 0; call < 40; ++call) {
        const double ratio = e.compress<float>(g, delta, out).density_ratio();
        if (call >= 20) sum += ratio;
      }
      INFO(file, " at ", delta, ": mean ratio ", sum / 20, ", stages ",
           e.estimator().stage_policy_state().current());
      CHECK(sum / 20 >= 0.8);
      CHECK(sum / 20 <= 1.25);
    }
  }
}

TEST_CASE("the original SIDCo fit misses badly on the LSTM gradient; ours does not") {
  // The reason fit::zero_aware is the default: 39% zeros and a mixture of layers.
  const auto g = test::load_gradient("lstm_it10.npy");
  sparse_vector<float> out;
  presets::sidco_e_paper<> paper;
  presets::sidco_e<> ours;
  const double paper_ratio = paper.compress<float>(g, 0.01, out).density_ratio();
  const double our_ratio = ours.compress<float>(g, 0.01, out).density_ratio();
  INFO("paper ", paper_ratio, ", ours ", our_ratio);
  CHECK(paper_ratio < 0.2);
  CHECK(our_ratio > 0.8);
}

TEST_CASE("fixed stage counts are honoured and more stages refine the single-stage fit") {
  const auto g = test::load_gradient("ffn_it200.npy");
  sparse_vector<float> out;
  presets::sidco_with<models::exponential, models::exponential, stages::fixed<4>, fit::zero_aware,
                      select::above_threshold, backend::serial>
      four;
  presets::sidco_e_single<> one;
  const auto r4 = four.compress<float>(g, 0.001, out);
  const auto r1 = one.compress<float>(g, 0.001, out);
  CHECK(r4.stages == 4);
  CHECK(r1.stages == 1);
  CHECK(std::fabs(std::log(r4.density_ratio())) < std::fabs(std::log(r1.density_ratio())));
}

namespace {
// backend::cpu that counts its passes over the source, and the probes the moments pass takes.
struct counting_cpu : backend::cpu {
  int moments_passes = 0, probes = 0, tail_passes = 0;
  template <class Stats, class Source>
  void analyze(const Source& source, std::span<const segment> layout, std::span<const double> p,
               std::span<moments> out) {
    ++moments_passes;
    probes += int(p.size());
    backend::cpu::analyze<Stats>(source, layout, p, out);
  }
  template <bool Log, class Source>
  moments tail(const Source& source, double t) {
    ++tail_passes;
    return backend::cpu::tail<Log>(source, t);
  }
};
}  // namespace

TEST_CASE("from the second call, the moments pass measures the tail the last stage fits") {
  for (const auto& file : {"lstm_it10.npy", "cnn_it200.npy", "ffn_it200.npy"}) {
    INFO(file);
    const auto g = test::load_gradient(file);
    presets::sidco_with<models::exponential, models::exponential, stages::fixed<3>, fit::zero_aware,
                        select::above_threshold, counting_cpu>
        c;
    sparse_vector<float> first, second;
    const auto r1 = c.compress<float>(g, 0.001, first);
    const auto& b = c.backend();
    // First call: the moments pass, then one pass per stage before the last.
    CHECK(b.moments_passes == 1);
    CHECK(b.probes == 0);
    CHECK(b.tail_passes == 2);
    CHECK(r1.passes == 2);
    // Same input again: one moments pass with one probe, at the measured point nearest
    // where the last stage starts, and no pass of its own; the last stage fits from the
    // probe and delivers as well as the first call did.
    const auto r2 = c.compress<float>(g, 0.001, second);
    CHECK(b.moments_passes == 2);
    CHECK(b.probes == 1);
    CHECK(b.tail_passes == 2);
    CHECK(r2.passes == 0);
    INFO("first call ", r1.density_ratio(), ", second ", r2.density_ratio());
    // Whole vector and fixed stages: no closed loop, so within 25% of the first call (whose
    // ratio on these files is 0.70-1.37).
    CHECK(std::fabs(std::log(r2.density_ratio() / r1.density_ratio())) <= std::log(1.25));
    check_selection_exact<float>(g, second, r2);
    // And so on, call after call, on the same input.
    for (int call = 0; call < 5; ++call) CHECK(c.compress<float>(g, 0.001, second).passes == 0);
    CHECK(b.tail_passes == 2);
    CHECK(c.workspace_bytes() < g.size() * sizeof(float) / 100);
  }
}

TEST_CASE("adaptive stage controller moves within [1, ceil(log2(1/delta))]") {
  CHECK(stages::max_for(0.1) == 4);
  CHECK(stages::max_for(0.01) == 7);
  CHECK(stages::max_for(0.001) == 10);
  CHECK(stages::max_for(0.5) == 1);
  CHECK(stages::max_for(1.0) == 1);
  CHECK(stages::max_for(1e-300) == 64);
  CHECK(stages::max_for(std::numeric_limits<double>::denorm_min()) == 64);
  // Without the density correction, the window's mean ratio moves the count.
  stages::adaptive a({.initial = 2, .period = 2, .gain = 0});
  CHECK(a.count(0.01) == 2);
  CHECK(a.aim(0.01) == 0.01);
  a.observe(1.6, 0.01);
  a.observe(1.4, 0.01);  // mean 1.5 > 1.25: one more stage
  CHECK(a.count(0.01) == 3);
  a.observe(0.5, 0.01);
  a.observe(0.6, 0.01);  // mean 0.55 < 0.8: one more stage
  CHECK(a.count(0.01) == 4);
  a.observe(1.15, 0.01);
  a.observe(1.05, 0.01);  // mean 1.1: inside the band: stay
  CHECK(a.count(0.01) == 4);
  for (int i = 0; i < 40; ++i) a.observe(3.0, 0.01);
  CHECK(a.count(0.01) == 7);   // capped at max_for(0.01)
  CHECK(a.count(0.1) == 4);    // and at a larger density's cap
  CHECK(a.aim(0.01) == 0.01);  // no correction without gain
  CHECK_THROWS_AS(stages::adaptive({.period = 0}), sidco::error);
  CHECK_THROWS_AS(stages::adaptive({.low = 1.1}), sidco::error);
  CHECK_THROWS_AS(stages::adaptive({.gain = 1.5}), sidco::error);
  CHECK_THROWS_AS(stages::adaptive({.max_correction = 0.5}), sidco::error);
}

TEST_CASE("adaptive stages correct the aimed density by integral control, bounded") {
  stages::adaptive a({.initial = 3, .period = 1000, .gain = 0.5});
  a.observe(2.0, 0.01);  // twice the target: aim lower by 2^-0.5
  CHECK(a.correction() == doctest::Approx(std::pow(2.0, -0.5)));
  CHECK(a.aim(0.01) == doctest::Approx(0.01 * std::pow(2.0, -0.5)));
  a.observe(0.5, 0.01);  // half the target: back up
  CHECK(a.correction() == doctest::Approx(1.0));
  for (int i = 0; i < 50; ++i) a.observe(0.0, 0.01);  // nothing kept, call after call
  CHECK(a.correction() == doctest::Approx(4.0));        // bounded
  CHECK(a.aim(0.5) == 1.0);                             // and never above 1
  // A model that misses by more than the band on its own gets one more stage per window.
  stages::adaptive b({.initial = 2, .period = 5, .gain = 0.5});
  for (int i = 0; i < 5; ++i) b.observe(0.6, 0.01);
  CHECK(b.count(0.01) == 3);
}

TEST_CASE_TEMPLATE("error feedback loses nothing over many steps", T, float, double) {
  const std::size_t n = 20000;
  feedback::residual<T> residual(n);
  presets::sidco_gp<> c;
  sparse_vector<T> out;
  std::vector<double> gradient_sum(n, 0), sent_sum(n, 0);
  for (int step = 0; step < 60; ++step) {
    const auto g = synthetic_gradient<T>(n, 0.3, 100 + step);
    const std::vector<T> before(residual.values().begin(), residual.values().end());
    c.template compress<T>(g, 0.01, out, residual);
    // Per element and exactly: sent + new residual = gradient + old residual.
    std::vector<T> sent(n, T(0));
    for (std::size_t j = 0; j < out.size(); ++j) sent[out.indices()[j]] = out.values()[j];
    for (std::size_t i = 0; i < n; ++i) {
      REQUIRE(sent[i] + residual.values()[i] == T(g[i] + before[i]));
      if (sent[i] != T(0)) REQUIRE(residual.values()[i] == T(0));
      gradient_sum[i] += double(g[i]);
      sent_sum[i] += double(sent[i]);
    }
  }
  // Over all steps: everything sent plus the final residual is the sum of all gradients, to
  // the rounding of 60 float additions.
  const double tolerance = std::is_same_v<T, float> ? 1e-5 : 1e-13;
  for (std::size_t i = 0; i < n; ++i) {
    const double total = sent_sum[i] + double(residual.values()[i]);
    REQUIRE(std::fabs(total - gradient_sum[i]) <= tolerance * (std::fabs(gradient_sum[i]) + 1e-3));
  }
}

TEST_CASE_TEMPLATE("an all-zero gradient gives an empty selection, not an error", T, float,
                   double) {
  const std::vector<T> g(1000, T(0));
  feedback::residual<T> residual(g.size());
  sparse_vector<T> out;
  presets::sidco_gamma_gp<> c;
  const auto r = c.template compress<T>(g, 0.01, out, residual);
  CHECK(out.empty());
  CHECK(r.selected == 0);
  CHECK(r.zeros == 1000);
  CHECK(std::all_of(residual.values().begin(), residual.values().end(),
                    [](T v) { return v == T(0); }));
}

TEST_CASE("density 1 keeps every non-zero; a constant vector is kept whole") {
  const std::vector<float> g = {0.f, 1.f, -2.f, 0.f, 3.f};
  sparse_vector<float> out;
  presets::sidco_e<> c;
  c.compress<float>(g, 1.0, out);
  CHECK(out.size() == 3);
  const std::vector<float> constant(100, -0.5f);
  const auto r = c.compress<float>(constant, 0.01, out);
  CHECK(out.size() == 100);  // no threshold splits ties; the report shows the overshoot
  CHECK(r.density_ratio() == doctest::Approx(100.0));
}

namespace {
template <class Compressor, class T>
void check_bad_input() {
  auto g = synthetic_gradient<T>(1000, 0.2, 3);
  Compressor c;
  sparse_vector<T> out;
  feedback::residual<T> residual(g.size());
  c.template compress<T>(g, 0.1, out, residual);  // some state to keep
  const std::vector<std::uint32_t> out_indices(out.indices().begin(), out.indices().end());
  const std::vector<T> saved(residual.values().begin(), residual.values().end());
  auto unchanged = [&] {
    CHECK(std::equal(out_indices.begin(), out_indices.end(), out.indices().begin(),
                     out.indices().end()));
    CHECK(std::equal(saved.begin(), saved.end(), residual.values().begin()));
  };
  auto message_of = [&](auto&& call) -> std::string {
    try {
      call();
    } catch (const sidco::error& e) {
      return e.what();
    }
    return "(no error)";
  };

  for (double delta : {0.0, -0.1, 1.5, std::numeric_limits<double>::quiet_NaN(),
                       std::numeric_limits<double>::infinity()}) {
    const auto m = message_of([&] { c.template compress<T>(g, delta, out, residual); });
    INFO(m);
    CHECK(m.find("delta = ") != std::string::npos);
    CHECK(m.find("outside (0, 1]") != std::string::npos);
    unchanged();
  }

  const std::vector<T> empty;
  CHECK(message_of([&] { c.template compress<T>(empty, 0.1, out); }).find("gradient is empty") !=
        std::string::npos);
  unchanged();

  feedback::residual<T> short_residual(10);
  const auto mismatch = message_of([&] { c.template compress<T>(g, 0.1, out, short_residual); });
  CHECK(mismatch.find("residual: size 10 does not match gradient size 1000") != std::string::npos);
  unchanged();

  for (T bad : {std::numeric_limits<T>::quiet_NaN(), std::numeric_limits<T>::infinity(),
                -std::numeric_limits<T>::infinity()}) {
    auto poisoned = g;
    poisoned[417] = bad;
    const auto m = message_of([&] { c.template compress<T>(poisoned, 0.1, out, residual); });
    INFO(m);
    CHECK(m.find("gradient + residual contains 1 non-finite value(s)") != std::string::npos);
    CHECK(m.find("at index 417") != std::string::npos);
    unchanged();
    const auto plain = message_of([&] { c.template compress<T>(poisoned, 0.1, out); });
    CHECK(plain.find("gradient contains 1 non-finite") != std::string::npos);
    unchanged();
  }

  // A NaN that entered the residual is caught the same way.
  feedback::residual<T> poisoned_residual(g.size());
  poisoned_residual.values()[3] = std::numeric_limits<T>::quiet_NaN();
  CHECK(message_of([&] { c.template compress<T>(g, 0.1, out, poisoned_residual); })
            .find("at index 3") != std::string::npos);
  CHECK(std::isnan(poisoned_residual.values()[3]));
  unchanged();
}
}  // namespace

// Through both input checks: the moments pass (SIDCo) and Top-k's coarse histograms.
TEST_CASE_TEMPLATE("bad input throws sidco::error naming the argument and changes nothing", T,
                   float, double) {
  check_bad_input<presets::sidco_e<>, T>();
  check_bad_input<presets::top_k<>, T>();
}

TEST_CASE("a gradient longer than 32-bit indices address is refused before it is read") {
  const std::vector<float> small(16, 1.f);
  // Never dereferenced: the size check comes first.
  const std::span<const float> huge(small.data(), (std::size_t(1) << 32) + 1);
  presets::sidco_e<> c;
  sparse_vector<float> out;
  try {
    c.compress<float>(huge, 0.01, out);
    FAIL("no error");
  } catch (const sidco::error& e) {
    CHECK(std::string(e.what()).find("32-bit index range") != std::string::npos);
  }
  sparse_vector<float, std::uint64_t> wide;
  CHECK(wide.max_dense_size > (std::size_t(1) << 32));
}

TEST_CASE("64-bit indices select the same entries as 32-bit ones") {
  const auto g = test::load_gradient("cnn_it200.npy");
  presets::sidco_gp<> a, b;
  sparse_vector<float> narrow;
  sparse_vector<float, std::uint64_t> wide;
  a.compress<float>(g, 0.01, narrow);
  b.compress<float>(g, 0.01, wide);
  REQUIRE(narrow.size() == wide.size());
  for (std::size_t i = 0; i < narrow.size(); ++i) {
    CHECK(narrow.indices()[i] == wide.indices()[i]);
    CHECK(narrow.values()[i] == wide.values()[i]);
  }
}

TEST_CASE("one compressor serves one thread at a time: a concurrent call throws, in every build") {
  detail::single_user user;
  {
    const detail::single_user::scope first(user, "thing");
    const auto second = [&] { const detail::single_user::scope again(user, "thing"); };
    CHECK_THROWS_WITH_AS(second(),
                         doctest::Contains("thing: called from two threads at once"), sidco::error);
  }
  { const detail::single_user::scope again(user, "thing"); }  // released, and a copy starts free
  const detail::single_user copy = user;
  (void)copy;

  // Two threads on one compressor: some call is refused, and every call that ran returned a
  // well-formed selection (it held the compressor alone). Each call takes milliseconds, so
  // 200 rounds overlap on any scheduler.
  const auto g = test::load_gradient("lstm_it10.npy");
  presets::sidco_e<backend::serial> shared;
  std::atomic<int> refused{0}, malformed{0};
  auto hammer = [&] {
    sparse_vector<float> out;
    for (int round = 0; round < 200 && refused.load() == 0; ++round) {
      try {
        shared.compress<float>(g, 0.01, out);
        if (!std::is_sorted(out.indices().begin(), out.indices().end()) || out.size() == 0) ++malformed;
      } catch (const sidco::error& e) {
        if (std::string(e.what()).find("compressor::compress: called from two threads at once") != std::string::npos)
          ++refused;
        else
          ++malformed;
      }
    }
  };
  std::thread other(hammer);
  hammer();
  other.join();
  CHECK(refused.load() > 0);
  CHECK(malformed.load() == 0);
}

// compressor's saved state after `steps` calls on g at density.
template <class Compressor>
std::vector<std::byte> state_after(Compressor& compressor, const std::vector<float>& g, double density, int steps) {
  sparse_vector<float> out;
  for (int step = 0; step < steps; ++step) compressor.template compress<float>(g, density, out);
  return saved_state(compressor);
}

// original and resumed give the same indices and values for `steps` more calls on g.
template <class Compressor>
void check_same_calls(Compressor& original, Compressor& resumed, const std::vector<float>& g, double density,
                      int steps) {
  sparse_vector<float> out, again;
  for (int step = 0; step < steps; ++step) {
    original.template compress<float>(g, density, out);
    resumed.template compress<float>(g, density, again);
    CHECK(std::equal(out.indices().begin(), out.indices().end(), again.indices().begin(), again.indices().end()));
    CHECK(std::equal(out.values().begin(), out.values().end(), again.values().begin(), again.values().end()));
  }
}

TEST_CASE("a state written under the old underscore policy names loads, another policy's does not") {
  // Policy names took the registry's hyphens (above-threshold, generalized-pareto); a
  // checkpoint written before that spells them with underscores, at the same length.
  const auto g = synthetic_gradient<float>(1 << 15, 0.3, 11);
  presets::sidco_gp<backend::serial> original;
  const std::vector<std::byte> bytes = state_after(original, g, 0.01, 3);
  const auto spell_with = [&](std::vector<std::byte> from, std::string_view hyphens, char separator) {
    std::string text(reinterpret_cast<const char*>(from.data()), from.size());
    const auto at = text.find(hyphens);
    REQUIRE(at != std::string::npos);
    for (std::size_t i = at; i < at + hyphens.size(); ++i)
      if (text[i] == '-') from[i] = std::byte(separator);
    return from;
  };
  std::vector<std::byte> legacy = spell_with(bytes, "generalized-pareto", '_');
  legacy = spell_with(legacy, "above-threshold", '_');
  presets::sidco_gp<backend::serial> resumed;
  state_reader reader(legacy);
  resumed.load_state(reader);
  check_same_calls(original, resumed, g, 0.01, 1);

  // Only '-' and '_' are interchangeable: another policy's name is still refused.
  std::vector<std::byte> other = bytes;
  std::string text(reinterpret_cast<const char*>(other.data()), other.size());
  const auto at = text.find("above-threshold");
  REQUIRE(at != std::string::npos);
  other[at] = std::byte('b');
  presets::sidco_gp<backend::serial> refused;
  state_reader wrong(other);
  CHECK_THROWS_WITH_AS(refused.load_state(wrong), doctest::Contains("'bbove-threshold' where 'above-threshold'"),
                       sidco::error);
}

TEST_CASE("a damaged state's names are refused with a message that is valid UTF-8, at most 64 bytes of them") {
  // A checkpoint is a file: a name may hold any bytes. Python makes an exception whose
  // message is not UTF-8 into an empty one, so the message shows them as U+FFFD.
  const auto g = synthetic_gradient<float>(1 << 12, 0.3, 11);
  presets::sidco_e<backend::serial> original;
  const std::vector<std::byte> bytes = state_after(original, g, 0.01, 2);
  const auto refusal = [](const std::vector<std::byte>& state) {
    presets::sidco_e<backend::serial> target;
    state_reader in(state);
    try {
      target.load_state(in);
    } catch (const sidco::error& e) {
      return std::string(e.what());
    }
    return std::string("loaded");
  };
  std::vector<std::byte> garbled = bytes;
  REQUIRE(std::string(reinterpret_cast<const char*>(garbled.data()) + 8, 16) == "sidco.compressor");
  garbled[8 + 2] = std::byte{0xFF};  // not UTF-8
  garbled[8 + 5] = std::byte{0x01};  // a control character
  const std::string message = refusal(garbled);
  CHECK(detail::valid_utf8(message) == message);
  CHECK_MESSAGE(message.find("holds 'si\xEF\xBF\xBD" "co\xEF\xBF\xBD" "compressor' where 'sidco.compressor' was expected") !=
                    std::string::npos,
                message);
  // A name's length damaged to run over the rest of the state: 64 bytes of it, then "...".
  std::vector<std::byte> long_name = bytes;
  const std::uint64_t length = bytes.size() - 8;
  for (int b = 0; b < 8; ++b) long_name[std::size_t(b)] = std::byte(length >> (8 * b));
  const std::string cut = refusal(long_name);
  CHECK(detail::valid_utf8(cut) == cut);
  const auto quoted = cut.find("holds '");
  REQUIRE(quoted != std::string::npos);
  const auto end = cut.find("...' where 'sidco.compressor'", quoted);
  REQUIRE_MESSAGE(end != std::string::npos, cut);
  // Each byte shown is one character (U+FFFD where it is not text): at most 64 of them.
  const std::string shown = cut.substr(quoted + 7, end - (quoted + 7));
  CHECK(std::count_if(shown.begin(), shown.end(), [](char c) { return (static_cast<unsigned char>(c) & 0xC0) != 0x80; }) <=
        64);

  // The reduce exchange's state: its format's name and its owner's.
  const std::vector<segment> layout{{0, g.size()}};
  comm::reduce_core<float, std::uint32_t, comm::owner_top_k> core(layout, 0.01, 2, 0);
  std::vector<std::byte> exchange = saved_state(core);
  exchange[8] = std::byte{0xC3};  // a two-byte sequence cut short
  try {
    comm::read_reduce_state_info(exchange);
    FAIL("a damaged exchange state was read");
  } catch (const sidco::error& e) {
    const std::string text = e.what();
    CHECK(detail::valid_utf8(text) == text);
    CHECK_MESSAGE(text.find("where a reduce exchange's state was expected") != std::string::npos, text);
  }
}

TEST_CASE("load_whole_state: a state with bytes after it is refused, and the compressor keeps its own") {
  // load_state and then state_reader::finish() would refuse it too, but only after the state
  // had been loaded; the compressor copies, so load_whole_state loads into a copy.
  const auto g = synthetic_gradient<float>(1 << 12, 0.3, 11);
  presets::sidco_e<backend::serial> source, target;
  const std::vector<std::byte> saved = state_after(source, g, 0.01, 3), own = state_after(target, g, 0.1, 1);
  REQUIRE(saved != own);
  std::vector<std::byte> longer = saved;
  longer.push_back(std::byte{0});
  CHECK_THROWS_WITH_AS(load_whole_state(target, longer), doctest::Contains("1 bytes left over"), sidco::error);
  CHECK(saved_state(target) == own);
  std::vector<std::byte> cut(saved.begin(), saved.end() - 1);
  CHECK_THROWS_WITH_AS(load_whole_state(target, cut), doctest::Contains("ends before"), sidco::error);
  CHECK(saved_state(target) == own);
  load_whole_state(target, saved);
  CHECK(saved_state(target) == saved);
}

TEST_CASE("a state saved before the estimator kept the last call's mean loads and resumes") {
  // The statistical estimator saves the last call's mean |x| after its last threshold (the
  // base's drift over values that move only with the gradient); states saved before that
  // field end the estimator's part at the threshold. Over the same values the mean does not
  // move, so a compressor resumed from such a state gives the uninterrupted one's bits.
  const auto g = synthetic_gradient<float>(1 << 15, 0.3, 12);
  presets::sidco_e<backend::serial> original;
  const std::vector<std::byte> bytes = state_after(original, g, 0.001, 3);
  const std::string text(reinterpret_cast<const char*>(bytes.data()), bytes.size());
  const auto name = text.find("last-mean");
  REQUIRE(name != std::string::npos);
  REQUIRE(text.find("last-mean", name + 1) == std::string::npos);
  // The field: its name's length (8 bytes), the name, the mean (8 bytes).
  std::vector<std::byte> legacy(bytes.begin(), bytes.begin() + std::ptrdiff_t(name - 8));
  legacy.insert(legacy.end(), bytes.begin() + std::ptrdiff_t(name + 9 + 8), bytes.end());
  presets::sidco_e<backend::serial> resumed;
  state_reader reader(legacy);
  resumed.load_state(reader);
  reader.finish();
  check_same_calls(original, resumed, g, 0.001, 3);

  // A mean that is no mean is refused, naming the field.
  std::vector<std::byte> broken = bytes;
  const double nan = std::nan("");
  std::memcpy(broken.data() + name + 9, &nan, 8);
  presets::sidco_e<backend::serial> refused;
  state_reader wrong(broken);
  CHECK_THROWS_WITH_AS(refused.load_state(wrong), doctest::Contains("last mean = nan"), sidco::error);
}

}  // namespace compressor_test
