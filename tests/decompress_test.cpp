#include <string>
#include <vector>

#include "doctest.hpp"
#include <sidco/sidco.hpp>

#include "support.hpp"

// Named after the file: the test programs compile several test files as one unit.
namespace decompress_test {

using namespace sidco;

TEST_CASE_TEMPLATE("decompress and scatter-add rebuild the dense sum", T, float, double) {
  sparse_vector<T> a(6), b(6);
  a.push_back(0, T(1));
  a.push_back(4, T(2));
  b.push_back(4, T(10));
  b.push_back(5, T(-3));
  CHECK(decompress(a) == std::vector<T>{1, 0, 0, 0, 2, 0});
  std::vector<T> dense(6, T(7));
  decompress(a, std::span<T>(dense));
  CHECK(dense == std::vector<T>{1, 0, 0, 0, 2, 0});
  const std::vector<sparse_vector<T>> both = {a, b};
  std::vector<T> sum(6, T(1));
  scatter_add(std::span<const sparse_vector<T>>(both), std::span<T>(sum), T(0.5));
  CHECK(sum == std::vector<T>{1.5, 1, 1, 1, 7, -0.5});
}

TEST_CASE("decompress of a compressed real gradient equals it where selected, 0 elsewhere") {
  const auto g = test::load_gradient("ffn_it10.npy");
  presets::sidco_gamma_gp<> c;
  sparse_vector<float> out;
  const auto report = c.compress<float>(g, 0.01, out);
  const auto dense = decompress(out);
  for (std::size_t i = 0; i < g.size(); ++i)
    REQUIRE(dense[i] == (std::fabs(g[i]) > report.threshold ? g[i] : 0.0f));
}

TEST_CASE("scatter-add refuses a wrong dense size or an index out of range, writing nothing") {
  sparse_vector<float> s(4);
  s.push_back(1, 1.f);
  std::vector<float> wrong(5, 0.f);
  try {
    scatter_add(s, std::span<float>(wrong));
    FAIL("no error");
  } catch (const sidco::error& e) {
    CHECK(std::string(e.what()).find("dense: size 5 does not match") != std::string::npos);
  }
  sparse_vector<float> bad(4);
  bad.push_back(1, 1.f);
  bad.push_back(9, 1.f);
  std::vector<float> dense(4, 0.f);
  CHECK_THROWS_WITH_AS(scatter_add(bad, std::span<float>(dense)),
                       doctest::Contains("index 9 at position 1 is out of range"), sidco::error);
  CHECK(dense == std::vector<float>(4, 0.f));  // the valid entry before it was not added either
}

}  // namespace decompress_test
