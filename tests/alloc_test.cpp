// Counts heap allocations to show that a compress call reusing its output allocates nothing.
#include <cstdint>
#include <vector>

#include "doctest.hpp"
#include <sidco/comm/reduce_scatter.hpp>
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

TEST_CASE("a warm reduce-exchange owner selects without allocating") {
  // The owner's selection, step after step: its buffers are kept, so only the first steps
  // allocate. k = 2000 of 200,000 runs its SIDCo + exact_k compressor; 50,000 of them, the
  // owner's own Top-k (direct_share).
  const auto g = sidco::test::load_gradient("cnn_it200.npy");
  const std::size_t count = 200000;
  for (const std::size_t k : {std::size_t(2000), std::size_t(50000)}) {
    sidco::comm::owner_sidco_e owner;
    std::vector<std::uint32_t> indices(count);
    std::vector<float> values(count);
    auto step = [&] {
      for (std::size_t i = 0; i < count; ++i) {
        indices[i] = std::uint32_t(3 * i);
        values[i] = g[i];
      }
      return owner.select(indices.data(), values.data(), count, k);
    };
    step();
    step();
    for (int call = 0; call < 5; ++call) {
      const long before = allocations.load();
      const std::size_t kept = step();
      CHECK(allocations.load() - before == 0);
      CHECK(kept == k);
    }
  }
}
