// Each call's achieved / target density with error feedback over a fresh gradient every call
// (each bundled gradient rotated by a shift, so the values keep their distribution and every
// position changes), whole vector and per layer, SIDCo-E and SIDCo-GP, delta = 0.01 and
// 0.001, 100 calls: the 5th, 50th and 95th percentile of calls 20-99, the rms of ln(ratio)
// and the passes. For the per-call density in training (docs/RESULTS.md, "The last
// threshold, measured again"), compiled by hand against a tree's include/:
//
//   g++ -std=c++20 -O2 -fopenmp -march=native -DSIDCO_HIGHWAY=1 -Iinclude
//     bench/fresh_feedback_density.cpp -o fresh_feedback_density -lhwy   (one line)
//   OMP_NUM_THREADS=1 ./fresh_feedback_density examples/data/gradients
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <type_traits>
#include <vector>

#include <sidco/io/manifest.hpp>
#include <sidco/io/npy.hpp>
#include <sidco/sidco.hpp>

template <class Compressor>
void run(const std::string& file, const std::vector<float>& g0, const std::vector<sidco::segment>& layout,
         double delta, bool per_layer) {
  std::vector<float> g(g0.size());
  sidco::feedback::residual<float> residual(g.size());
  sidco::sparse_vector<float> out;
  sidco::segmented<Compressor> compressor(per_layer ? layout : std::vector<sidco::segment>{{0, g.size()}});
  std::vector<double> ratios;
  long passes = 0;
  for (int call = 0; call < 100; ++call) {
    const std::size_t shift = (std::size_t(call) * 7919) % g.size();
    std::rotate_copy(g0.begin(), g0.begin() + std::ptrdiff_t(shift), g0.end(), g.begin());
    const auto report = compressor.template compress<float>(g, delta, out, residual);
    if (call >= 20) {
      ratios.push_back(report.density_ratio());
      passes += long(report.passes);
    }
  }
  double square = 0;
  for (double r : ratios) square += std::log(r) * std::log(r);
  std::sort(ratios.begin(), ratios.end());
  const char* method = std::is_same_v<Compressor, sidco::presets::sidco_e<>> ? "sidco-e" : "sidco-gp";
  std::printf("%-16s %-6s %-5g %-8s p5 %.3f p50 %.3f p95 %.3f rms %.3f passes %ld\n", file.c_str(),
              per_layer ? "layers" : "whole", delta, method, ratios[ratios.size() / 20], ratios[ratios.size() / 2],
              ratios[ratios.size() * 19 / 20], std::sqrt(square / double(ratios.size())), passes);
}

int main(int argc, char** argv) {
  if (argc != 2) return std::fprintf(stderr, "usage: fresh_feedback_density GRADIENT_DIR\n"), 2;
  const std::string dir = argv[1];
  for (const auto& [file, layout] : sidco::io::load_manifest(dir + "/manifest.json")) {
    const auto g = sidco::io::load_npy<float>(dir + "/" + file);
    for (double delta : {0.01, 0.001})
      for (bool per_layer : {false, true}) {
        run<sidco::presets::sidco_e<>>(file, g, layout, delta, per_layer);
        run<sidco::presets::sidco_gp<>>(file, g, layout, delta, per_layer);
      }
  }
}
