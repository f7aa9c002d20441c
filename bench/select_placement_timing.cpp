// Times backend::cpu's fused selection (select_above) on 1,000 layers of 1,500 to 4,499 Laplace
// values, each its own scale (sidco-bench's input 7), per layer (each layer's own threshold
// for ~δ·n of its values, δ = 0.001) and on the whole buffer (one threshold, the same count),
// for eight heap placements of the backend's scratch (a few small allocations made first, so
// its per-thread state lands at different offsets in a cache line). Prints, per placement,
// the best of 5 rounds of 1,000 calls. For before/after checks of the selection's per-thread
// state, compiled by hand against each tree's include/ and run alternately
// (bench/BEFORE_AFTER.md):
//
//   g++ -std=c++20 -O3 -march=native -DNDEBUG -fopenmp -DSIDCO_HIGHWAY=1 -DHWY_COMPILE_ONLY_STATIC=1
//     -ITREE/include bench/select_placement_timing.cpp -o placement -lhwy   (one line)
//   OMP_NUM_THREADS=2 ./placement
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <random>
#include <vector>

#include <sidco/sidco.hpp>

int main() {
  using namespace sidco;
  constexpr std::size_t layers = 1000, calls = 1000;
  std::mt19937 rng(1);
  std::vector<float> x;
  std::vector<segment> layout;
  std::vector<double> thresholds;
  while (layout.size() < layers) {
    const std::size_t n = 1500 + rng() % 3000;
    const double scale = std::pow(10.0, -4.0 + 2.0 * double(rng() % 1000) / 1000.0);
    std::exponential_distribution<double> magnitude(1.0 / scale);
    layout.push_back({x.size(), n});
    for (std::size_t i = 0; i < n; ++i) x.push_back(float((rng() & 1 ? 1 : -1) * magnitude(rng)));
    thresholds.push_back(scale * std::log(1000.0));  // P(|x| > t) = 0.001
  }
  // The whole buffer's threshold: the one that keeps as many as the layers' thresholds do.
  backend::plain_source<float> source{x.data(), x.size()};
  sparse_vector<float> out;
  std::vector<std::size_t> kept(layers), kept_whole(1);
  std::size_t selected = 0;
  {
    backend::cpu b;
    out.clear(x.size());
    b.select_above<true>(source, std::span<const segment>(layout), std::span<const double>(thresholds), out, 0,
                         std::span<std::size_t>(kept));
    selected = out.size();
  }
  std::vector<float> magnitudes(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) magnitudes[i] = std::fabs(x[i]);
  std::nth_element(magnitudes.begin(), magnitudes.begin() + std::ptrdiff_t(selected), magnitudes.end(),
                   std::greater<float>());
  const std::vector<double> whole_threshold{double(magnitudes[selected])};
  const segment whole{0, x.size()};
  std::printf("%zu values, %zu layers, %zu selected per layer\n", x.size(), layers, selected);

  for (int placement = 0; placement < 8; ++placement) {
    std::vector<void*> before;
    for (int j = 0; j < 64; ++j) before.push_back(std::malloc(std::size_t(24 + 16 * placement)));
    backend::cpu b;
    double best[2] = {1e9, 1e9};
    std::size_t count[2] = {0, 0};
    for (int round = 0; round < 5; ++round)
      for (int mode = 0; mode < 2; ++mode) {
        const auto start = std::chrono::steady_clock::now();
        for (std::size_t call = 0; call < calls; ++call) {
          out.clear(x.size());
          if (mode == 0)
            b.select_above<true>(source, std::span<const segment>(layout), std::span<const double>(thresholds), out,
                                 selected, std::span<std::size_t>(kept));
          else
            b.select_above<true>(source, std::span<const segment>(&whole, 1),
                                 std::span<const double>(whole_threshold), out, selected,
                                 std::span<std::size_t>(kept_whole));
          count[mode] = out.size();
        }
        const std::chrono::duration<double, std::milli> took = std::chrono::steady_clock::now() - start;
        best[mode] = std::min(best[mode], took.count() / double(calls));
      }
    std::printf("placement %d: per layer %.3f ms (%zu kept), whole %.3f ms (%zu kept)\n", placement, best[0], count[0],
                best[1], count[1]);
    for (void* p : before) std::free(p);
  }
}
