// backend::cpu against the serial oracle: every contract member, every length in
// [1, 2 blocks + 65] at several misalignments, whole vectors and uneven layouts, and the
// real gradients with 1, 2 and 3 threads, and whole compressors that agree across thread counts.
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "doctest.hpp"
#include <sidco/backend/cpu.hpp>
#include <sidco/backend/serial.hpp>
#include <sidco/core/fast_log.hpp>
#include <sidco/core/half.hpp>
#include <sidco/sidco.hpp>

#include "backend_oracle.hpp"
#include "support.hpp"

using namespace sidco;

TEST_CASE_TEMPLATE("cpu kernels equal the serial oracle at every short length and alignment", T, float, double,
                   float16, bfloat16) {
  const auto data = test::mixed_values<T>(2 * 1024 + 65 + 3, 17, true);
  backend::cpu one_thread(1);
  for (std::size_t misalign = 0; misalign < 4; ++misalign)
    for (std::size_t n = 1; n + misalign <= data.size(); n += (n < 80 ? 1 : 37))
      test::oracle<backend::cpu>::compare_kernels<T>(one_thread, std::span<const T>(data.data() + misalign, n),
                                                     "misaligned by " + std::to_string(misalign));
}

TEST_CASE("cpu kernels equal the serial oracle on real gradients with 1, 2 and 3 threads") {
  // Under the sanitizers without the LSTM's 3.7M values (three quarters of the time).
  for (const auto& file : test::one_gradient_per_model()) {
    const auto g = test::load_gradient(file);
    for (int threads : {1, 2, 3}) {
      backend::cpu cpu(threads);
      test::oracle<backend::cpu>::compare_kernels<float>(cpu, g, file + ", " + std::to_string(threads) + " threads");
    }
  }
}

TEST_CASE_TEMPLATE("cpu selection settles error feedback exactly as the oracle does", T, float, double, float16,
                   bfloat16) {
  const auto g = test::mixed_values<T>(200003, 5, false);
  const auto r0 = test::mixed_values<T>(200003, 6, false);
  backend::cpu cpu(3);
  test::oracle<backend::cpu>::compare_feedback<T>(cpu, g, r0);
}

TEST_CASE_TEMPLATE("16-bit values in the kernels' float lanes round as the scalar conversions do, every pattern", T,
                   float16, bfloat16) {
  // Every 16-bit pattern as the gradient, against a shuffle of them as the residual: sums
  // that overflow, cancel, round to even, and meet NaN, infinity and subnormals, in whole
  // vectors. The residuals (bits) and kept entries must be the oracle's.
  constexpr std::size_t n = 65536;
  std::vector<T> g(n), r0(n);
  for (std::size_t i = 0; i < n; ++i) {
    g[i].bits = std::uint16_t(i);
    r0[i].bits = std::uint16_t(i * 40503 + 12345);
  }
  const auto bits = [](const std::vector<T>& v) {
    std::vector<std::uint16_t> out(v.size());
    for (std::size_t i = 0; i < v.size(); ++i) out[i] = v[i].bits;
    return out;
  };
  const segment whole{0, n};
  for (double t : {0.0, 1e-3, 1.0, 1e4}) {
    INFO("threshold ", t);
    auto ra = r0, rb = r0;
    const backend::feedback_source<T> sa{g.data(), ra.data(), n}, sb{g.data(), rb.data(), n};
    sparse_vector<T> a(n), b(n);
    std::size_t kept_a = 0, kept_b = 0;
    backend::cpu(2).select_above<true>(sa, {&whole, 1}, {&t, 1}, a, 0, {&kept_a, 1});
    backend::serial{}.select_above<true>(sb, {&whole, 1}, {&t, 1}, b, 0, {&kept_b, 1});
    CHECK(kept_a == kept_b);
    CHECK(test::entries(a) == test::entries(b));
    CHECK(bits(ra) == bits(rb));
  }
  // Moments and counts of every pattern, non-finite ones included.
  backend::cpu one_thread(1);
  test::oracle<backend::cpu>::compare_kernels<T>(one_thread, g, "every 16-bit pattern");
}

TEST_CASE_TEMPLATE("blocks after scattered values above a probe measure its tail as blocks that skip do", T, float,
                   double, float16, bfloat16) {
  // A moments block that follows one whose vectors above the probe were a scattered mix does
  // every vector's tail work (no skip). Here blocks alternate: scattered values above the
  // probe, then a block of values at, just below and far below it (zeros, denormals, its
  // own value), none above; then the reverse order, so each kind of block is met in both
  // modes. The tails must be the serial oracle's.
  const double probe = 0.5;
  const T at = T(probe), below = T(std::nextafter(double(T(probe)), 0.0)), far = T(0.01);
  std::vector<T> x;
  for (int round = 0; round < 4; ++round)
    for (int part = 0; part < 2; ++part)
      for (std::size_t i = 0; i < 1024; ++i) {
        const bool scattered = (part == 0) == (round % 2 == 0);
        if (scattered)
          x.push_back(i % 37 == 0 ? T((i % 2 ? -1.0 : 1.0) * (1.0 + double(i) / 512)) : far);
        else
          x.push_back(i % 5 == 0 ? at : i % 5 == 1 ? below : i % 5 == 2 ? T(-0.0) : i % 5 == 3 ? far
                                                                  : std::numeric_limits<T>::denorm_min());
      }
  const std::size_t n = x.size();
  const backend::plain_source<T> source{x.data(), n};
  const segment whole{0, n};
  moments got[2], want[2];
  backend::cpu(1).analyze<backend::pass_statistics<true, true, true>>(source, {&whole, 1}, {&probe, 1}, got);
  backend::serial{}.analyze<backend::pass_statistics<true, true, true>>(source, {&whole, 1}, {&probe, 1}, want);
  CHECK(want[1].count == 4 * 28);  // i % 37 == 0 in [0, 1024): 28 values a scattered block
  test::check_same_moments(got[0], want[0], test::log_tolerance<T>);
  test::check_same_tail<T>(got[1], want[1], probe, want[0].max);
  CHECK(std::fabs(got[1].sum_log - want[1].sum_log) <= test::log_tolerance<T> * (1 + std::fabs(want[1].sum_log)));
}

TEST_CASE("a range whose region fills just before its last kept value still settles the rest") {
  // Two ranges of 65,536 values; a hint of 1 gives each a region of 64 slots. The first 60
  // values of each range are kept: the next 16-value block might not fit, so the pass stops
  // there with nothing left to write, and the rest of the range must still be settled.
  const std::size_t n = std::size_t(1) << 17, half = n / 2;
  std::vector<float> g(n, 0.001f), r0(n, 0.5f);
  for (std::size_t i = 0; i < 60; ++i) g[i] = g[half + i] = 10.0f;
  auto ra = r0, rb = r0;
  const backend::feedback_source<float> sa{g.data(), ra.data(), n}, sb{g.data(), rb.data(), n};
  sparse_vector<float> a(n), b(n);
  const segment whole{0, n};
  const double t = 1.0;
  std::size_t kept = 0;
  backend::cpu(2).select_above<true>(sa, {&whole, 1}, {&t, 1}, a, 1, {&kept, 1});
  backend::serial{}.select_above<true>(sb, {&whole, 1}, {&t, 1}, b, 0, {&kept, 1});
  CHECK(b.size() == 120);
  CHECK(test::entries(a) == test::entries(b));
  CHECK(ra == rb);
}

TEST_CASE("per-segment passes: thousands of tiny segments and segments across thread ranges") {
  // 3,000 segments of 1 to 40 values, then one of 200,000: pieces smaller than a vector,
  // and a segment that two threads share.
  std::vector<segment> layout;
  std::size_t n = 0;
  for (std::size_t s = 0; s < 3000; ++s) {
    layout.push_back({n, 1 + s % 40});
    n += 1 + s % 40;
  }
  layout.push_back({n, 200000});
  n += 200000;
  const auto x = test::mixed_values<float>(n, 23, false);
  const backend::plain_source<float> source{x.data(), n};
  std::vector<double> thresholds(layout.size()), probes(layout.size());
  for (std::size_t s = 0; s < layout.size(); ++s) {
    thresholds[s] = 0.0005 * double(s % 7);
    probes[s] = 0.001 * double(1 + s % 5);
  }
  std::vector<moments> got(2 * layout.size()), want(2 * layout.size());
  backend::cpu cpu(2);
  backend::serial serial;
  cpu.analyze<backend::pass_statistics<true, true>>(source, layout, probes, got);
  serial.analyze<backend::pass_statistics<true, true>>(source, layout, probes, want);
  for (std::size_t s = 0; s < layout.size(); ++s) {
    INFO("segment ", s);
    test::check_same_moments(got[2 * s], want[2 * s], test::log_tolerance<float>);
    test::check_same_tail<float>(got[2 * s + 1], want[2 * s + 1], probes[s], want[2 * s].max);
  }
  sparse_vector<float> a, b;
  a.clear(n);
  b.clear(n);
  std::vector<std::size_t> kept(layout.size()), kept_serial(layout.size());
  cpu.select_above<true>(source, layout, thresholds, a, 1000, kept);
  serial.select_above<true>(source, layout, thresholds, b, 0, kept_serial);
  CHECK(test::entries(a) == test::entries(b));
  CHECK(kept == kept_serial);
}

TEST_CASE("two probes per segment, in either order, measure the serial oracle's tails") {
  // The moments pass under error feedback measures the base and the last threshold: the
  // kernels take them ascending (the lower gates the tails' work, every vector where values
  // above it are scattered) and give the tails back in the caller's order. Segments of
  // 100,000 values: probes far apart (one touching most vectors, one few), equal, both above
  // every value, one at 0; even segments ascending, odd ones descending.
  // (mixed_values: magnitudes of mean 1/300, 30% zeros.)
  const std::vector<std::pair<double, double>> pairs = {{0.002, 0.02}, {0.02, 0.002}, {0.01, 0.01},
                                                        {50.0, 80.0}, {0.0, 0.01}, {0.01, 0.0}};
  std::vector<segment> layout;
  std::vector<double> probes;
  std::size_t n = 0;
  for (const auto& [first, second] : pairs) {
    layout.push_back({n, 100000});
    n += 100000;
    probes.push_back(first);
    probes.push_back(second);
  }
  const auto x = test::mixed_values<float>(n, 29, false);
  const backend::plain_source<float> source{x.data(), n};
  std::vector<moments> got(3 * layout.size()), want(3 * layout.size());
  backend::cpu(2).analyze<backend::pass_statistics<true, true, true>>(source, layout, probes, got);
  backend::serial{}.analyze<backend::pass_statistics<true, true, true>>(source, layout, probes, want);
  for (std::size_t s = 0; s < layout.size(); ++s) {
    INFO("segment ", s, ": probes ", probes[2 * s], ", ", probes[2 * s + 1]);
    test::check_same_moments(got[3 * s], want[3 * s], test::log_tolerance<float>);
    for (std::size_t p = 0; p < 2; ++p) {
      test::check_same_tail<float>(got[3 * s + 1 + p], want[3 * s + 1 + p], probes[2 * s + p], want[3 * s].max);
      CHECK(std::fabs(got[3 * s + 1 + p].sum_log - want[3 * s + 1 + p].sum_log) <=
            test::log_tolerance<float> * (1 + std::fabs(want[3 * s + 1 + p].sum_log)));
    }
  }
  CHECK(want[1].count > want[2].count);  // the first segment's probes touch different counts
  CHECK(want[1].count > 0);
  CHECK(want[2].count > 0);
}

#if defined(SIDCO_HIGHWAY_KERNELS)
namespace {
// SIDCO_TEST_DISABLE_TARGETS=<Highway target bits>: a portable build runs every test on the
// best target left (set before the kernels choose theirs, at first use).
const std::int64_t disabled_targets = [] {
  const char* mask = std::getenv("SIDCO_TEST_DISABLE_TARGETS");
  const std::int64_t bits = mask ? std::int64_t(std::strtoll(mask, nullptr, 0)) : 0;
  if (bits != 0) hwy::DisableTargets(bits);
  return bits;
}();
}  // namespace
#endif

TEST_CASE("the kernels this build runs") {
  MESSAGE("backend::cpu kernels: " << std::string(backend::cpu::kernels()));
#if defined(SIDCO_HIGHWAY) && SIDCO_HIGHWAY && (defined(__AVX2__) || defined(__ARM_NEON))
  // Built with Highway for a SIMD target: the Highway kernels must be what runs.
  CHECK(backend::simd::active());
#endif
#if defined(SIDCO_HIGHWAY_KERNELS) && HWY_ARCH_X86
  if (backend::simd::dynamic_dispatch) {
    // Dispatched at run time: the best compiled target the CPU has and the test left on.
    const std::int64_t left = hwy::SupportedTargets() & SIDCO_SIMD_TARGETS;
    CHECK(backend::simd::chosen_target() == (left & -left));
    CHECK((backend::simd::chosen_target() & disabled_targets) == 0);
    if (hwy::SupportedTargets() & HWY_SSE4) CHECK(backend::simd::active());
  }
#endif
}

TEST_CASE("fast_log is within 2e-7 (float) and 1e-14 (double) of max(|ln a|, 1)") {
  // Every float exponent and a sweep of mantissas, denormals included; random doubles.
  double worst_float = 0, worst_double = 0;
  for (std::uint32_t bits = 1; bits < 0x7f800000u; bits += 4099) {
    const float a = std::bit_cast<float>(bits);
    const double want = std::log(double(a));
    worst_float = std::max(worst_float, std::fabs(double(fast_log(a)) - want) / std::max(std::fabs(want), 1.0));
  }
  std::mt19937_64 rng(8);
  for (int i = 0; i < 1000000; ++i) {
    const double a = std::bit_cast<double>(1 + rng() % (0x7ff0000000000000ull - 1));
    const double want = std::log(a);
    worst_double = std::max(worst_double, std::fabs(fast_log(a) - want) / std::max(std::fabs(want), 1.0));
  }
  INFO("worst float ", worst_float, ", worst double ", worst_double);
  CHECK(worst_float < 2e-7);
  CHECK(worst_double < 1e-14);
}

TEST_CASE("a compressor's selections and residuals do not depend on the thread count") {
  // Moments are folded per 2^16-value unit in order, so 1, 2 and 3 threads give the same
  // thresholds bit for bit: workers with different OMP_NUM_THREADS stay in step.
  using preset = presets::sidco_e<backend::cpu>;
  for (const auto& file : test::gradient_files()) {
    const auto g = test::load_gradient(file);
    std::vector<std::vector<std::pair<std::size_t, float>>> reference;
    std::vector<float> reference_residual;
    for (int threads : {1, 2, 3}) {
      INFO(file, ", ", threads, " threads");
      preset c(typename preset::estimator_type{}, {}, backend::cpu(threads));
      feedback::residual<float> residual(g.size());
      sparse_vector<float> out;
      for (int call = 0; call < 4; ++call) {
        c.compress<float>(g, 0.01, out, residual);
        if (threads == 1)
          reference.push_back(test::entries(out));
        else
          REQUIRE(test::entries(out) == reference[std::size_t(call)]);
      }
      const std::vector<float> r(residual.data(), residual.data() + residual.size());
      if (threads == 1)
        reference_residual = r;
      else
        CHECK(r == reference_residual);
    }
  }
}
