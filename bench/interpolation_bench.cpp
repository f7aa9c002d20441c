// Google Benchmark suite for the estimator's last-stage interpolation models (the values
// between two measured tail points): the truncated exponential from their mean and the
// truncated log-quadratic from their mean and mean square, each fitted and asked for one
// quantile, against their baseline in the same run: one SIDCo-E compress of the smallest
// bracket the two-moment model is used on (statistical's two_moment_inside, 8,192 values).
//
//   fit_us              one fit and its quantile
//   fit_over_compress   that over the compress (median of 9 calls, same run): the share of
//                       a call the model adds where the estimator uses it
//
// The moments come from brackets over half-normal bulks of 64 shapes (the density falling by
// e^0.5 to e^12 across the bracket), so the solvers see the spread of starts they meet.
//
//   build/bench/sidco-interpolation-bench
#include <algorithm>
#include <chrono>
#include <cmath>
#include <random>
#include <span>
#include <vector>

#include <benchmark/benchmark.h>
#include <sidco/models/truncated_exponential.hpp>
#include <sidco/models/truncated_log_quadratic.hpp>
#include <sidco/sidco.hpp>

namespace {

struct bracket_moments {
  double mean, mean_square;
};

// Half-normal values of scale 1 on [0, width], widths 1..4.9: their mean and mean square.
std::vector<bracket_moments> brackets() {
  std::vector<bracket_moments> out;
  std::mt19937_64 rng(3);
  std::normal_distribution<double> draw(0.0, 1.0);
  for (int shape = 0; shape < 64; ++shape) {
    const double width = 1.0 + 3.9 * shape / 63;
    double n = 0, sum = 0, sum_sq = 0;
    while (n < 20000) {
      const double a = std::fabs(draw(rng));
      if (a > width) continue;
      ++n;
      sum += a / width;
      sum_sq += (a / width) * (a / width);
    }
    out.push_back({sum / n, sum_sq / n});
  }
  return out;
}

// Median seconds of one SIDCo-E compress at delta = 0.01 of 8,192 Laplace values.
double compress_seconds() {
  std::mt19937_64 rng(9);
  std::exponential_distribution<float> draw(1.0f);
  std::vector<float> g(8192);
  for (float& v : g) v = (rng() & 1 ? 1.0f : -1.0f) * draw(rng);
  sidco::presets::sidco_e<> compressor;
  sidco::sparse_vector<float, std::uint32_t> out;
  std::vector<double> times;
  for (int call = 0; call < 9; ++call) {
    const auto start = std::chrono::steady_clock::now();
    compressor.compress(std::span<const float>(g), 0.01, out);
    times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  std::nth_element(times.begin(), times.begin() + 4, times.end());
  return times[4];
}

template <class Fit>
void run(benchmark::State& state, Fit fit) {
  const auto cases = brackets();
  const double compress = compress_seconds();
  std::size_t i = 0;
  const auto start = std::chrono::steady_clock::now();
  for (auto _ : state) {
    benchmark::DoNotOptimize(fit(cases[i]));
    i = (i + 1) % cases.size();
  }
  const double per_fit =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / double(state.iterations());
  state.counters["fit_us"] = per_fit * 1e6;
  state.counters["fit_over_compress"] = per_fit / compress;
}

void one_moment(benchmark::State& state) {
  run(state, [](const bracket_moments& m) {
    return sidco::models::truncated_exponential::with_mean(m.mean, 1.0).upper_quantile(0.3);
  });
}

void two_moments(benchmark::State& state) {
  run(state, [](const bracket_moments& m) {
    const auto model = sidco::models::truncated_log_quadratic::with_moments(m.mean, m.mean_square, 1.0);
    return model ? model->upper_quantile(0.3) : -1.0;
  });
}

}  // namespace

BENCHMARK(one_moment);
BENCHMARK(two_moments);
BENCHMARK_MAIN();
