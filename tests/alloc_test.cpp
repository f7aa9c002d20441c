// Counts heap allocations to show that a compress call reusing its output allocates nothing.
#include <doctest/doctest.h>
#include <sidco/sidco.hpp>

#include "counting_new.hpp"
#include "support.hpp"

namespace {
auto& allocations = sidco::test::heap_allocations;
}  // namespace

TEST_CASE("no allocation after the first call at a given size and density") {
  const auto g = sidco::test::load_gradient("cnn_it200.npy");
  sidco::presets::sidco_gamma_gp<> c;
  sidco::feedback::residual<float> residual(g.size());
  sidco::sparse_vector<float> out;
  c.compress<float>(g, 0.01, out, residual);
  c.compress<float>(g, 0.01, out, residual);  // settles the capacity for this density
  for (int call = 0; call < 5; ++call) {
    const long before = allocations.load();
    c.compress<float>(g, 0.01, out, residual);
    CHECK(allocations.load() - before == 0);
  }
}
