#include <sidco/sidco.hpp>
#include <cstdio>

int main(int argc, char** argv) {
  if (argc != 2) return std::fprintf(stderr, "usage: quickstart GRADIENT.npy\n"), 2;
  std::vector<float> grad = sidco::io::load_npy<float>(argv[1]);
  sidco::presets::sidco_e<> compressor;          // SIDCo-E, adaptive stages
  sidco::feedback::residual<float> residual(grad.size());  // error feedback state
  sidco::sparse_vector<float> sent;              // ascending 32-bit indices + values
  auto report = compressor.compress(grad, 0.01, sent, residual);
  std::printf("kept %zu of %zu (%.2fx the target), threshold %g, %d stages\n", report.selected,
              report.size, report.density_ratio(), report.threshold, report.stages);
}
