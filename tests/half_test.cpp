// The host 16-bit types: exact conversions (checked against nearest-by-enumeration for both, and
// against the compiler's _Float16 where it has one: g++, not clang 14 on x86-64), threshold keys that agree with a compare in
// double, and the compressors on 16-bit gradients against the serial oracle.
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "doctest.hpp"
#include <sidco/sidco.hpp>

#include "reference.hpp"
#include "support.hpp"

// Named after the file: the test programs compile several test files as one unit.
namespace half_test {

using namespace sidco;

namespace {

std::vector<float> interesting_floats() {
  std::vector<float> out = {0.0f, -0.0f, 1.0f, -1.0f, 65504.0f, 65519.99f, 65520.0f, 65536.0f, 1e-8f, 5.96e-8f,
                            2.98e-8f, 2.9802322e-8f, 6.1035156e-5f, 6.1e-5f, 3.4e38f, -3.4e38f, 1.0e-45f,
                            std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                            std::numeric_limits<float>::denorm_min(), std::numeric_limits<float>::min()};
  // Every float whose top 16 bits take each value, with halfway and near-halfway low bits.
  for (std::uint32_t high = 0; high < 0x10000; ++high)
    for (std::uint32_t low : {0x0000u, 0x0001u, 0x7fffu, 0x8000u, 0x8001u, 0xffffu, 0x1000u, 0x0fffu})
      out.push_back(std::bit_cast<float>((high << 16) | low));
  std::mt19937 rng(7);
  for (int i = 0; i < 1000000; ++i) out.push_back(std::bit_cast<float>(std::uint32_t(rng())));
  return out;
}

// The bfloat16 nearest to f (ties to the even one), by comparing the two candidates in double.
std::uint16_t nearest_bfloat16(float f) {
  const std::uint32_t x = std::bit_cast<std::uint32_t>(f);
  const std::uint16_t down = std::uint16_t(x >> 16), up = std::uint16_t(down + 1);
  const double a = double(std::bit_cast<float>(std::uint32_t(down) << 16));
  // One step past the largest finite value is 2^128 (IEEE: rounds to infinity from there).
  const bool overflow = (up & 0x7fffu) == 0x7f80u;
  const double b = overflow ? std::copysign(std::ldexp(1.0, 128), a) : double(std::bit_cast<float>(std::uint32_t(up) << 16));
  if ((x & 0xffffu) == 0) return down;
  const double d = std::fabs(double(f) - a), e = std::fabs(b - double(f));
  return d < e || (d == e && !(down & 1)) ? down : up;
}

// The value of a binary16 bit pattern, decoded from its fields; the infinity pattern stands
// for 2^16, where IEEE rounding with an unbounded exponent overflows.
double float16_value(std::uint16_t bits) {
  const int exponent = (bits >> 10) & 0x1f, mantissa = bits & 0x3ff;
  const double sign = bits & 0x8000u ? -1.0 : 1.0;
  if (exponent == 0x1f) return mantissa ? std::nan("") : sign * 65536.0;
  if (exponent == 0) return sign * std::ldexp(double(mantissa), -24);
  return sign * std::ldexp(double(1024 + mantissa), exponent - 25);
}

// The binary16 nearest to f (ties to the even one), by binary search over the ordered
// non-negative patterns 0 .. 0x7c00 and a compare in double.
std::uint16_t nearest_float16(float f) {
  const std::uint16_t sign = std::signbit(f) ? 0x8000u : 0u;
  const double a = std::fabs(double(f));
  if (a >= 65536.0) return sign | 0x7c00u;
  std::uint16_t low = 0, high = 0x7c00;  // value(low) <= a < value(high)
  while (high - low > 1) {
    const auto mid = std::uint16_t((low + high) / 2);
    (float16_value(mid) <= a ? low : high) = mid;
  }
  const double d = a - float16_value(low), e = float16_value(high) - a;
  return sign | (d < e || (d == e && !(low & 1)) ? low : high);
}

}  // namespace

TEST_CASE("float16: every conversion is the nearest value, ties to even") {
  for (std::uint32_t bits = 0; bits < 0x10000; ++bits) {
    const float f = float(float16::from_bits(std::uint16_t(bits)));
    const double expected = float16_value(std::uint16_t(bits));
    if (std::isnan(expected)) {
      REQUIRE(std::isnan(f));
      continue;
    }
    if (std::fabs(expected) == 65536.0)
      REQUIRE(f == std::copysign(std::numeric_limits<float>::infinity(), float(expected)));
    else
      REQUIRE(std::bit_cast<std::uint32_t>(f) == std::bit_cast<std::uint32_t>(float(expected)));
    REQUIRE(float16(f).bits == bits);  // round trip
  }
  for (const float f : interesting_floats()) {
    INFO(f, " ", std::bit_cast<std::uint32_t>(f));
    if (std::isnan(f))
      REQUIRE(std::isnan(float(float16(f))));
    else
      REQUIRE(float16(f).bits == nearest_float16(f));
  }
}

#ifdef __FLT16_MAX__
TEST_CASE("float16: every conversion matches the compiler's _Float16") {
  for (std::uint32_t bits = 0; bits < 0x10000; ++bits) {
    const float16 h = float16::from_bits(std::uint16_t(bits));
    _Float16 reference;
    std::memcpy(&reference, &bits, 2);
    const float mine = float(h), theirs = float(reference);
    if (std::isnan(theirs)) {
      REQUIRE(std::isnan(mine));
      continue;
    }
    REQUIRE(std::bit_cast<std::uint32_t>(mine) == std::bit_cast<std::uint32_t>(theirs));
    REQUIRE(float16(mine).bits == bits);  // round trip
  }
  for (const float f : interesting_floats()) {
    const _Float16 reference = static_cast<_Float16>(f);
    std::uint16_t theirs;
    std::memcpy(&theirs, &reference, 2);
    const std::uint16_t mine = float16(f).bits;
    INFO(f, " ", std::bit_cast<std::uint32_t>(f));
    if (std::isnan(f))
      REQUIRE(std::isnan(float(float16::from_bits(mine))));
    else
      REQUIRE(mine == theirs);
  }
}
#endif

TEST_CASE("bfloat16: every conversion is the nearest value, ties to even") {
  for (std::uint32_t bits = 0; bits < 0x10000; ++bits) {
    const float f = float(bfloat16::from_bits(std::uint16_t(bits)));
    REQUIRE(std::bit_cast<std::uint32_t>(f) == bits << 16);
    if (!std::isnan(f)) REQUIRE(bfloat16(f).bits == bits);
  }
  for (const float f : interesting_floats()) {
    INFO(f);
    if (std::isnan(f))
      REQUIRE(std::isnan(float(bfloat16(f))));
    else
      REQUIRE(bfloat16(f).bits == nearest_bfloat16(f));
  }
}

TEST_CASE_TEMPLATE("16-bit threshold keys: |v| > t in 16 bits exactly when |v| > t in double", H, float16, bfloat16) {
  std::mt19937_64 rng(11);
  // -0.0 too: it selects what 0.0 selects (an earlier host key made it select the zeros).
  std::vector<double> thresholds = {-1.0,  -0.0,   0.0,  std::numeric_limits<double>::quiet_NaN(),
                                    1e-40, 5.9e-8, 6e-8, 1e-5, 0.001, 0.5, 1.0, 1.0000001, 65504.0, 65505.0, 1e30,
                                    3.5e38, std::numeric_limits<double>::infinity()};
  std::uniform_real_distribution<double> exponent(-45, 40);
  for (int i = 0; i < 2000; ++i) thresholds.push_back(std::pow(10.0, exponent(rng)));
  std::size_t wrong = 0;
  double first_t = 0;
  std::uint32_t first_bits = 0;
  for (const double t : thresholds) {
    const auto key = threshold_key<H>(t);
    for (std::uint32_t bits = 0; bits < 0x10000; ++bits) {
      const H v = H::from_bits(std::uint16_t(bits));
      if (std::isnan(float(v))) continue;
      if (exceeds<H>(signed_key(v), key) != (std::fabs(double(v)) > t) && wrong++ == 0) {
        first_t = t;
        first_bits = bits;
      }
    }
  }
  INFO("first disagreement: t = ", first_t, ", bits ", first_bits);
  CHECK(wrong == 0);
}

TEST_CASE_TEMPLATE("compressors on 16-bit gradients: the cpu backend selects what the serial oracle selects", H,
                   float16, bfloat16) {
  // A real gradient rounded to 16 bits, with error feedback over several calls.
  const auto g32 = test::load_gradient("ffn_it200.npy");
  std::vector<H> g(g32.size());
  for (std::size_t i = 0; i < g.size(); ++i) g[i] = H(g32[i]);
  auto run = [&](auto serial, auto cpu) {
    feedback::residual<H> rs(g.size()), rc(g.size());
    for (int call = 0; call < 4; ++call) {
      sparse_vector<H> a, b;
      const auto ra = serial.template compress<H>(g, 0.01, a, rs);
      const auto rb = cpu.template compress<H>(g, 0.01, b, rc);
      INFO("call ", call);
      CHECK(test::entries(a) == test::entries(b));
      CHECK(std::equal(rs.values().begin(), rs.values().end(), rc.values().begin(), rc.values().end(),
                       [](H x, H y) { return x.bits == y.bits; }));
      // sent + new residual = gradient + old residual, in H's own arithmetic (float, rounded once).
      CHECK(ra.selected == rb.selected);
      CHECK(ra.selected > 0);
    }
  };
  run(presets::top_k<backend::serial>{}, presets::top_k<backend::cpu>{});
  run(presets::sidco_e_exact<backend::serial>{}, presets::sidco_e_exact<backend::cpu>{});
  run(presets::random_k<backend::serial>{}, presets::random_k<backend::cpu>{});
  // Threshold methods: the thresholds come from sums whose last bits differ between the
  // backends (double against float lanes), so the counts agree to within ties.
  feedback::residual<H> r(g.size());
  presets::sidco_e<backend::cpu> c;
  sparse_vector<H> out;
  for (int call = 0; call < 8; ++call) {
    const std::vector<H> before(r.values().begin(), r.values().end());
    const auto report = c.compress<H>(g, 0.01, out, r);
    CHECK(report.density_ratio() > 0.5);
    CHECK(report.density_ratio() < 2.0);
    std::vector<H> sent(g.size(), H(0.0f));
    for (std::size_t j = 0; j < out.size(); ++j) sent[out.indices()[j]] = out.values()[j];
    for (std::size_t i = 0; i < g.size(); ++i) {
      const H total(float(g[i]) + float(before[i]));
      REQUIRE(float(sent[i]) + float(r.values()[i]) == float(total));
    }
  }
}

}  // namespace half_test
