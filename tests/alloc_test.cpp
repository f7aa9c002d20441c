// Counts heap allocations to show that a compress call reusing its output allocates nothing.
#include <atomic>
#include <cstdlib>
#include <new>

#include <doctest/doctest.h>
#include <sidco/sidco.hpp>

#include "support.hpp"

namespace {
std::atomic<long> allocations{0};
}

void* operator new(std::size_t size) {
  ++allocations;
  if (void* p = std::malloc(size ? size : 1)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }

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
