// A distribution model in your own namespace: log-normal magnitudes.
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include <boost/math/special_functions/erf.hpp>
#include <sidco/sidco.hpp>

namespace mylab {

struct log_normal {
  static constexpr const char* name = "log-normal";
  static constexpr bool needs_log = true;  // fit reads the mean of ln a
  double mu = 0, sigma = 0;

  // ln E[a] = mu + sigma^2 / 2 and E[ln a] = mu.
  static log_normal fit(const sidco::moments& m) {
    const double mu = m.mean_log(), spread = 2 * (std::log(m.mean()) - mu);
    return {mu, std::sqrt(std::max(spread, 0.0))};
  }
  // P(a > t) = rho: t = exp(mu + sigma sqrt(2) erfc^-1(2 rho)).
  double upper_quantile(double rho) const {
    return std::exp(mu + sigma * std::sqrt(2.0) * boost::math::erfc_inv(2 * rho));
  }
  double ccdf(double t) const { return 0.5 * std::erfc((std::log(t) - mu) / (sigma * std::sqrt(2.0))); }
};

}  // namespace mylab

int main() {
  std::vector<float> g(1 << 20);
  std::mt19937_64 rng(1);
  std::lognormal_distribution<float> magnitude(0.0f, 1.0f);
  for (auto& x : g) x = (rng() & 1 ? 1 : -1) * magnitude(rng);
  using log_normal_sidco = sidco::compressor<sidco::estimate::statistical<mylab::log_normal>>;
  log_normal_sidco compressor;
  sidco::sparse_vector<float> sent;
  const auto report = compressor.compress(g, 0.01, sent);
  std::printf("%s: kept %zu (%.2fx the target)\n", mylab::log_normal::name, report.selected, report.density_ratio());
}
