// Compresses one slice of a float32 .npy gradient (a layer: OFFSET and SIZE from the
// manifest) with SIDCo-E or SIDCo-GP over CALLS calls of the same values, no error feedback,
// and prints each call's achieved / target density, its passes, its threshold, the adaptive
// loop's correction and the base the next moments pass probes; then the mean ratio and the
// passes of the last 20 calls. For the closed loop's behaviour on one layer (docs/RESULTS.md,
// "two-call cycle"), compiled by hand against a tree's include/:
//
//   g++ -std=c++20 -O2 -fopenmp -Iinclude bench/layer_repeat.cpp -o layer_repeat
//   OMP_NUM_THREADS=1 ./layer_repeat examples/data/gradients/lstm_it10.npy 3681600 7596 0.1 [CALLS [gp]]
#include <cstdio>
#include <cstdlib>
#include <span>
#include <string>
#include <vector>

#include <sidco/io/npy.hpp>
#include <sidco/sidco.hpp>

template <class Compressor>
int run(const std::vector<float>& x, double delta, int calls) {
  Compressor compressor;
  sidco::sparse_vector<float, std::uint32_t> out;
  double last_sum = 0;
  int last_passes = 0, counted = 0;
  for (int call = 0; call < calls; ++call) {
    const auto report = compressor.compress(std::span<const float>(x), delta, out);
    const double ratio = report.density / delta;
    const auto& estimator = compressor.estimator();
    std::printf("call %3d  ratio %7.3f  passes %d  stages %d  threshold %.6g  correction %.3f  next base %.6g\n", call,
                ratio, int(report.passes), int(report.stages), report.threshold,
                estimator.stage_policy_state().correction(), estimator.base());
    if (call >= calls - 20) {
      last_sum += ratio;
      last_passes += int(report.passes);
      ++counted;
    }
  }
  std::printf("last %d calls: mean ratio %.3f, %d passes\n", counted, last_sum / counted, last_passes);
  return 0;
}

int main(int argc, char** argv) {
  if (argc < 5) {
    std::fprintf(stderr, "usage: %s FILE.npy OFFSET SIZE DELTA [CALLS [gp]]\n", argv[0]);
    return 2;
  }
  const auto values = sidco::io::load_npy<float>(argv[1]);
  const std::size_t offset = std::strtoull(argv[2], nullptr, 10), size = std::strtoull(argv[3], nullptr, 10);
  if (offset + size > values.size() || size == 0) {
    std::fprintf(stderr, "OFFSET %zu + SIZE %zu is outside the file's %zu values\n", offset, size, values.size());
    return 2;
  }
  const std::vector<float> layer(values.begin() + std::ptrdiff_t(offset),
                                 values.begin() + std::ptrdiff_t(offset + size));
  const double delta = std::atof(argv[4]);
  const int calls = argc > 5 ? std::atoi(argv[5]) : 50;
  if (calls < 1) {
    std::fprintf(stderr, "CALLS = %d is below 1\n", calls);
    return 2;
  }
  if (argc > 6 && std::string(argv[6]) == "gp") return run<sidco::presets::sidco_gp<>>(layer, delta, calls);
  return run<sidco::presets::sidco_e<>>(layer, delta, calls);
}
