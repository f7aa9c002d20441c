// backend::cpu against the serial oracle: every kernel, every length in [0, 2 blocks + 65]
// at several misalignments, and the real gradients with 1, 2 and 3 threads.
#include <array>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include <doctest/doctest.h>
#include <sidco/backend/cpu.hpp>
#include <sidco/backend/serial.hpp>
#include <sidco/backend/source.hpp>
#include <sidco/core/fast_log.hpp>

#include "reference.hpp"
#include "support.hpp"

using namespace sidco;

namespace {

// Float sums run in T lanes over blocks of 1024 before they reach double.
template <class T>
constexpr double sum_tolerance = std::is_same_v<T, float> ? 2e-6 : 1e-13;

void check_same_moments(const moments& got, const moments& want, double tolerance) {
  CHECK(got.count == want.count);
  CHECK(got.zeros == want.zeros);
  CHECK(got.nonfinite == want.nonfinite);
  CHECK(got.min == want.min);
  CHECK(got.max == want.max);
  CHECK(got.sum == doctest::Approx(want.sum).epsilon(tolerance));
  CHECK(got.sum_sq == doctest::Approx(want.sum_sq).epsilon(tolerance));
  CHECK(got.sum_log == doctest::Approx(want.sum_log).epsilon(tolerance));
}

template <class T>
std::vector<T> mixed_values(std::size_t n, std::uint64_t seed, bool with_nonfinite) {
  std::mt19937_64 rng(seed);
  std::exponential_distribution<double> magnitude(300.0);
  std::uniform_real_distribution<double> u(0, 1);
  std::vector<T> x(n);
  for (auto& v : x) {
    const double pick = u(rng);
    if (pick < 0.3)
      v = pick < 0.15 ? T(0) : T(-0.0);
    else if (with_nonfinite && pick > 0.995)
      v = pick > 0.998 ? std::numeric_limits<T>::quiet_NaN() : -std::numeric_limits<T>::infinity();
    else if (pick > 0.99)
      v = std::numeric_limits<T>::denorm_min() * T(1 + 100 * u(rng));
    else
      v = T((u(rng) < 0.5 ? -1 : 1) * magnitude(rng));
  }
  return x;
}

template <class T, class Index>
void compare_selections(const backend::plain_source<T>& source, double t, const backend::cpu& cpu) {
  sparse_vector<T, Index> b(source.size);
  b.push_back(0, T(7));
  backend::serial{}.select_above<true>(source, t, b);
  // Hints of the kept count: none (two passes), far too few (every region fills and the rest
  // is written after), exact, and far too many.
  const std::size_t kept = b.size() - 1;
  for (std::size_t hint : {std::size_t(0), std::size_t(1), kept, 10 * kept + 100}) {
    INFO("hint ", hint, ", index bytes ", sizeof(Index));
    sparse_vector<T, Index> a(source.size);
    a.push_back(0, T(7));  // appends after what is there
    cpu.template select_above<true>(source, t, a, hint);
    CHECK(test::entries(a) == test::entries(b));
  }
}

template <class T>
void compare_kernels(std::span<const T> x, const backend::cpu& cpu, const std::string& what) {
  INFO(what, ", n = ", x.size());
  const backend::serial serial;
  const backend::plain_source<T> source{x.data(), x.size()};
  check_same_moments(cpu.template magnitudes<false>(source), serial.magnitudes<false>(source),
                     sum_tolerance<T>);
  // ln|x|: the fast log's own error (2e-7 of max(|ln a|, 1) for float) adds up over the sum.
  check_same_moments(cpu.template magnitudes<true>(source), serial.magnitudes<true>(source),
                     std::is_same_v<T, float> ? 4e-6 : 1e-12);
  const moments counted = cpu.counts(source), all = serial.magnitudes<false>(source);
  CHECK(counted.zeros == all.zeros);
  CHECK(counted.nonfinite == all.nonfinite);
  CHECK(counted.count == all.count);
  std::array<std::uint64_t, 4096> h_cpu{}, h_serial{};
  cpu.key_histogram(source, 8 * int(sizeof(T)) - 13, h_cpu);
  serial.key_histogram(source, 8 * int(sizeof(T)) - 13, h_serial);
  CHECK(h_cpu == h_serial);
  for (double t : {-1.0, 0.0, 1e-40, 0.001, 0.003, 0.01, 1e30, double(std::numeric_limits<float>::denorm_min())}) {
    INFO("threshold ", t);
    CHECK(cpu.count_above(source, t) == serial.count_above(source, t));
    compare_selections<T, std::uint64_t>(source, t, cpu);
    // Indices as wide as the values: the SIMD kernels' own path, when built with them.
    compare_selections<T, magnitude_key_t<T>>(source, t, cpu);
    std::vector<T> ea, eb;
    const moments ma = cpu.template excess<false>(source, t, ea);
    const moments mb = serial.excess<false>(source, t, eb);
    CHECK(ea == eb);
    // The moments pass that also keeps the exceedances, one pass or two, region overflow
    // included.
    for (std::size_t hint : {std::size_t(0), std::size_t(1), eb.size(), 10 * eb.size() + 100}) {
      INFO("kept during the moments pass, hint ", hint);
      std::vector<T> kept{T(3), T(4)};  // replaced
      bool complete = false;
      check_same_moments(cpu.template magnitudes_above<true>(source, t, kept, hint, std::size_t(-1), complete),
                         serial.magnitudes<true>(source),
                         std::is_same_v<T, float> ? 4e-6 : 1e-12);
      CHECK(complete);
      CHECK(kept == eb);
      // Far more exceed t than the limit allows: the moments still come, nothing is kept.
      if (eb.size() > 1000) {
        check_same_moments(cpu.template magnitudes_above<false>(source, t, kept, hint, eb.size() / 10, complete),
                           serial.magnitudes<false>(source), sum_tolerance<T>);
        CHECK_FALSE(complete);
        CHECK(kept.empty());
      }
    }
    // Excesses are computed in T (a - T(t)), the oracle's in double: they agree to T's
    // rounding on the scale of the largest magnitude.
    CHECK(ma.count == mb.count);
    CHECK(ma.nonfinite == mb.nonfinite);
    const double slack = 4 * double(std::numeric_limits<T>::epsilon()) * (mb.max + std::fabs(t));
    const double n = double(mb.count);
    if (mb.count > 0 && t >= 0 && t < 1) {
      CHECK(std::fabs(ma.sum - mb.sum) <= sum_tolerance<T> * mb.sum + n * slack);
      CHECK(std::fabs(ma.max - mb.max) <= slack);
    }
  }
}

}  // namespace

TEST_CASE_TEMPLATE("cpu kernels equal the serial oracle at every short length and alignment", T,
                   float, double) {
  const auto data = mixed_values<T>(2 * 1024 + 65 + 3, 17, true);
  const backend::cpu one_thread(1);
  for (std::size_t misalign = 0; misalign < 4; ++misalign)
    for (std::size_t n = 0; n + misalign <= data.size(); n += (n < 80 ? 1 : 37))
      compare_kernels<T>(std::span<const T>(data.data() + misalign, n), one_thread,
                         "misaligned by " + std::to_string(misalign));
}

TEST_CASE("cpu kernels equal the serial oracle on real gradients with 1, 2 and 3 threads") {
  for (const auto& file : {"ffn_it10.npy", "cnn_it200.npy", "lstm_it10.npy"}) {
    const auto g = test::load_gradient(file);
    for (int threads : {1, 2, 3}) compare_kernels<float>(g, backend::cpu(threads), std::string(file) + ", " + std::to_string(threads) + " threads");
  }
}

TEST_CASE_TEMPLATE("cpu selection settles error feedback exactly as the oracle does", T, float,
                   double) {
  const auto g = mixed_values<T>(200003, 5, false);
  const auto r0 = mixed_values<T>(200003, 6, false);
  const backend::cpu cpu(3);
  const backend::serial serial;
  for (double t : {0.0, 0.002, 0.01}) {
    auto ra = r0, rb = r0;
    const backend::feedback_source<T> sa{g.data(), ra.data(), g.size()}, sb{g.data(), rb.data(), g.size()};
    sparse_vector<T> b(g.size());
    serial.select_above<true>(sb, t, b);
    for (std::size_t hint : {std::size_t(0), std::size_t(1), b.size()}) {
      INFO("hint ", hint);
      ra = r0;
      sparse_vector<T> a(g.size());
      cpu.template select_above<true>(sa, t, a, hint);
      CHECK(test::entries(a) == test::entries(b));
      CHECK(ra == rb);
    }
    sparse_vector<T> a(g.size());
    // The deferred path: settle as unsent, then a band, exactly as exact_k uses it.
    ra = r0;
    rb = r0;
    a.clear(g.size());
    b.clear(g.size());
    cpu.template select_above<false>(sa, t + 0.01, a);
    serial.select_above<false>(sb, t + 0.01, b);
    cpu.select_band(sa, t, t + 0.01, a);
    serial.select_band(sb, t, t + 0.01, b);
    CHECK(test::entries(a) == test::entries(b));
    CHECK(ra == rb);
  }
  std::vector<std::size_t> chosen;
  for (std::size_t i = 0; i < g.size(); i += 97) chosen.push_back(i);
  auto ra = r0, rb = r0;
  const backend::feedback_source<T> sa{g.data(), ra.data(), g.size()}, sb{g.data(), rb.data(), g.size()};
  sparse_vector<T> a(g.size()), b(g.size());
  cpu.select_indices(sa, std::span<const std::size_t>(chosen), a);
  serial.select_indices(sb, std::span<const std::size_t>(chosen), b);
  CHECK(test::entries(a) == test::entries(b));
  CHECK(ra == rb);
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
  backend::cpu(2).select_above<true>(sa, 1.0, a, 1);
  backend::serial{}.select_above<true>(sb, 1.0, b);
  CHECK(b.size() == 120);
  CHECK(test::entries(a) == test::entries(b));
  CHECK(ra == rb);
}

TEST_CASE("the kernels this build runs") {
  MESSAGE("backend::cpu kernels: " << std::string(backend::cpu::kernels));
#if defined(SIDCO_HIGHWAY) && SIDCO_HIGHWAY && (defined(__AVX2__) || defined(__ARM_NEON))
  // Built with Highway for a SIMD target: the Highway kernels must be what runs.
  CHECK(backend::simd::available);
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
