#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "doctest.hpp"
#include <sidco/core/moments.hpp>

// Named after the file: the test programs compile several test files as one unit.
namespace moments_test {

using sidco::moments;

TEST_CASE("moments count zeros and non-finite values apart from the sums") {
  moments m;
  for (double a : {0.0, 1.0, 2.0, 0.0, std::numeric_limits<double>::infinity(),
                   std::numeric_limits<double>::quiet_NaN(), 4.0})
    m.add(a);
  CHECK(m.count == 7);
  CHECK(m.zeros == 2);
  CHECK(m.nonfinite == 2);
  CHECK(m.nonzero() == 3);
  CHECK(m.sum == 7.0);
  CHECK(m.sum_sq == 21.0);
  CHECK(m.sum_log == doctest::Approx(std::log(8.0)));
  CHECK(m.min == 1.0);
  CHECK(m.max == 4.0);
  CHECK(m.mean() == doctest::Approx(7.0 / 3));
  CHECK(m.variance() == doctest::Approx(21.0 / 3 - 49.0 / 9));
}

TEST_CASE("moments merged from blocks equal the moments of the whole") {
  std::mt19937_64 rng(7);
  std::exponential_distribution<double> draw(3.0);
  std::vector<double> a(10007);
  for (auto& v : a) v = (rng() % 5 == 0) ? 0.0 : draw(rng);
  moments whole;
  for (double v : a) whole.add(v);
  moments merged;
  for (std::size_t start = 0; start < a.size(); start += 1000) {
    moments block;
    for (std::size_t i = start; i < std::min(a.size(), start + 1000); ++i) block.add(a[i]);
    merged.merge(block);
  }
  CHECK(merged.count == whole.count);
  CHECK(merged.zeros == whole.zeros);
  CHECK(merged.min == whole.min);
  CHECK(merged.max == whole.max);
  CHECK(merged.sum == doctest::Approx(whole.sum).epsilon(1e-12));
  CHECK(merged.sum_sq == doctest::Approx(whole.sum_sq).epsilon(1e-12));
  CHECK(merged.sum_log == doctest::Approx(whole.sum_log).epsilon(1e-12));
}

TEST_CASE("moments without log leave sum_log untouched") {
  moments m;
  m.add<false>(2.0);
  m.add<false>(3.0);
  CHECK(m.sum_log == 0.0);
  CHECK(m.sum == 5.0);
}

TEST_CASE("with_zeros_as_sample puts the zeros into mean and variance, not into ln") {
  moments m;
  for (double a : {0.0, 0.0, 2.0, 4.0}) m.add(a);
  const moments z = m.with_zeros_as_sample();
  CHECK(z.nonzero() == 4);
  CHECK(z.mean() == doctest::Approx(1.5));
  CHECK(z.variance() == doctest::Approx(5.0 - 2.25));
  CHECK(z.mean_log() == doctest::Approx(m.mean_log()));
  CHECK(z.min == 0.0);
}

TEST_CASE("empty moments have zero mean and variance") {
  moments m;
  CHECK(m.nonzero() == 0);
  CHECK(m.mean() == 0.0);
  CHECK(m.variance() == 0.0);
}

}  // namespace moments_test
