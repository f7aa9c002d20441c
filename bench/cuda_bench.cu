// The CUDA backend's Google Benchmark suite: the same names as sidco-bench, arguments
// input / log2 N / 1/delta (input 1: Laplace values with 30% exact zeros), measured with a
// device-to-device copy of the gradient (the bandwidth ceiling: read and write every value
// once) and Top-k by cub::DeviceRadixSort (sort the magnitude keys with their indices,
// keep the first k) in the same run. Times are per call, synchronized. Skips every
// benchmark (and reports why) without a GPU.
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <map>
#include <random>
#include <vector>

#include <benchmark/benchmark.h>
#include <cub/device/device_radix_sort.cuh>
#include <sidco/backend/cuda.cuh>
#include <sidco/sidco.hpp>

namespace {

using device = sidco::memory::device;

bool have_gpu() {
  static const bool found = [] {
    int devices = 0;
    const bool ok = cudaGetDeviceCount(&devices) == cudaSuccess && devices > 0;
    cudaGetLastError();
    return ok;
  }();
  return found;
}

const sidco::memory::device_buffer<float>& input(const benchmark::State& state) {
  static std::map<int, sidco::memory::device_buffer<float>> cache;
  const int log2n = int(state.range(1));
  auto& b = cache[log2n];
  if (b.size() == 0) {
    std::vector<float> g(std::size_t(1) << log2n);
    std::mt19937_64 rng(43);
    std::exponential_distribution<float> exponential(1e3f);
    std::uniform_real_distribution<float> u(0.f, 1.f);
    for (auto& v : g) v = u(rng) < 0.3f ? 0.f : (u(rng) < 0.5f ? -1.f : 1.f) * exponential(rng);
    b.resize(g.size());
    device::copy_from_host(std::span<const float>(g), b.view());
  }
  return b;
}

double density_of(const benchmark::State& state) { return 1.0 / double(state.range(2)); }

void set_bytes(benchmark::State& state, std::size_t n) {
  state.SetBytesProcessed(std::int64_t(state.iterations()) * std::int64_t(n * sizeof(float)));
}

void device_copy(benchmark::State& state) {
  if (!have_gpu()) return state.SkipWithError("no CUDA device");
  const auto& g = input(state);
  sidco::memory::device_buffer<float> copy(g.size());
  for (auto _ : state) {
    cudaMemcpy(copy.data(), g.data(), g.size() * sizeof(float), cudaMemcpyDeviceToDevice);
    cudaDeviceSynchronize();
  }
  set_bytes(state, g.size());
}

// Magnitude keys (the bits of |x|) sorted descending with their indices: the first k are
// the Top-k (ties in the sort's order).
__global__ void keys_and_indices(const float* g, std::size_t n, std::uint32_t* keys, std::uint32_t* indices) {
  for (std::size_t i = std::size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += std::size_t(gridDim.x) * blockDim.x) {
    keys[i] = sidco::magnitude_key(g[i]);
    indices[i] = std::uint32_t(i);
  }
}

void radix_sort_top_k(benchmark::State& state) {
  if (!have_gpu()) return state.SkipWithError("no CUDA device");
  const auto& g = input(state);
  const std::size_t n = g.size();
  sidco::memory::device_buffer<std::uint32_t> keys(n), indices(n), sorted_keys(n), sorted_indices(n);
  std::size_t bytes = 0;
  cub::DeviceRadixSort::SortPairsDescending(nullptr, bytes, keys.data(), sorted_keys.data(), indices.data(),
                                            sorted_indices.data(), std::int64_t(n));
  sidco::memory::device_buffer<unsigned char> temp(bytes);
  for (auto _ : state) {
    keys_and_indices<<<4096, 256>>>(g.data(), n, keys.data(), indices.data());
    cub::DeviceRadixSort::SortPairsDescending(temp.data(), bytes, keys.data(), sorted_keys.data(), indices.data(),
                                              sorted_indices.data(), std::int64_t(n));
    cudaDeviceSynchronize();
  }
  set_bytes(state, n);
}

template <class Compressor, bool Feedback>
void compress(benchmark::State& state) {
  if (!have_gpu()) return state.SkipWithError("no CUDA device");
  const auto& g = input(state);
  const double delta = density_of(state);
  const auto view = g.view();
  Compressor c;
  sidco::sparse_vector<float, std::uint32_t, device> out;
  sidco::feedback::residual<float, device> residual(g.size());
  auto call = [&] {
    const auto report = Feedback ? c.template compress<float>(view, delta, out, residual)
                                 : c.template compress<float>(view, delta, out);
    c.backend().synchronize();
    return report;
  };
  call();
  call();
  double achieved = 0;
  for (auto _ : state) achieved = call().density;
  set_bytes(state, g.size());
  state.counters["density_ratio"] = achieved / delta;
  state.counters["workspace_bytes"] = double(c.workspace_bytes());
}

void sizes(benchmark::internal::Benchmark* b) {
  for (int inverse_density : {100, 1000})
    for (int log2n : {20, 23, 26}) b->Args({1, log2n, inverse_density});
  b->Unit(benchmark::kMillisecond)->UseRealTime();
}

using namespace sidco::presets;
using cuda = sidco::backend::cuda;
using above = sidco::select::above_threshold;

BENCHMARK(device_copy)->Name("device-copy")->Apply(sizes);
BENCHMARK(radix_sort_top_k)->Name("radix-sort-top-k")->Apply(sizes);
#define SIDCO_BENCH(type, name)                                            \
  BENCHMARK(compress<type, false>)->Name(name)->Apply(sizes);              \
  BENCHMARK(compress<type, true>)->Name(name ":feedback")->Apply(sizes)
using e_single = sidco_e_single<cuda>;
using e_adaptive = sidco_e<cuda>;
using gp_adaptive = sidco_gp<cuda>;
SIDCO_BENCH(e_single, "sidco-e-single");
SIDCO_BENCH(e_adaptive, "sidco-e");
SIDCO_BENCH(gp_adaptive, "sidco-gp");
SIDCO_BENCH(sidco_e_exact<cuda>, "sidco-e-exact");
SIDCO_BENCH(top_k<cuda>, "top-k");
SIDCO_BENCH(random_k<cuda>, "random-k");
#undef SIDCO_BENCH

// Launch shapes against the default (cuda/tuning.cuh), SIDCo-E and Top-k at each: more loads
// in flight per thread, fewer resident blocks aimed at (larger pieces), more values a
// thread per step of the write pass. Named <method>@<loads>x<blocks per SM>x<write items>.
template <int Loads, int BlocksPerSm, int WriteItems>
struct shape : sidco::backend::cuda_detail::default_tuning {
  static constexpr int load_items = Loads;
  static constexpr int blocks_per_sm = BlocksPerSm;
  static constexpr int write_items = WriteItems;
};
#define SIDCO_SHAPE(loads, blocks, writes)                                                                      \
  BENCHMARK(compress<sidco_e<sidco::backend::basic_cuda<shape<loads, blocks, writes>>>, false>)          \
      ->Name("sidco-e@" #loads "x" #blocks "x" #writes)                                                         \
      ->Apply(sizes);                                                                                           \
  BENCHMARK(compress<top_k<sidco::backend::basic_cuda<shape<loads, blocks, writes>>>, false>)                   \
      ->Name("top-k@" #loads "x" #blocks "x" #writes)                                                           \
      ->Apply(sizes)
// The write pass before it was striped (write_items consecutive values a thread a step,
// ranked by a block scan), against the striped default in the same run.
struct blocked_write : sidco::backend::cuda_detail::default_tuning {
  static constexpr bool striped_write = false;
};
using blocked = sidco::backend::basic_cuda<blocked_write>;
BENCHMARK(compress<sidco_e<blocked>, false>)->Name("sidco-e@blocked-write")->Apply(sizes);
BENCHMARK(compress<sidco_e<blocked>, true>)->Name("sidco-e@blocked-write:feedback")->Apply(sizes);
BENCHMARK(compress<top_k<blocked>, false>)->Name("top-k@blocked-write")->Apply(sizes);
BENCHMARK(compress<top_k<blocked>, true>)->Name("top-k@blocked-write:feedback")->Apply(sizes);
// Rows a striped write step loads where it settles error feedback (default 4).
template <int Rows>
struct stateful_rows : sidco::backend::cuda_detail::default_tuning {
  static constexpr int stateful_write_rows = Rows;
};
#define SIDCO_STATEFUL_ROWS(rows)                                                                              \
  BENCHMARK(compress<sidco_e<sidco::backend::basic_cuda<stateful_rows<rows>>>, true>)                          \
      ->Name("sidco-e@" #rows "-rows:feedback")                                                                \
      ->Apply(sizes);                                                                                          \
  BENCHMARK(compress<top_k<sidco::backend::basic_cuda<stateful_rows<rows>>>, true>)                            \
      ->Name("top-k@" #rows "-rows:feedback")                                                                  \
      ->Apply(sizes)
// The radix walks' digits chosen by the whole block (Top-k's and exact_k's keep_top_k).
struct parallel_choice : sidco::backend::cuda_detail::default_tuning {
  static constexpr bool parallel_digit_choice = true;
};
using choosing = sidco::backend::basic_cuda<parallel_choice>;
BENCHMARK(compress<top_k<choosing>, false>)->Name("top-k@parallel-choice")->Apply(sizes);
BENCHMARK(compress<top_k<choosing>, true>)->Name("top-k@parallel-choice:feedback")->Apply(sizes);
BENCHMARK(compress<sidco_e_exact<choosing>, false>)->Name("sidco-e-exact@parallel-choice")->Apply(sizes);
// The coarse histogram's zero bin counted in registers (the input's 30% exact zeros).
struct zero_bin : sidco::backend::cuda_detail::default_tuning {
  static constexpr bool zero_bin_in_registers = true;
};
using zero_counting = sidco::backend::basic_cuda<zero_bin>;
BENCHMARK(compress<top_k<zero_counting>, false>)->Name("top-k@zero-bin")->Apply(sizes);
BENCHMARK(compress<sidco_e_exact<zero_counting>, false>)->Name("sidco-e-exact@zero-bin")->Apply(sizes);
// select_above in one pass into regions sized from the hint, against the count pass first.
struct one_pass : sidco::backend::cuda_detail::default_tuning {
  static constexpr bool one_pass_select = true;
};
using one_pass_cuda = sidco::backend::basic_cuda<one_pass>;
BENCHMARK(compress<sidco_e<one_pass_cuda>, false>)->Name("sidco-e@one-pass")->Apply(sizes);
BENCHMARK(compress<sidco_e<one_pass_cuda>, true>)->Name("sidco-e@one-pass:feedback")->Apply(sizes);
BENCHMARK(compress<top_k<one_pass_cuda>, false>)->Name("top-k@one-pass")->Apply(sizes);
BENCHMARK(compress<top_k<one_pass_cuda>, true>)->Name("top-k@one-pass:feedback")->Apply(sizes);
// The moments pass held to 4 blocks of 256 a multiprocessor (at most 64 registers a thread).
struct analyze_capped : sidco::backend::cuda_detail::default_tuning {
  static constexpr int analyze_min_blocks = 4;
};
using capped = sidco::backend::basic_cuda<analyze_capped>;
BENCHMARK(compress<sidco_e<capped>, false>)->Name("sidco-e@analyze-4-blocks")->Apply(sizes);
BENCHMARK(compress<sidco_e<capped>, true>)->Name("sidco-e@analyze-4-blocks:feedback")->Apply(sizes);
SIDCO_STATEFUL_ROWS(8);
SIDCO_STATEFUL_ROWS(16);
#undef SIDCO_STATEFUL_ROWS

SIDCO_SHAPE(8, 8, 4);
SIDCO_SHAPE(4, 8, 4);
SIDCO_SHAPE(4, 8, 16);
SIDCO_SHAPE(8, 4, 16);
SIDCO_SHAPE(16, 4, 16);
#undef SIDCO_SHAPE

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  if (have_gpu()) {
    cudaDeviceProp properties{};
    cudaGetDeviceProperties(&properties, 0);
    benchmark::AddCustomContext("gpu", properties.name);
  } else {
    std::printf("no CUDA device: every benchmark is skipped\n");
  }
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
