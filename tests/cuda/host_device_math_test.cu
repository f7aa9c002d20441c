// The math shared by host and device (moments, exponential and generalized Pareto fits)
// gives the same answers on the GPU as on the host. Exits 77 (skip) without a GPU.
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include <cuda_runtime.h>

#include <sidco/core/moments.hpp>
#include <sidco/models/exponential.hpp>
#include <sidco/models/generalized_pareto.hpp>

#include "device.hpp"

namespace {

constexpr int threads = 256;
constexpr int blocks = 64;

// Each thread gathers a strided slice; thread 0 of each block merges the block's moments.
__global__ void block_moments(const float* x, std::size_t n, sidco::moments* per_block) {
  __shared__ sidco::moments partial[threads];
  sidco::moments m;
  for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += std::size_t(blockDim.x) * gridDim.x)
    m.add<true>(std::fabs(double(x[i])));
  partial[threadIdx.x] = m;
  __syncthreads();
  if (threadIdx.x == 0) {
    sidco::moments total;
    for (int t = 0; t < threads; ++t) total.merge(partial[t]);
    per_block[blockIdx.x] = total;
  }
}

__global__ void fit_thresholds(const sidco::moments* m, double rho, double* out) {
  out[0] = sidco::models::exponential::fit(*m).upper_quantile(rho);
  out[1] = sidco::models::generalized_pareto::fit(*m).upper_quantile(rho);
}

int failures = 0;
void check(bool ok, const char* what, double device, double host) {
  if (!ok) {
    std::printf("FAIL %s: device %.17g host %.17g\n", what, device, host);
    ++failures;
  }
}
bool close(double a, double b, double rel) { return std::fabs(a - b) <= rel * std::fabs(b); }

}  // namespace

int main() {
  if (!sidco::test::cuda_device_present()) {
    std::printf("no CUDA device: skipped\n");
    return 77;
  }
  std::mt19937_64 rng(3);
  std::normal_distribution<float> normal(0.f, 1e-3f);
  std::vector<float> x(1 << 20);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = i % 3 == 0 ? 0.f : normal(rng);
  x[12345] = NAN;

  sidco::moments host;
  for (float v : x) host.add<true>(std::fabs(double(v)));

  float* d_x = nullptr;
  sidco::moments* d_blocks = nullptr;
  double* d_t = nullptr;
  cudaMalloc(&d_x, x.size() * sizeof(float));
  cudaMalloc(&d_blocks, blocks * sizeof(sidco::moments));
  cudaMalloc(&d_t, 2 * sizeof(double));
  cudaMemcpy(d_x, x.data(), x.size() * sizeof(float), cudaMemcpyHostToDevice);
  block_moments<<<blocks, threads>>>(d_x, x.size(), d_blocks);
  std::vector<sidco::moments> per_block(blocks);
  cudaMemcpy(per_block.data(), d_blocks, blocks * sizeof(sidco::moments), cudaMemcpyDeviceToHost);
  sidco::moments device;
  for (const auto& b : per_block) device.merge(b);

  check(device.count == host.count, "count", double(device.count), double(host.count));
  check(device.zeros == host.zeros, "zeros", double(device.zeros), double(host.zeros));
  check(device.nonfinite == 1, "nonfinite", double(device.nonfinite), 1);
  check(device.min == host.min, "min", device.min, host.min);
  check(device.max == host.max, "max", device.max, host.max);
  // Summation order differs; 1e-12 relative is far above double rounding for 2^20 terms.
  check(close(device.sum, host.sum, 1e-12), "sum", device.sum, host.sum);
  check(close(device.sum_sq, host.sum_sq, 1e-12), "sum_sq", device.sum_sq, host.sum_sq);
  check(close(device.sum_log, host.sum_log, 1e-12), "sum_log", device.sum_log, host.sum_log);

  cudaMemcpy(d_blocks, &host, sizeof(sidco::moments), cudaMemcpyHostToDevice);
  fit_thresholds<<<1, 1>>>(d_blocks, 0.001, d_t);
  double t[2];
  cudaMemcpy(t, d_t, sizeof(t), cudaMemcpyDeviceToHost);
  const double host_e = sidco::models::exponential::fit(host).upper_quantile(0.001);
  const double host_gp = sidco::models::generalized_pareto::fit(host).upper_quantile(0.001);
  check(close(t[0], host_e, 1e-14), "exponential threshold", t[0], host_e);
  check(close(t[1], host_gp, 1e-13), "generalized Pareto threshold", t[1], host_gp);
  const cudaError_t status = cudaGetLastError();
  if (status != cudaSuccess) {
    std::printf("FAIL CUDA error: %s\n", cudaGetErrorString(status));
    ++failures;
  }
  cudaFree(d_x);
  cudaFree(d_blocks);
  cudaFree(d_t);
  std::printf("%s\n", failures ? "FAILED" : "host and device math agree");
  return failures ? 1 : 0;
}
