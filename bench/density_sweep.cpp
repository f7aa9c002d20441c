// The adaptive loop over every bundled gradient and the LM head's rows: SIDCo-E and SIDCo-GP,
// whole vector and per layer (the manifest), δ = 0.1, 0.01, 0.001 (the head: 0.2 to 0.001),
// 50 calls each over the same values, without error feedback and with it under a ±35% drift
// (the density test's procedure). One line a case: the first call's achieved / target
// density, the mean |ratio − 1| over calls 2–10 (early) and 31–50 (late), and the passes the
// estimates made of their own; then the sums over all cases. For judging a change to the
// estimator or the loop against the tree before it (docs/RESULTS.md, "The adaptive loop swept"),
// compiled by hand against a tree's include/:
//
//   g++ -std=c++20 -O3 -march=native -fopenmp -DSIDCO_HIGHWAY=1 -DHWY_SHARED_DEFINE -Iinclude
//       bench/density_sweep.cpp -o density_sweep -lhwy   (one line)
//   ./density_sweep examples/data/gradients > sweep.txt; tail -1 sweep.txt
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include <sidco/io/manifest.hpp>
#include <sidco/io/npy.hpp>
#include <sidco/sidco.hpp>

namespace {

using sidco::segment;

struct totals {
  double first_miss = 0, early = 0, late = 0, passes = 0;
  int cases = 0;
};

template <class Compressor>
void run(const char* method, const std::string& name, const std::vector<float>& g0, const std::vector<segment>* layout,
         double delta, bool feedback, totals& sum) {
  std::vector<float> g(g0.size());
  sidco::feedback::residual<float> residual(g.size());
  sidco::sparse_vector<float> out;
  sidco::segmented<Compressor> compressor(layout ? *layout : std::vector<segment>{{0, g.size()}});
  double first = 0, early = 0, late = 0;
  int passes = 0;
  for (int call = 0; call < 50; ++call) {
    const float scale = feedback ? std::exp(0.3f * std::sin(float(call) / 8.0f)) : 1.0f;
    for (std::size_t i = 0; i < g.size(); ++i) g[i] = scale * g0[i];
    const auto report = feedback ? compressor.template compress<float>(g, delta, out, residual)
                                 : compressor.template compress<float>(g, delta, out);
    const double ratio = report.density_ratio();
    if (call == 0) first = ratio;
    if (call >= 1 && call < 10) early += std::fabs(ratio - 1) / 9;
    if (call >= 30) late += std::fabs(ratio - 1) / 20;
    passes += report.passes;
  }
  std::printf("%-22s %-8s %-5s %5.3f %-8s first %6.3f  early %.4f  late %.4f  passes %d\n", name.c_str(), method,
              layout ? "layer" : "whole", delta, feedback ? "feedback" : "-", first, early, late, passes);
  sum.first_miss += std::fabs(first - 1);
  sum.early += early;
  sum.late += late;
  sum.passes += passes;
  ++sum.cases;
}

void both(const std::string& name, const std::vector<float>& g, const std::vector<segment>* layout, double delta,
          totals& sum) {
  for (bool feedback : {false, true}) {
    run<sidco::presets::sidco_e<>>("sidco-e", name, g, layout, delta, feedback, sum);
    run<sidco::presets::sidco_gp<>>("sidco-gp", name, g, layout, delta, feedback, sum);
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) return std::fprintf(stderr, "usage: density_sweep GRADIENTS_DIR\n"), 2;
  const std::string dir = argv[1];
  totals sum;
  for (const auto& [file, layout] : sidco::io::load_manifest(dir + "/manifest.json")) {
    const auto g = sidco::io::load_npy<float>(dir + "/" + file);
    for (double delta : {0.1, 0.01, 0.001}) {
      both(file, g, nullptr, delta, sum);
      both(file, g, &layout, delta, sum);
    }
  }
  const auto head = sidco::io::load_npy<float>(dir + "/lm_head/gpt_it200_head_rows.npy");
  for (double delta : {0.2, 0.15, 0.1, 0.05, 0.02, 0.01, 0.001}) both("lm_head", head, nullptr, delta, sum);
  std::printf("%d cases: sum of |first - 1| %.4f, of early %.4f, of late %.4f; passes %.0f\n", sum.cases,
              sum.first_miss, sum.early, sum.late, sum.passes);
}
