// Google Benchmark suite: every method next to the baselines, measured in the same run.
// Arguments: input / log2 N / 1/delta. Inputs: 0 normal and 1 Laplace values (30% exact
// zeros, N = 2^log2N), 2 the real LSTM gradient and 3 the real CNN gradient (N fixed).
// Counters: density_ratio (achieved / target), alloc_bytes (heap bytes a warm call
// allocates: 0 means the output and O(threads) scratch are all it uses), workspace_bytes
// (what the compressor keeps between calls). bench/report.py turns the JSON output into the
// ratio tables of bench/README.md.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <new>
#include <random>
#include <string>
#include <vector>

#include <benchmark/benchmark.h>
#include <sidco/sidco.hpp>

#ifndef SIDCO_GRADIENTS_DIR
#error "SIDCO_GRADIENTS_DIR is set by bench/meson.build"
#endif

namespace {
std::atomic<std::size_t> allocated_bytes{0};
}

// Counts heap bytes, so a benchmark can show what a compress call allocates. Not inlined:
// GCC would otherwise pair the inlined free() with other allocators and warn.
[[gnu::noinline]] void* operator new(std::size_t size) {
  allocated_bytes += size;
  if (void* p = std::malloc(size ? size : 1)) return p;
  throw std::bad_alloc();
}
[[gnu::noinline]] void operator delete(void* p) noexcept { std::free(p); }
[[gnu::noinline]] void operator delete(void* p, std::size_t) noexcept { std::free(p); }

namespace {

std::vector<float> synthetic(int kind, std::size_t n) {
  std::mt19937_64 rng(42 + std::uint64_t(kind));
  std::normal_distribution<float> normal(0.f, 1e-3f);
  std::exponential_distribution<float> exponential(1e3f);
  std::uniform_real_distribution<float> u(0.f, 1.f);
  std::vector<float> g(n);
  for (auto& v : g) {
    if (u(rng) < 0.3f)
      v = 0.f;
    else
      v = kind == 0 ? normal(rng) : (u(rng) < 0.5f ? -1.f : 1.f) * exponential(rng);
  }
  return g;
}

const std::vector<float>& input(const benchmark::State& state) {
  static std::vector<float> cache[4][32];
  const int kind = int(state.range(0));
  const int log2n = kind < 2 ? int(state.range(1)) : 0;
  auto& g = cache[kind][log2n];
  if (g.empty()) {
    if (kind < 2)
      g = synthetic(kind, std::size_t(1) << log2n);
    else
      g = sidco::io::load_npy<float>(std::string(SIDCO_GRADIENTS_DIR) +
                                     (kind == 2 ? "/lstm_it10.npy" : "/cnn_it200.npy"));
  }
  return g;
}

double density_of(const benchmark::State& state) { return 1.0 / double(state.range(2)); }

void set_bytes(benchmark::State& state, std::size_t n) {
  state.SetBytesProcessed(std::int64_t(state.iterations()) * std::int64_t(n * sizeof(float)));
}

// Baseline: the bandwidth ceiling, one threaded read of every value (sum of |x| in
// independent lanes, so that it vectorizes).
void streaming_read(benchmark::State& state) {
  const auto& g = input(state);
  for (auto _ : state) {
    double total = 0;
#if defined(_OPENMP)
#pragma omp parallel for reduction(+ : total) schedule(static)
#endif
    for (std::size_t block = 0; block < g.size() / 1024; ++block) {
      float sums[16] = {};
      for (std::size_t i = block * 1024; i < block * 1024 + 1024; i += 16)
        for (std::size_t j = 0; j < 16; ++j) sums[j] += std::fabs(g[i + j]);
      for (float s : sums) total += s;
    }
    benchmark::DoNotOptimize(total);
  }
  set_bytes(state, g.size());
}

// Baseline: exact Top-k by std::nth_element on magnitudes (one thread, as the standard
// library gives it).
void nth_element_top_k(benchmark::State& state) {
  const auto& g = input(state);
  const std::size_t k = sidco::target_count(density_of(state), g.size());
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
  const auto& g = input(state);
  const double delta = density_of(state);
  Compressor c;
  sidco::sparse_vector<float> out;
  sidco::feedback::residual<float> residual(g.size());
  auto call = [&] {
    return Feedback ? c.template compress<float>(g, delta, out, residual)
                    : c.template compress<float>(g, delta, out);
  };
  call();  // warm: buffers sized, as across training steps
  call();
  double achieved = 0;
  const std::size_t before = allocated_bytes.load();
  for (auto _ : state) achieved = call().density;
  set_bytes(state, g.size());
  state.counters["density_ratio"] = achieved / delta;
  state.counters["alloc_bytes"] =
      double(allocated_bytes.load() - before) / double(std::max<std::int64_t>(1, state.iterations()));
  if constexpr (requires { c.workspace_bytes(); })
    state.counters["workspace_bytes"] = double(c.workspace_bytes());
}

void synthetic_and_real(benchmark::internal::Benchmark* b) {
  for (int inverse_density : {10, 100, 1000}) {
    for (int kind : {0, 1})
      for (int log2n : {20, 23, 25}) b->Args({kind, log2n, inverse_density});
    b->Args({2, 0, inverse_density});
    b->Args({3, 0, inverse_density});
  }
  b->Unit(benchmark::kMillisecond);
}

using namespace sidco::presets;
using sidco_e_fixed3 = sidco_with<sidco::dist::exponential, sidco::dist::exponential,
                                  sidco::stages::fixed<3>, sidco::fit::zero_aware,
                                  sidco::select::above_threshold, sidco::backend::cpu>;
using sidco_e_serial = sidco_e_single<sidco::select::above_threshold, sidco::backend::serial>;

BENCHMARK(streaming_read)->Apply(synthetic_and_real);
BENCHMARK(nth_element_top_k)->Apply(synthetic_and_real);
#define SIDCO_BENCH(type, name)                                                     \
  BENCHMARK(compress<type, false>)->Name(name)->Apply(synthetic_and_real);          \
  BENCHMARK(compress<type, true>)->Name(name "_feedback")->Apply(synthetic_and_real)
SIDCO_BENCH(sidco_e_single<>, "sidco_e_single");
SIDCO_BENCH(sidco_e_fixed3, "sidco_e_fixed3");
SIDCO_BENCH(sidco_e<>, "sidco_e");
SIDCO_BENCH(sidco_gp<>, "sidco_gp");
SIDCO_BENCH(sidco_gamma_gp<>, "sidco_gamma_gp");
SIDCO_BENCH(sidco_e_exact<>, "sidco_e_exact_k");
SIDCO_BENCH(top_k<>, "top_k");
SIDCO_BENCH(dgc<>, "dgc");
SIDCO_BENCH(gaussian_k<>, "gaussian_k");
SIDCO_BENCH(redsync<>, "redsync");
SIDCO_BENCH(random_k<>, "random_k");
SIDCO_BENCH(sidco_e_serial, "sidco_e_single_serial");
#undef SIDCO_BENCH

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::AddCustomContext("sidco_kernels", sidco::backend::cpu::kernels);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
