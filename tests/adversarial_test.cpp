// Inputs that break naive compressors, fed to every preset: constant vectors, all ties, one
// huge outlier, one non-zero, alternating signs, N = 1, densities 1/N and 1.
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "doctest.hpp"
#include <sidco/sidco.hpp>

#include "reference.hpp"

// Named after the file: the test programs compile several test files as one unit.
namespace adversarial_test {

using namespace sidco;

namespace {

struct adversary {
  std::string name;
  std::vector<float> values;
};

std::vector<adversary> adversaries() {
  std::vector<adversary> all;
  all.push_back({"constant", std::vector<float>(5000, 0.37f)});
  std::vector<float> ties(5000);
  for (std::size_t i = 0; i < ties.size(); ++i) ties[i] = float(int(i % 3) - 1);
  all.push_back({"three tied magnitudes", ties});
  std::vector<float> outlier(5000, 1e-3f);
  outlier[1234] = 3e38f;
  all.push_back({"one huge outlier", outlier});
  std::vector<float> tiny(5000, std::numeric_limits<float>::denorm_min());
  tiny[7] = 1e-30f;
  all.push_back({"denormals", tiny});
  std::vector<float> single(5000, 0.f);
  single[4999] = -2.5f;
  all.push_back({"one non-zero", single});
  std::vector<float> alternating(5000);
  for (std::size_t i = 0; i < alternating.size(); ++i) alternating[i] = i % 2 ? -0.5f : 0.5f;
  all.push_back({"alternating signs", alternating});
  all.push_back({"N = 1", {0.75f}});
  all.push_back({"N = 1, zero", {0.f}});
  all.push_back({"all zero", std::vector<float>(999, 0.f)});
  all.push_back({"signed zeros", {0.f, -0.f, 0.f, -0.f}});
  return all;
}

// Whatever the method: output well formed, nothing lost under error feedback, and exactly k
// (the brute-force Top-k) where the method promises it.
template <class Compressor>
void survive(const char* method, bool exact_top_k, bool exactly_k) {
  for (const auto& a : adversaries()) {
    const std::size_t n = a.values.size();
    // 1e-38 and the smallest double: valid densities whose 1/delta overflows integer
    // conversions (the fuzzer found DGC's sample size doing exactly that).
    for (double delta : {1.0 / double(n), 0.01, 0.5, 1.0, 1e-38, std::numeric_limits<double>::denorm_min()}) {
      INFO(method, " on ", a.name, " at delta ", delta);
      Compressor c;
      sparse_vector<float> out;
      feedback::residual<float> residual(n);
      const auto report = c.template compress<float>(a.values, delta, out, residual);
      const std::size_t k = target_count(delta, n);
      CHECK(report.selected == out.size());
      for (std::size_t j = 0; j < out.size(); ++j) {
        REQUIRE(out.indices()[j] < n);
        if (j) REQUIRE(out.indices()[j - 1] < out.indices()[j]);
        REQUIRE(out.values()[j] == a.values[out.indices()[j]]);
      }
      std::vector<float> rebuilt(residual.values().begin(), residual.values().end());
      for (std::size_t j = 0; j < out.size(); ++j) rebuilt[out.indices()[j]] += out.values()[j];
      CHECK(rebuilt == a.values);
      if (exactly_k) CHECK(out.size() == k);
      if (exact_top_k) CHECK(test::entries(out) == test::reference_top_k<float>(a.values, k));
    }
  }
}

}  // namespace

TEST_CASE("every preset survives adversarial inputs") {
  using namespace presets;
  survive<sidco_e<>>("sidco-e", false, false);
  survive<sidco_gp<>>("sidco-gp", false, false);
  survive<sidco_gamma_gp<>>("sidco-gamma-gp", false, false);
  survive<sidco_e_single<>>("sidco-e-single", false, false);
  survive<sidco_gamma_gp_paper<>>("sidco-gamma-gp-paper", false, false);
  survive<sidco_e_exact<>>("sidco-e-exact", true, true);
  survive<sidco_gp_exact<>>("sidco-gp-exact", true, true);
  survive<top_k<>>("top-k", true, true);
  survive<random_k<>>("random-k", false, true);
  survive<dgc<>>("dgc", false, false);
  survive<gaussian_k<>>("gaussian-k", false, false);
  survive<redsync<>>("redsync", false, false);
  survive<redsync_trimmed<>>("redsync-trimmed", false, false);
}

TEST_CASE("a small layer called again and again under error feedback: SIDCo's stages stay defined") {
  // 8 values at delta 0.2 (k = 1): once the adaptive aim is corrected up to stage 1's
  // fraction, the last stage starts at k, so the count of stages left divides by log(1), and
  // converting that infinity to int was undefined (found by the compress fuzzer, per layer).
  // UBSan, in the sanitizer build, aborted on the sixth call. Every call must stay well
  // formed and lose nothing.
  const std::vector<float> g = {0.9f, -0.5f, 0.3f, -0.2f, 0.15f, -0.1f, 0.07f, -0.05f};
  auto calls = [&](auto compressor, const char* method) {
    for (double delta : {0.2, 0.229, 0.25}) {
      auto c = compressor;
      feedback::residual<float> residual(g.size());
      sparse_vector<float> out;
      for (int call = 0; call < 8; ++call) {
        INFO(method, " at delta ", delta, ", call ", call);
        const std::vector<float> before(residual.values().begin(), residual.values().end());
        const auto report = c.template compress<float>(g, delta, out, residual);
        REQUIRE(report.selected == out.size());
        std::vector<float> rebuilt(residual.values().begin(), residual.values().end());
        for (std::size_t j = 0; j < out.size(); ++j) rebuilt[out.indices()[j]] += out.values()[j];
        for (std::size_t i = 0; i < g.size(); ++i) REQUIRE(rebuilt[i] == g[i] + before[i]);
      }
    }
  };
  calls(presets::sidco_e<>{}, "sidco-e");
  calls(presets::sidco_gp<>{}, "sidco-gp");
  calls(presets::sidco_gamma_gp<>{}, "sidco-gamma-gp");
}

TEST_CASE("threshold methods keep an outlier and never select exact zeros") {
  std::vector<float> outlier(5000, 1e-3f);
  outlier[1234] = 3e38f;
  sparse_vector<float> out;
  presets::sidco_gamma_gp<> c;
  c.compress<float>(outlier, 1.0 / 5000, out);
  REQUIRE(!out.empty());
  CHECK(out.indices()[0] <= 1234);
  bool has_outlier = false;
  for (auto i : out.indices()) has_outlier |= i == 1234;
  CHECK(has_outlier);
  std::vector<float> single(5000, 0.f);
  single[4999] = -2.5f;
  presets::sidco_e<> e;
  e.compress<float>(single, 0.5, out);
  CHECK(test::entries(out) == std::vector<std::pair<std::size_t, float>>{{4999, -2.5f}});
}

}  // namespace adversarial_test
