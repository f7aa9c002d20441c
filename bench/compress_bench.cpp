// Google Benchmark suite: every method next to the baselines, measured in the same run.
// Arguments: input / log2 N / 1/delta. Inputs: 0 normal and 1 Laplace values (30% exact
// zeros, N = 2^log2N), 2 the real LSTM gradient and 3 the real CNN gradient (N fixed, with
// their layers from the bundled manifest), 4 a 2^25-value transformer-like bucket of 170
// layers (384 to 4M values, each its own scale; the embedding 97% zeros), 5 and 6 a
// transformer language model's real gradients (17.7M values, 52 layers; plain at iteration
// 200 and with error feedback at 100) when SIDCO_LM_GRADIENTS names the directory that
// ../shared/tools/make_lm_gradients.py (or scripts/lm_gradients.sh) wrote, 7 1,000 small
// layers (1,500 to 4,499 values, each its own scale: where per-layer costs show).
// Counters: density_ratio (achieved / target), alloc_bytes (heap bytes a warm call
// allocates: 0 means the output and O(threads) scratch are all it uses), workspace_bytes
// (what the compressor keeps between calls). bench/report.py turns the JSON output into the
// ratio tables of docs/RESULTS.md.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <new>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include <benchmark/benchmark.h>
#include <sidco/sidco.hpp>

#include <sidco/io/manifest.hpp>
#include <unistd.h>

#include "summary.hpp"

#include "bundled_gradients.hpp"

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

// A transformer-like bucket of 2^25 values: token embedding (4M, 97% zeros), 14 blocks of
// LayerNorm gains and biases, attention and MLP weights and biases (d = 384), the final
// LayerNorm and the LM head, the rest of 2^25 in the head; every layer its own scale.
struct bucket {
  std::vector<float> values;
  std::vector<sidco::segment> layout;
};

bucket transformer_bucket() {
  const std::size_t d = 384, total = std::size_t(1) << 25;
  std::vector<std::size_t> sizes = {std::size_t(4) << 20};
  for (int block = 0; block < 14; ++block)
    for (std::size_t size : {d, d, 3 * d * d, 3 * d, d * d, d, d, d, 4 * d * d, 4 * d, 4 * d * d, d}) sizes.push_back(size);
  sizes.push_back(d);
  sizes.push_back(d);
  std::size_t used = 0;
  for (std::size_t size : sizes) used += size;
  sizes.push_back(total - used);  // the LM head
  bucket b;
  b.values.resize(total);
  std::mt19937_64 rng(7);
  std::exponential_distribution<float> exponential(1.f);
  std::uniform_real_distribution<float> u(0.f, 1.f);
  std::size_t offset = 0;
  for (std::size_t l = 0; l < sizes.size(); ++l) {
    b.layout.push_back({offset, sizes[l]});
    const float scale = std::pow(10.f, -4.f + 2.f * u(rng));
    const float zeros = l == 0 ? 0.97f : 0.f;
    for (std::size_t i = offset; i < offset + sizes[l]; ++i)
      b.values[i] = u(rng) < zeros ? 0.f : (u(rng) < 0.5f ? -scale : scale) * exponential(rng);
    offset += sizes[l];
  }
  return b;
}

// 1,000 layers of 1,500 to 4,499 Laplace values, each its own scale (10^-4 to 10^-2).
bucket small_layers() {
  std::mt19937_64 rng(11);
  std::uniform_real_distribution<float> u(0.f, 1.f);
  std::exponential_distribution<float> exponential(1.f);
  bucket b;
  for (int l = 0; l < 1000; ++l) {
    const std::size_t size = 1500 + std::size_t(rng() % 3000), offset = b.values.size();
    const float scale = std::pow(10.f, -4.f + 2.f * u(rng));
    b.layout.push_back({offset, size});
    for (std::size_t i = 0; i < size; ++i) b.values.push_back((u(rng) < 0.5f ? -scale : scale) * exponential(rng));
  }
  return b;
}

const char* lm_directory() { return std::getenv("SIDCO_LM_GRADIENTS"); }

const char* input_name(int kind) {
  static const char* const names[] = {"normal values", "Laplace values", "LSTM (real)", "CNN (real)",
                                      "transformer-like bucket (170 layers)", "GPT LM (real, it 200)",
                                      "GPT LM with error feedback (real, it 100)", "1,000 small layers"};
  return kind >= 0 && kind < 8 ? names[kind] : "input";
}

// Inputs 2-7 carry their layers; 0 and 1 are one layer.
const bucket& input(int kind, int log2n) {
  static std::map<std::pair<int, int>, bucket> cache;
  if (kind >= 2) log2n = 0;
  auto& b = cache[{kind, log2n}];
  if (!b.values.empty()) return b;
  if (kind < 2) {
    b.values = synthetic(kind, std::size_t(1) << log2n);
  } else if (kind == 4) {
    b = transformer_bucket();
  } else if (kind == 7) {
    b = small_layers();
  } else {
    const bool lm = kind >= 5;
    const std::string dir = lm ? std::string(lm_directory() ? lm_directory() : "") : sidco::bundled::gradients_dir();
    const std::string file = kind == 2 ? "lstm_it10.npy" : kind == 3 ? "cnn_it200.npy" : kind == 5 ? "gpt_it200.npy" : "gpt_ef_it100.npy";
    b.values = sidco::io::load_npy<float>(dir + "/" + file);
    b.layout = sidco::io::load_manifest(dir + "/manifest.json").at(file);
  }
  if (b.layout.empty()) b.layout = {{0, b.values.size()}};
  return b;
}

const bucket& input(const benchmark::State& state) { return input(int(state.range(0)), int(state.range(1))); }

double density_of(const benchmark::State& state) { return 1.0 / double(state.range(2)); }

void set_bytes(benchmark::State& state, std::size_t n, std::size_t value_bytes = sizeof(float)) {
  state.SetBytesProcessed(std::int64_t(state.iterations()) * std::int64_t(n * value_bytes));
}

// The input's values in T: float's own, or rounded once to a 16-bit type.
template <class T>
const std::vector<T>& values_in(const benchmark::State& state) {
  if constexpr (std::is_same_v<T, float>) {
    return input(state).values;
  } else {
    static std::map<std::pair<int, int>, std::vector<T>> cache;
    auto& values = cache[{int(state.range(0)), int(state.range(1))}];
    if (values.empty())
      for (const float v : input(state).values) values.push_back(T(v));
    return values;
  }
}

// The sum of |value(i)| over the whole blocks of 1,024 in [0, n), threaded, in independent
// lanes so that it vectorizes: a read-only pass.
template <class Value>
double sum_of_magnitudes(std::size_t n, Value value) {
  double total = 0;
#if defined(_OPENMP)
#pragma omp parallel for reduction(+ : total) schedule(static)
#endif
  for (std::size_t block = 0; block < n / 1024; ++block) {
    float sums[16] = {};
    for (std::size_t i = block * 1024; i < block * 1024 + 1024; i += 16)
      for (std::size_t j = 0; j < 16; ++j) sums[j] += std::fabs(value(i + j));
    for (float s : sums) total += s;
  }
  return total;
}

// Baseline: the bandwidth ceiling, one threaded read of every value.
void streaming_read(benchmark::State& state) {
  const float* const g = input(state).values.data();
  const std::size_t n = input(state).values.size();
  for (auto _ : state) benchmark::DoNotOptimize(sum_of_magnitudes(n, [g](std::size_t i) { return g[i]; }));
  set_bytes(state, n);
}

// The k-th largest |g_i| (k >= 1), by std::nth_element over magnitudes (scratch, resized).
float kth_largest_magnitude(const std::vector<float>& g, std::size_t k, std::vector<float>& magnitudes) {
  magnitudes.resize(g.size());
  std::transform(g.begin(), g.end(), magnitudes.begin(), [](float v) { return std::fabs(v); });
  std::nth_element(magnitudes.begin(), magnitudes.begin() + std::ptrdiff_t(k - 1), magnitudes.end(),
                   std::greater<float>());
  return magnitudes[k - 1];
}

// Baseline: the memory traffic of a call with error feedback, and no other work: a pass
// reading the gradient and the residual (the moments pass reads no more), then one reading
// both and writing the residual back, cleared where |g + r| passes a cut (what the selection
// pass settles). The cut is the input's (1 - delta) quantile of |g|, fixed, so that the
// residual stays bounded over calls. NAME:feedback / this row is what a method adds to the
// traffic it cannot avoid; over two streaming reads, what error feedback must cost.
void feedback_traffic(benchmark::State& state) {
  const auto& g = input(state).values;
  std::vector<float> residual(g.size());
  const float cut = [&] {
    std::vector<float> magnitudes;
    return kth_largest_magnitude(g, sidco::target_count(density_of(state), g.size()), magnitudes);
  }();
  float* const r = residual.data();
  const float* const gradient = g.data();
  for (auto _ : state) {
    benchmark::DoNotOptimize(
        sum_of_magnitudes(g.size(), [gradient, r](std::size_t i) { return gradient[i] + r[i]; }));
#if defined(_OPENMP)
#pragma omp parallel for schedule(static)
#endif
    for (std::size_t block = 0; block < g.size() / 1024; ++block)
      for (std::size_t i = block * 1024; i < block * 1024 + 1024; ++i) {
        const float v = gradient[i] + r[i];
        r[i] = std::fabs(v) > cut ? 0.0f : v;
      }
    benchmark::ClobberMemory();
  }
  set_bytes(state, g.size());
}

// Baseline: exact Top-k by std::nth_element on magnitudes (one thread, as the standard
// library gives it).
void nth_element_top_k(benchmark::State& state) {
  const auto& g = input(state).values;
  const std::size_t k = sidco::target_count(density_of(state), g.size());
  std::vector<float> magnitudes(g.size());
  for (auto _ : state) benchmark::DoNotOptimize(kth_largest_magnitude(g, k, magnitudes));
  set_bytes(state, g.size());
}

// Compressor is a compressor, or segmented<compressor> over the input's layers.
template <class Compressor>
Compressor make(const bucket& b) {
  if constexpr (requires { Compressor(b.layout); })
    return Compressor(b.layout);
  else
    return Compressor{};
}

// Four gradients of the same distribution: the input rotated by a quarter each time (a
// layer's values stay in that layer only for the one-layer inputs, which are the ones it is
// used on). Error feedback over them behaves as in training, where the gradient changes
// every step; over one gradient repeated, every unsent value grows by itself each call.
const std::vector<std::vector<float>>& fresh_gradients(const benchmark::State& state) {
  static std::map<std::pair<int, int>, std::vector<std::vector<float>>> cache;
  auto& all = cache[{int(state.range(0)), int(state.range(1))}];
  if (all.empty()) {
    const auto& g = input(state).values;
    for (std::size_t q = 0; q < 4; ++q) {
      std::vector<float> rotated(g.size());
      std::rotate_copy(g.begin(), g.begin() + std::ptrdiff_t(q * g.size() / 4), g.end(), rotated.begin());
      all.push_back(std::move(rotated));
    }
  }
  return all;
}

// Feedback: 0 none, 1 error feedback over the same gradient every call, 2 over four
// different ones in turn (float only). T: the gradient's type (float, or a 16-bit type).
template <class Compressor, int Feedback, class T = float>
void compress(benchmark::State& state) {
  static_assert(Feedback != 2 || std::is_same_v<T, float>);
  const auto& g = values_in<T>(state);
  const double delta = density_of(state);
  Compressor c = make<Compressor>(input(state));
  sidco::sparse_vector<T> out;
  sidco::feedback::residual<T> residual(g.size());
  const std::vector<std::vector<T>>* fresh = nullptr;
  if constexpr (Feedback == 2) fresh = &fresh_gradients(state);
  std::size_t calls = 0;
  auto call = [&] {
    const auto& gradient = fresh ? (*fresh)[calls++ % fresh->size()] : g;
    return Feedback ? c.template compress<T>(gradient, delta, out, residual)
                    : c.template compress<T>(gradient, delta, out);
  };
  // Buffers sized, as across a run's first steps: the output grows to its high-water mark
  // while the feedback's density settles, which can take a dozen calls. Warm until four
  // calls in a row allocate nothing (at most 32), so alloc_bytes shows a steady call; a
  // count that sets a new high later (DGC's lowered threshold) can still grow it once.
  const int fewest_warm = Feedback == 2 ? 8 : 2;
  for (int warm = 0, quiet = 0; warm < 32 && (warm < fewest_warm || quiet < 4); ++warm) {
    const std::size_t start = allocated_bytes.load();
    call();
    quiet = allocated_bytes.load() == start ? quiet + 1 : 0;
  }
  double achieved = 0;
  const std::size_t before = allocated_bytes.load();
  for (auto _ : state) achieved = call().density;
  set_bytes(state, g.size(), sizeof(T));
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

// The inputs with layers: the real LSTM and CNN, the transformer-like bucket, 1,000 small
// layers, and the LM's gradients when generated.
void layered_inputs(benchmark::internal::Benchmark* b) {
  for (int inverse_density : {10, 100, 1000}) {
    for (int kind : {2, 3, 4, 7}) b->Args({kind, 0, inverse_density});
    if (lm_directory())
      for (int kind : {5, 6}) b->Args({kind, 0, inverse_density});
  }
  b->Unit(benchmark::kMillisecond);
}

// Rows are named as the registry names methods (sidco::methods), with a variant after a
// colon: NAME (no error feedback), NAME:feedback (the same gradient every call),
// NAME:fresh-feedback (four gradients in turn, as in training), NAME:serial (the one-thread
// backend), NAME:feedback:float16 and NAME:feedback:bfloat16 (the input rounded to 16 bits;
// the baselines read it in float), sidco-e:fixed3 (three fixed stages, not a registry entry); the
// baselines are streaming-read, nth-element-top-k and feedback-traffic (the :feedback rows' floor);
// layers/NAME per layer, layers/NAME/whole the same method on the whole vector.
using namespace sidco::presets;
using sidco_e_fixed3 = sidco_with<sidco::models::exponential, sidco::models::exponential,
                                  sidco::stages::fixed<3>, sidco::fit::zero_aware,
                                  sidco::select::above_threshold, sidco::backend::cpu>;
using sidco_e_serial = sidco_e_single<sidco::backend::serial>;

template <class Compressor, int Feedback, class T = float>
void add(const std::string& name, void (*inputs)(benchmark::internal::Benchmark*)) {
  benchmark::RegisterBenchmark(name.c_str(), compress<Compressor, Feedback, T>)->Apply(inputs);
}

void register_rows() {
  benchmark::RegisterBenchmark(sidco_bench::streaming_read_row, streaming_read)->Apply(synthetic_and_real);
  benchmark::RegisterBenchmark(sidco_bench::nth_element_row, nth_element_top_k)->Apply(synthetic_and_real);
  benchmark::RegisterBenchmark(sidco_bench::feedback_traffic_row, feedback_traffic)->Apply(synthetic_and_real);
  sidco::methods::all::for_each([](auto entry) {
    using method = typename decltype(entry)::type;
    using compressor = sidco::methods::compressor_of<method>;
    const std::string name(method::about.name);
    add<compressor, 0>(name, synthetic_and_real);
    add<compressor, 1>(name + ":feedback", synthetic_and_real);
  });
  add<sidco_e_fixed3, 0>("sidco-e:fixed3", synthetic_and_real);
  add<sidco_e_fixed3, 1>("sidco-e:fixed3:feedback", synthetic_and_real);
  add<sidco_e_serial, 0>("sidco-e-single:serial", synthetic_and_real);
  add<sidco_e_serial, 1>("sidco-e-single:serial:feedback", synthetic_and_real);
  add<sidco_e_single<>, 2>("sidco-e-single:fresh-feedback", synthetic_and_real);
  add<sidco_e<>, 2>("sidco-e:fresh-feedback", synthetic_and_real);
  add<sidco_gp<>, 2>("sidco-gp:fresh-feedback", synthetic_and_real);
  // 16-bit gradients (mixed precision), with error feedback, beside their float rows.
  add<sidco_e<>, 1, sidco::float16>("sidco-e:feedback:float16", synthetic_and_real);
  add<sidco_e<>, 1, sidco::bfloat16>("sidco-e:feedback:bfloat16", synthetic_and_real);
  add<top_k<>, 1, sidco::float16>("top-k:feedback:float16", synthetic_and_real);
  add<top_k<>, 1, sidco::bfloat16>("top-k:feedback:bfloat16", synthetic_and_real);

  // Per layer, against the same methods on the whole vector and per-layer Top-k.
  benchmark::RegisterBenchmark((std::string("layers/") + sidco_bench::streaming_read_row).c_str(), streaming_read)
      ->Apply(layered_inputs);
  const auto layered = [](auto method_type) {
    using method = typename decltype(method_type)::type;
    using compressor = sidco::methods::compressor_of<method>;
    const std::string name = "layers/" + std::string(method::about.name);
    add<compressor, 0>(name + "/whole", layered_inputs);
    add<sidco::segmented<compressor>, 0>(name, layered_inputs);
    add<sidco::segmented<compressor>, 1>(name + ":feedback", layered_inputs);
  };
  namespace m = sidco::methods;
  layered(std::type_identity<m::sidco_e>{});
  layered(std::type_identity<m::sidco_gp>{});
  layered(std::type_identity<m::sidco_e_single>{});
  layered(std::type_identity<m::top_k>{});
  layered(std::type_identity<m::sidco_e_exact>{});
  layered(std::type_identity<m::dgc>{});
}

// --summary=INPUT/LOG2N/INVERSE picks the configuration of the last screen, --summary=none
// leaves it out (it is printed on the console format only: JSON and CSV on stdout stay
// parseable). Taken out of argv before Google Benchmark reads its flags.
struct summary_options {
  bool wanted = true;
  std::optional<sidco_bench::configuration> chosen;
};

summary_options take_summary_flag(int& argc, char** argv) {
  summary_options options;
  int kept = 1;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg.starts_with("--benchmark_format=") && arg != "--benchmark_format=console") options.wanted = false;
    if (!arg.starts_with("--summary=")) {
      argv[kept++] = argv[i];
      continue;
    }
    const std::string value = arg.substr(std::string("--summary=").size());
    if (value == "none") {
      options.wanted = false;
    } else if (auto config = sidco_bench::parse_configuration(value)) {
      options.chosen = config;
    } else {
      std::fprintf(stderr, "sidco-bench: --summary=%s is neither none nor INPUT/LOG2N/INVERSE (e.g. 1/25/1000)\n",
                   value.c_str());
      std::exit(1);
    }
  }
  argc = kept;
  argv[argc] = nullptr;
  return options;
}

// As Google Benchmark's own console: colour on a terminal unless --benchmark_color=false,
// tabular counters when asked.
benchmark::ConsoleReporter::OutputOptions console_options(int argc, char** argv) {
  bool color = isatty(STDOUT_FILENO), tabular = false;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--benchmark_color=false" || arg == "--benchmark_color=0") color = false;
    if (arg == "--benchmark_color=true" || arg == "--benchmark_color=1") color = true;
    if (arg == "--benchmark_counters_tabular=true" || arg == "--benchmark_counters_tabular") tabular = true;
  }
  int options = benchmark::ConsoleReporter::OO_None;
  if (color) options |= benchmark::ConsoleReporter::OO_Color;
  if (tabular) options |= benchmark::ConsoleReporter::OO_Tabular;
  return benchmark::ConsoleReporter::OutputOptions(options);
}

}  // namespace

int main(int argc, char** argv) {
  const summary_options summary = take_summary_flag(argc, argv);
  const auto options = console_options(argc, argv);
  register_rows();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::AddCustomContext("sidco_kernels", sidco::backend::cpu::kernels());
  benchmark::AddCustomContext("sidco_methods", sidco::methods::all::names());
  if (summary.wanted) {
    sidco_bench::summary_reporter reporter(
        options, summary.chosen, input_name,
        [](const sidco_bench::configuration& c) { return input(std::get<0>(c), std::get<1>(c)).values.size(); });
    benchmark::RunSpecifiedBenchmarks(&reporter);
  } else {
    benchmark::RunSpecifiedBenchmarks();
  }
  benchmark::Shutdown();
  return 0;
}
