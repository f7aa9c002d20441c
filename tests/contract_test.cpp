// Everything outside a backend goes through the backend contract: every method of the
// registry, with and without error feedback, DGC with momentum, exact_k's rescans and
// segmented layouts run on a backend whose memory counts each element access made outside a
// backend member (none allowed) and has no element access on its views and buffers (code
// that indexes them does not compile). Results equal backend::serial's on plain host memory.
#include <span>
#include <string>
#include <vector>

#include "doctest.hpp"
#include <sidco/sidco.hpp>

#include "backend_oracle.hpp"
#include "support.hpp"
#include "tracked_backend.hpp"

// Named after the file: the test programs compile several test files as one unit.
namespace contract_test {

using namespace sidco;
namespace tracked = sidco::test::tracked;

namespace {

using tracked_memory = tracked::memory;
using move = test::transfer<tracked_memory>;

// Compresses g (twice, with feedback when asked: probes and adaptive state come into play on
// the second call) with the same method on the tracked backend and on backend::serial.
template <class Tracked, class Serial>
void same_results(const std::string& name, std::span<const float> g, double delta, bool feedback) {
  INFO(name, feedback ? " with error feedback" : "");
  const auto gradient = move::upload<float>(g);
  const tracked_memory::view<const float> view(gradient.data(), g.size());
  Tracked t;
  Serial s;
  sparse_vector<float, std::uint32_t, tracked_memory> out_t;
  sparse_vector<float> out_s;
  feedback::residual<float, tracked_memory> residual_t(g.size());
  feedback::residual<float> residual_s(g.size());
  const long before = tracked::outside.load();
  for (int call = 0; call < 2; ++call) {
    const auto rt = feedback ? t.template compress<float>(view, delta, out_t, residual_t)
                             : t.template compress<float>(view, delta, out_t);
    const auto rs = feedback ? s.template compress<float>(g, delta, out_s, residual_s)
                             : s.template compress<float>(g, delta, out_s);
    CHECK(rt.threshold == rs.threshold);
    CHECK(move::entries(out_t) == test::entries(out_s));
    if (feedback) {
      const auto r = move::download<const float>(residual_t.values());
      CHECK(std::equal(r.begin(), r.end(), residual_s.values().begin()));
    }
  }
  CHECK(tracked::outside.load() == before);
}

// A composition on the tracked backend against the same on backend::serial, with and
// without error feedback.
template <class Estimator, class Selection>
void check_composition(const std::string& name, std::span<const float> g, double delta) {
  using on_tracked = compressor<Estimator, Selection, tracked::backend>;
  using on_serial = compressor<Estimator, Selection, backend::serial>;
  same_results<on_tracked, on_serial>(name, g, delta, false);
  same_results<on_tracked, on_serial>(name, g, delta, true);
}

}  // namespace

TEST_CASE("every method of the registry goes through the backend contract only") {
  const auto g = test::load_gradient("ffn_it200.npy");
  const long inside_before = tracked::inside.load();
  for (double delta : {0.01, 0.001}) {
    methods::all::for_each([&](auto entry) {
      using method = typename decltype(entry)::type;
      check_composition<typename method::estimator, typename method::selection>(std::string(method::about.name), g,
                                                                                 delta);
    });
    // Compositions outside the registry that take other paths: exact_k's rescans after the
    // original fit, a trimmed SIDCo.
    check_composition<methods::sidco_e_paper::estimator, select::exact_k>("sidco-e-paper exact_k (rescans)", g, delta);
    check_composition<methods::sidco_gp::estimator, select::trimmed<0>>("sidco-gp trimmed", g, delta);
  }
  CHECK(tracked::inside.load() > inside_before);  // the control: accesses are counted
}

TEST_CASE("DGC momentum and segmented layouts go through the contract only") {
  const auto g = test::load_gradient("ffn_it200.npy");
  const auto gradient = move::upload<float>(g);
  const tracked_memory::view<const float> view(gradient.data(), g.size());
  const long before = tracked::outside.load();

  presets::dgc<tracked::backend> dgc_t;
  presets::dgc<backend::serial> dgc_s;
  feedback::momentum<float, tracked_memory> state_t(g.size(), 0.9f);
  feedback::momentum<float> state_s(g.size(), 0.9f);
  sparse_vector<float, std::uint32_t, tracked_memory> out_t;
  sparse_vector<float> out_s;
  for (int call = 0; call < 3; ++call) {
    dgc_t.compress<float>(view, 0.01, out_t, state_t);
    dgc_s.compress<float>(g, 0.01, out_s, state_s);
    CHECK(move::entries(out_t) == test::entries(out_s));
  }

  const std::vector<segment> layout = {{0, 1000}, {1000, 64}, {1064, g.size() - 1064}};
  segmented<presets::sidco_e<tracked::backend>> layered_t(layout);
  segmented<presets::sidco_e<backend::serial>> layered_s(layout);
  segmented<presets::sidco_e_exact<tracked::backend>> exact_t(layout);
  segmented<presets::sidco_e_exact<backend::serial>> exact_s(layout);
  feedback::residual<float, tracked_memory> residual_t(g.size());
  feedback::residual<float> residual_s(g.size());
  for (int call = 0; call < 3; ++call) {
    layered_t.compress<float>(view, 0.01, out_t, residual_t);
    layered_s.compress<float>(g, 0.01, out_s, residual_s);
    CHECK(move::entries(out_t) == test::entries(out_s));
    exact_t.compress<float>(view, 0.001, out_t);
    exact_s.compress<float>(g, 0.001, out_s);
    CHECK(move::entries(out_t) == test::entries(out_s));
  }
  CHECK(tracked::outside.load() == before);
}

TEST_CASE("the tracked memory does see an access made outside a backend") {
  std::vector<float> x = {1.f, -2.f};
  const backend::plain_source<float, tracked_memory> source{tracked_memory::pointer<const float>(x.data()), 2};
  const long before = tracked::outside.load();
  CHECK(source.value(1) == -2.f);  // what a compressor reading the gradient itself would do
  CHECK(tracked::outside.load() == before + 1);
}

}  // namespace contract_test
