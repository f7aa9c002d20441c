// Does SIDCo deliver the density asked for? First calls per layer on every bundled real
// gradient, and the closed loop of adaptive stages over drifting inputs with error feedback.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <functional>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "doctest.hpp"
#include <sidco/sidco.hpp>

#include <sidco/io/manifest.hpp>
#include "support.hpp"

// Named after the file: the test programs compile several test files as one unit.
namespace density_test {

using namespace sidco;

namespace {

const std::map<std::string, std::vector<segment>>& layouts() {
  static const auto all = sidco::io::load_manifest(test::gradients_dir() + "/manifest.json");
  return all;
}

// The running mean of achieved/target over 50 calls on g scaled by a drifting factor
// (+-35% over the calls), with error feedback, whole vector or per layer.
template <class Compressor>
double drifting_mean(const std::vector<float>& g0, double delta, const std::vector<segment>* layout) {
  std::vector<float> g(g0.size());
  feedback::residual<float> residual(g.size());
  sparse_vector<float> out;
  Compressor whole;
  segmented<Compressor> layered(layout ? *layout : std::vector<segment>{{0, g.size()}});
  double sum = 0;
  for (int call = 0; call < 50; ++call) {
    const float scale = std::exp(0.3f * std::sin(float(call) / 8.0f));
    for (std::size_t i = 0; i < g.size(); ++i) g[i] = scale * g0[i];
    sum += (layout ? layered.template compress<float>(g, delta, out, residual)
                   : whole.template compress<float>(g, delta, out, residual))
               .density_ratio();
  }
  return sum / 50;
}

// The reports of `calls` calls of c on the same values without feedback; before each,
// before_call(call) reads what the call finds in c.
template <class Compressor>
std::vector<compress_report> same_values_calls(Compressor& c, std::span<const float> values, double delta, int calls,
                                               const std::function<void(int)>& before_call = {}) {
  sparse_vector<float> out;
  std::vector<compress_report> reports;
  for (int call = 0; call < calls; ++call) {
    if (before_call) before_call(call);
    reports.push_back(c.template compress<float>(values, delta, out));
  }
  return reports;
}

// Achieved/target and passes over the calls of reports from `from` on.
struct calls_window {
  double mean = 0, lowest = 2, mean_miss = 0, worst_miss = 0;  // miss: |achieved/target - 1|
  int passes = 0;
};

calls_window window_from(const std::vector<compress_report>& reports, std::size_t from) {
  calls_window w;
  const double calls = double(reports.size() - from);
  for (std::size_t call = from; call < reports.size(); ++call) {
    const double ratio = reports[call].density_ratio(), miss = std::fabs(ratio - 1);
    w.mean += ratio / calls;
    w.lowest = std::min(w.lowest, ratio);
    w.mean_miss += miss / calls;
    w.worst_miss = std::max(w.worst_miss, miss);
    w.passes += reports[call].passes;
  }
  return w;
}

}  // namespace

TEST_CASE("first call per layer: every default preset within [0.8, 1.25] on every real gradient") {
  // The bar: 95% of cases within [0.8, 1.25], none outside [0.67, 1.5]. Measured:
  // all 54 cases within [0.8, 1.25].
  int cases = 0, outside = 0;
  for (const auto& file : test::gradient_files()) {
    const auto g = test::load_gradient(file);
    const auto& layout = layouts().at(file);
    for (double delta : {0.1, 0.01, 0.001}) {
      sparse_vector<float> out;
      segmented<presets::sidco_e<>> e(layout);
      segmented<presets::sidco_gp<>> gp(layout);
      segmented<presets::sidco_gamma_gp<>> ggp(layout);
      for (double ratio : {e.compress<float>(g, delta, out).density_ratio(),
                           gp.compress<float>(g, delta, out).density_ratio(),
                           ggp.compress<float>(g, delta, out).density_ratio()}) {
        INFO(file, " at ", delta, ": ", ratio);
        ++cases;
        outside += ratio < 0.8 || ratio > 1.25;
        CHECK(ratio >= 0.67);
        CHECK(ratio <= 1.5);
      }
    }
  }
  CHECK(cases == 54);
  CHECK(outside == 0);
}

TEST_CASE("adaptive stages: the mean over 50 drifting calls is within 5% on every real gradient") {
  for (const auto& file : test::swept_gradient_files()) {
    const auto g = test::load_gradient(file);
    const auto& layout = layouts().at(file);
    for (double delta : {0.1, 0.01, 0.001}) {
      for (const auto* per_layer : {static_cast<const std::vector<segment>*>(nullptr), &layout}) {
        const double e = drifting_mean<presets::sidco_e<>>(g, delta, per_layer);
        const double gp = drifting_mean<presets::sidco_gp<>>(g, delta, per_layer);
        INFO(file, " at ", delta, per_layer ? " per layer" : " whole", ": SIDCo-E ", e, ", SIDCo-GP ", gp);
        CHECK(std::fabs(e - 1) <= 0.05);
        CHECK(std::fabs(gp - 1) <= 0.05);
      }
    }
  }
}

TEST_CASE("adaptive stages: a correction that carries the aim past stage 1's fraction keeps the measured stages") {
  // Rows of a transformer LM head's gradient (examples/data/gradients/lm_head): light-tailed, so
  // the first call keeps about 0.89 of k and the loop corrects the aim upwards, past the
  // first-stage fraction (0.25) at these densities. Dropping to one unmeasured fit there
  // kept a quarter of k from the call that crossed it (0.25-0.48 for five calls, the aim
  // run up to 0.75).
  const auto g = test::load_gradient("lm_head/gpt_it200_head_rows.npy");
  for (double delta : {0.23, 0.24}) {
    presets::sidco_e<> c;
    double highest_aim = 0;
    const auto reports = same_values_calls(c, g, delta, 50, [&](int) {
      highest_aim = std::max(highest_aim, c.estimator().stage_policy_state().aim(delta));
    });
    const double lowest_after_first = window_from(reports, 1).lowest, settled = window_from(reports, 30).mean;
    INFO("delta ", delta, ": mean of the last 20 calls ", settled, ", highest aim ", highest_aim,
         ", lowest ratio after the first call ", lowest_after_first);
    CHECK(highest_aim > c.estimator().settings().first_fraction);
    CHECK(lowest_after_first >= 0.9);
    CHECK(std::fabs(settled - 1) <= 0.02);
  }
}

TEST_CASE_TEMPLATE("a bell-shaped bulk under a cliff: the first call from the inside's mean and mean square", Compressor,
                   presets::sidco_e<>, presets::sidco_gp<>) {
  // The GPT head's bias at iteration 20 (examples/data/gradients/lm_head): a softmax's few large
  // entries above a bulk that rises from 8e-6 to a peak near 3e-5 and falls to the cut near
  // 6.4e-5. Stage 1 lands above k; the last stage interpolates from all the non-zeros, through
  // the bulk. From the bulk's mean alone (a truncated exponential) the first call kept 0.28x
  // (SIDCo-GP 0.40x); with its mean square it keeps 1.07x (1.17x).
  const auto g = test::load_gradient("lm_head/gpt_it20_head_bias.npy");
  Compressor c;
  sparse_vector<float> out;
  const double first = c.template compress<float>(g, 0.1, out).density_ratio();
  INFO("first call ", first);
  CHECK(first >= 0.8);
  CHECK(first <= 1.25);
}

// A compressor loaded from c's checkpoint compresses the next call as c does: same threshold,
// same indices, no pass (the probe's role is in the state).
template <class Compressor>
void check_resumes_without_a_pass(Compressor& c, std::span<const float> values, double delta) {
  state_writer writer;
  c.save_state(writer);
  Compressor resumed;
  state_reader reader(writer.bytes());
  resumed.load_state(reader);
  sparse_vector<float> out, again;
  const auto expected = c.template compress<float>(values, delta, out);
  const auto report = resumed.template compress<float>(values, delta, again);
  CHECK(report.passes == 0);
  CHECK(expected.threshold == report.threshold);
  CHECK(std::equal(out.indices().begin(), out.indices().end(), again.indices().begin(), again.indices().end()));
}

TEST_CASE_TEMPLATE("a spike of near-equal values under a cluster: the cut from the normal with the inside's mean and "
                   "variance", Compressor, presets::sidco_e<>, presets::sidco_gp<>) {
  // The LSTM's decoder bias (lstm_it10.npy's last layer, 7,596 values): 366 values from
  // 1.3e-3 to 5e-2 above a spike of 7,230 between 1.1e-4 and 1.5e-4, the cut for delta = 0.1
  // at 1.43e-4 inside it. Stage 1 lands in the gap; the inside (the spike) is too few values for
  // the two-moment fit and too narrow for its quadrature. From its mean alone every call
  // kept the 366 (0.48x), the loop's correction pinned at its bound; from its mean and
  // variance the first call keeps 1.06x and the loop settles at 1.00x with no passes.
  const auto g = test::load_gradient("lstm_it10.npy");
  const segment bias = layouts().at("lstm_it10.npy").back();
  REQUIRE(bias.size == 7596);
  Compressor c;
  const auto reports = same_values_calls(c, std::span<const float>(g).subspan(bias.offset, bias.size), 0.1, 30);
  const double first = reports[0].density_ratio(), lowest = window_from(reports, 0).lowest;
  const calls_window settled = window_from(reports, 10);
  INFO("first call ", first, ", lowest ", lowest, ", mean of the last 20 calls ", settled.mean);
  CHECK(first >= 0.8);
  CHECK(first <= 1.25);
  CHECK(lowest >= 0.8);
  CHECK(std::fabs(settled.mean - 1) <= 0.02);
}

TEST_CASE_TEMPLATE("a tail fit that the call's own upper bracket contradicts: the next calls probe that bracket",
                   Compressor, presets::sidco_e<>, presets::sidco_gp<>) {
  // The GPT head's bias at delta = 0.05: the first call measures a point below the cut and an
  // upper bracket, and interpolates between them (0.98x). Fitted from that point alone, as
  // the next calls did, the tail's mean excess is the softmax's few large entries', and the
  // fit lands past the bracket: SIDCo-E kept 0.443x on every call, its correction pinned at
  // 4; SIDCo-GP kept 0.38x for six calls. Now the bracket is the probe, and the calls
  // interpolate to it as the first one did.
  const auto g = test::load_gradient("lm_head/gpt_it20_head_bias.npy");
  Compressor c;
  const auto reports = same_values_calls(c, g, 0.05, 30);
  const double first = reports[0].density_ratio(), lowest = window_from(reports, 0).lowest;
  const calls_window settled = window_from(reports, 10);
  INFO("first call ", first, ", lowest ", lowest, ", mean of the last 20 calls ", settled.mean, " with ",
       settled.passes, " passes");
  CHECK(lowest >= 0.8);
  CHECK(std::fabs(settled.mean - 1) <= 0.02);
  CHECK(settled.passes == 0);
  check_resumes_without_a_pass(c, g, 0.05);
}

TEST_CASE("over the same values without feedback the loop settles instead of cycling between two calls") {
  // cnn_it10's whole vector at delta = 0.001: the loop reached 0.997 at call 9, then (a stage
  // added) alternated 0.64 and 1.56 from call 10 on, its base moved each call by the last
  // threshold change as if the values drifted (docs/RESULTS.md, "The adaptive loop swept").
  // Without feedback the base now follows the values' own mean, which does not move here.
  const auto g = test::load_gradient("cnn_it10.npy");
  presets::sidco_e<> c;
  const calls_window settled = window_from(same_values_calls(c, g, 0.001, 50), 30);
  INFO("mean |ratio - 1| over calls 30-49 ", settled.mean_miss, ", worst ", settled.worst_miss);
  CHECK(settled.mean_miss <= 0.02);
  CHECK(settled.worst_miss <= 0.05);
}

TEST_CASE_TEMPLATE("a tail that only upper brackets settle is measured by the moments pass, not by passes", Compressor,
                   presets::sidco_e<>, presets::sidco_gp<>) {
  // On the LM head's rows the first fit lands above k, so no pass measures a point below the
  // cut: the calls interpolate down from a measured upper point, which would take a pass
  // each. That point becomes the next call's probe: the calls after
  // settling make no pass of their own and keep the density, and a checkpoint keeps the
  // probe's role (a resumed compressor gives the same bits with no pass either).
  const auto g = test::load_gradient("lm_head/gpt_it200_head_rows.npy");
  for (double delta : {0.1, 0.134, 0.2}) {
    Compressor c;
    const auto reports = same_values_calls(c, g, delta, 50);
    const calls_window settled = window_from(reports, 30);
    INFO("delta ", delta, ": first call's passes ", reports[0].passes, ", passes in calls 30-49 ", settled.passes,
         ", worst density miss ", settled.worst_miss);
    CHECK(reports[0].passes > 0);
    CHECK(settled.passes == 0);
    CHECK(settled.worst_miss <= 0.01);
    check_resumes_without_a_pass(c, g, delta);
  }
}

// Each call's achieved/target over calls 20-49 with error feedback, the gradient rotated by
// a shift every call (a fresh gradient of the same values, as in training), sorted.
template <class Compressor>
std::vector<double> fresh_gradient_ratios(const std::vector<float>& g0, double delta, const std::vector<segment>& layout) {
  std::vector<float> g(g0.size());
  feedback::residual<float> residual(g.size());
  sparse_vector<float> out;
  segmented<Compressor> layered(layout);
  std::vector<double> ratios;
  for (int call = 0; call < 50; ++call) {
    const std::size_t shift = (std::size_t(call) * 7919) % g.size();
    std::rotate_copy(g0.begin(), g0.begin() + std::ptrdiff_t(shift), g0.end(), g.begin());
    const double ratio = layered.template compress<float>(g, delta, out, residual).density_ratio();
    if (call >= 20) ratios.push_back(ratio);
  }
  std::sort(ratios.begin(), ratios.end());
  return ratios;
}

TEST_CASE("with error feedback over a fresh gradient every call, each call lands within [0.85, 1.25] of the target") {
  // The residual piles up under the last threshold, so the tail near the cut changes shape
  // from call to call; the moments pass measures the count above the last threshold on
  // each call's values. Measuring only the base, these swung to 0.55-1.77 (the LSTM, whole)
  // and 0.71-1.40 (the CNN per layer). The 2nd-lowest and 2nd-highest of 30 calls.
  struct case_t {
    const char* file;
    bool per_layer;
  };
  for (const case_t c : {case_t{"lstm_it10.npy", false}, case_t{"cnn_it10.npy", true}, case_t{"ffn_it10.npy", true}}) {
    if (test::sanitized && std::string(c.file) != "ffn_it10.npy") continue;  // 50 calls of 1-3.7M values
    const auto g = test::load_gradient(c.file);
    const std::vector<segment> layout = c.per_layer ? layouts().at(c.file) : std::vector<segment>{{0, g.size()}};
    const auto e = fresh_gradient_ratios<presets::sidco_e<>>(g, 0.001, layout);
    const auto gp = fresh_gradient_ratios<presets::sidco_gp<>>(g, 0.001, layout);
    INFO(c.file, c.per_layer ? " per layer" : " whole", ": SIDCo-E ", e[1], "-", e[e.size() - 2], ", SIDCo-GP ",
         gp[1], "-", gp[gp.size() - 2]);
    CHECK(e[1] >= 0.85);
    CHECK(e[e.size() - 2] <= 1.25);
    CHECK(gp[1] >= 0.85);
    CHECK(gp[gp.size() - 2] <= 1.25);
  }
}

TEST_CASE("a 10,000-step error-feedback soak holds the density within 5% in every 100-step window") {
  // SIDCo-GP, delta = 0.001, Laplace values whose scale drifts by +-65% over the run, a new
  // gradient every step (the same values rotated), error feedback throughout. Under the
  // sanitizers 2,000 steps: the drift's whole period (about 1,900 steps), 20 windows.
  const std::size_t n = 200000;
  const int steps = test::sanitized ? 2000 : 10000;
  std::mt19937_64 rng(2026);
  std::exponential_distribution<float> magnitude(1.f);
  std::uniform_real_distribution<float> u(0, 1);
  std::vector<float> base(n), g(n);
  for (auto& v : base) v = (u(rng) < 0.5f ? -1.f : 1.f) * magnitude(rng);
  presets::sidco_gp<> c;
  feedback::residual<float> residual(n);
  sparse_vector<float> out;
  double window = 0, worst = 1, first_window = 0;
  for (int step = 0; step < steps; ++step) {
    const float scale = 1e-3f * std::exp(0.5f * std::sin(float(step) / 300.0f));
    const std::size_t shift = (std::size_t(step) * 7919) % n;
    std::rotate_copy(base.begin(), base.begin() + std::ptrdiff_t(shift), base.end(), g.begin());  // g[i] = base[(i + shift) % n]
    for (float& v : g) v *= scale;
    window += c.compress<float>(g, 0.001, out, residual).density_ratio();
    if (step == 49) first_window = window / 50;
    if ((step + 1) % 100 == 0) {
      const double mean = window / 100;
      if (std::fabs(mean - 1) > std::fabs(worst - 1)) worst = mean;
      window = 0;
    }
  }
  INFO("first 50 steps ", first_window, ", worst 100-step window ", worst);
  CHECK(std::fabs(first_window - 1) <= 0.05);
  CHECK(std::fabs(worst - 1) <= 0.05);
}

}  // namespace density_test
