// Google Benchmark suite: SIDCo presets next to the baselines measured in the same run.
// Counters: achieved density, and time relative to a streaming read of the same input
// (the bandwidth ceiling) — see bench/README.md.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include <benchmark/benchmark.h>
#include <sidco/sidco.hpp>

#ifndef SIDCO_GRADIENTS_DIR
#error "SIDCO_GRADIENTS_DIR is set by bench/meson.build"
#endif

namespace {

// Normal values with 30% exact zeros, the shape of a real ReLU network's gradient.
const std::vector<float>& synthetic(std::size_t n) {
  static std::vector<std::vector<float>> cache(40);
  const int log2n = int(std::log2(double(n)));
  auto& g = cache[std::size_t(log2n)];
  if (g.size() != n) {
    std::mt19937_64 rng(42);
    std::normal_distribution<float> normal(0.f, 1e-3f);
    std::uniform_real_distribution<float> u(0.f, 1.f);
    g.resize(n);
    for (auto& v : g) v = u(rng) < 0.3f ? 0.f : normal(rng);
  }
  return g;
}

const std::vector<float>& lstm() {
  static const auto g = sidco::io::load_npy<float>(SIDCO_GRADIENTS_DIR "/lstm_it10.npy");
  return g;
}

const std::vector<float>& input(int which, std::size_t n) {
  return which == 0 ? synthetic(n) : lstm();
}

double density_of(benchmark::State& state) { return 1.0 / double(state.range(2)); }

void set_bytes(benchmark::State& state, std::size_t n) {
  state.SetBytesProcessed(std::int64_t(state.iterations()) * std::int64_t(n * sizeof(float)));
}

// Baseline: the least any compressor must do, one read of every value.
void streaming_read(benchmark::State& state) {
  const auto& g = input(int(state.range(0)), std::size_t(1) << state.range(1));
  constexpr std::size_t lanes = 16;  // independent sums, so the compiler can vectorize
  for (auto _ : state) {
    float sums[lanes] = {};
    std::size_t i = 0;
    for (; i + lanes <= g.size(); i += lanes)
      for (std::size_t j = 0; j < lanes; ++j) sums[j] += std::fabs(g[i + j]);
    for (; i < g.size(); ++i) sums[0] += std::fabs(g[i]);
    benchmark::DoNotOptimize(sums);
  }
  set_bytes(state, g.size());
}

// Baseline: exact Top-k by std::nth_element on magnitudes.
void nth_element_top_k(benchmark::State& state) {
  const auto& g = input(int(state.range(0)), std::size_t(1) << state.range(1));
  const std::size_t k = std::max<std::size_t>(1, std::size_t(density_of(state) * double(g.size())));
  std::vector<float> magnitudes(g.size());
  for (auto _ : state) {
    std::transform(g.begin(), g.end(), magnitudes.begin(), [](float v) { return std::fabs(v); });
    std::nth_element(magnitudes.begin(), magnitudes.begin() + std::ptrdiff_t(k - 1),
                     magnitudes.end(), std::greater<float>());
    benchmark::DoNotOptimize(magnitudes[k - 1]);
  }
  set_bytes(state, g.size());
}

template <class Compressor, bool Feedback>
void compress(benchmark::State& state) {
  const auto& g = input(int(state.range(0)), std::size_t(1) << state.range(1));
  const double delta = density_of(state);
  Compressor c;
  sidco::sparse_vector<float> out;
  sidco::feedback::residual<float> residual(g.size());
  double achieved = 0;
  for (auto _ : state) {
    const auto report = Feedback ? c.template compress<float>(g, delta, out, residual)
                                 : c.template compress<float>(g, delta, out);
    achieved = report.density;
  }
  set_bytes(state, g.size());
  state.counters["density_ratio"] = achieved / delta;
}

// Arguments: input (0 synthetic, 1 the LSTM gradient), log2 N (synthetic only), 1/delta.
void arguments(benchmark::internal::Benchmark* b) {
  for (int inverse_density : {10, 100, 1000}) {
    for (int log2n : {20, 23}) b->Args({0, log2n, inverse_density});
    b->Args({1, 0, inverse_density});
  }
  b->Unit(benchmark::kMillisecond);
}

using namespace sidco::presets;
BENCHMARK(streaming_read)->Apply(arguments);
BENCHMARK(nth_element_top_k)->Apply(arguments);
BENCHMARK(compress<sidco_e_single<>, false>)->Name("sidco_e_single")->Apply(arguments);
BENCHMARK(compress<sidco_e<>, false>)->Name("sidco_e")->Apply(arguments);
BENCHMARK(compress<sidco_gp<>, false>)->Name("sidco_gp")->Apply(arguments);
BENCHMARK(compress<sidco_gamma_gp<>, false>)->Name("sidco_gamma_gp")->Apply(arguments);
BENCHMARK(compress<sidco_e<>, true>)->Name("sidco_e_feedback")->Apply(arguments);
BENCHMARK(compress<sidco_e_exact<>, false>)->Name("sidco_e_exact_k")->Apply(arguments);
BENCHMARK(compress<top_k<>, false>)->Name("top_k_radix")->Apply(arguments);
BENCHMARK(compress<dgc<>, false>)->Name("dgc")->Apply(arguments);
BENCHMARK(compress<gaussian_k<>, false>)->Name("gaussian_k")->Apply(arguments);
BENCHMARK(compress<redsync<>, false>)->Name("redsync")->Apply(arguments);
BENCHMARK(compress<random_k<>, false>)->Name("random_k")->Apply(arguments);

}  // namespace

BENCHMARK_MAIN();
