// libFuzzer target: arbitrary bytes become a gradient (NaN, +-Inf, denormals, +-0, huge and
// tiny values included), a residual, a length, a density and a method, compressed whole (one
// call on a fresh compressor) or per layer (sidco::segmented over a layout from the input, the
// budget shared or each layer at the density, two calls so that the second starts from the
// first's state). Every call must either throw sidco::error and change nothing (output,
// residual, the compressor's saved state), or return a selection that keeps every promise:
// indices in range, strictly ascending; values equal to the input there; sent + new residual
// = gradient + old residual, per element; per tensor (the gradient or a layer) as many
// entries as its report says, exactly k where the method promises it, the k largest
// magnitudes (ties to the lower index) where it promises that. Anything else aborts.
// Layout: method byte, flags byte (1 feedback, 2 residual follows, 0x40 per layer, 0x80 raw
// density bits), 4 density bytes; per layer, a byte (layers 1 + its low 3 bits, 8: each layer
// at the density) and a weight byte per layer; then float32 values.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <span>
#include <vector>

#include <sidco/methods.hpp>
#include <sidco/sidco.hpp>

#include "selection_promises.hpp"

namespace {

using sidco::methods::count_promise;

[[noreturn]] void violated(const char* what, int method) {
  std::fprintf(stderr, "invariant violated: %s (method %d)\n", what, method);
  std::abort();
}

// What one call is given and what its method promises.
struct call_case {
  int method;
  count_promise promise;
  const std::vector<float>& gradient;
  double delta;
  bool feedback;
};

// Per tensor (the whole gradient, or each layer): as many entries as its report says, exactly
// k of its density where the method promises that, the top k where it promises that.
void check_tensors(const sidco::sparse_vector<float>& out, std::span<const float> input,
                   std::span<const sidco::segment> tensors, std::span<const sidco::compress_report> reports,
                   const call_case& c) {
  if (reports.size() != tensors.size()) violated("a report per tensor", c.method);
  std::size_t j = 0;  // out's indices ascend (checked before)
  for (std::size_t t = 0; t < tensors.size(); ++t) {
    std::size_t held = 0;
    for (; j < out.size() && out.indices()[j] < tensors[t].end(); ++j) ++held;
    if (held != reports[t].selected) violated("a tensor's report count", c.method);
    if (c.promise != count_promise::about_k && held != sidco::target_count(reports[t].target_density, tensors[t].size))
      violated("count is not k", c.method);
    if (c.promise == count_promise::top_k)
      if (const char* broken = fuzz::broken_top_k(out, input, tensors[t].offset, tensors[t].end()))
        violated(broken, c.method);
  }
}

// One call; false when it was refused (and changed nothing).
template <class Compressor>
bool call_once(Compressor& compressor, std::span<const sidco::segment> tensors, const call_case& c,
               sidco::feedback::residual<float>& residual) {
  const std::vector<float>& g = c.gradient;
  const std::vector<float> old_residual(residual.values().begin(), residual.values().end());
  const std::vector<std::byte> old_state = sidco::saved_state(compressor);
  sidco::sparse_vector<float> out(1);
  out.push_back(0, 42.f);  // what must survive an error

  bool valid = c.delta > 0 && c.delta <= 1 && !g.empty();
  std::vector<float> input(g.size());
  for (std::size_t i = 0; i < g.size(); ++i) {
    input[i] = c.feedback ? g[i] + old_residual[i] : g[i];
    valid = valid && std::isfinite(input[i]);
  }

  sidco::compress_report report;
  try {
    report = c.feedback ? compressor.template compress<float>(g, c.delta, out, residual)
                        : compressor.template compress<float>(g, c.delta, out);
  } catch (const sidco::error&) {
    if (valid) violated("valid input rejected", c.method);
    if (out.size() != 1 || out.indices()[0] != 0 || out.values()[0] != 42.f)
      violated("output changed by a rejected call", c.method);
    if (!g.empty() && std::memcmp(residual.values().data(), old_residual.data(), g.size() * sizeof(float)) != 0)
      violated("residual changed by a rejected call", c.method);
    if (sidco::saved_state(compressor) != old_state) violated("state changed by a rejected call", c.method);
    return false;
  }
  if (!valid) violated("invalid input accepted", c.method);
  if (report.selected != out.size()) violated("report count", c.method);
  const std::span<const float> residual_before = c.feedback ? std::span<const float>(old_residual) : std::span<const float>();
  if (const char* broken = fuzz::broken_selection_promise(out, g, residual_before, residual.values()))
    violated(broken, c.method);
  if constexpr (requires { compressor.segment_reports(); })
    check_tensors(out, input, tensors, compressor.segment_reports(), c);
  else
    check_tensors(out, input, tensors, std::span<const sidco::compress_report>(&report, 1), c);
  return true;
}

// A layout of n values in as many layers as weights (at most n), each at least one value long,
// their lengths about in proportion to weight + 1.
std::vector<sidco::segment> layers_of(const std::vector<std::uint8_t>& weights, std::size_t n) {
  const std::size_t layers = std::min(weights.size(), n);
  double total = 0;
  for (std::size_t l = 0; l < layers; ++l) total += weights[l] + 1.0;
  std::vector<sidco::segment> layout;
  double so_far = 0;
  std::size_t offset = 0;
  for (std::size_t l = 0; l + 1 < layers; ++l) {
    so_far += weights[l] + 1.0;
    const std::size_t most = n - (layers - 1 - l), end = std::clamp(std::size_t(double(n) * so_far / total), offset + 1, most);
    layout.push_back({offset, end - offset});
    offset = end;
  }
  layout.push_back({offset, n - offset});
  return layout;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 8) return 0;
  const int method = data[0] % int(sidco::methods::table.size() + 1);
  const std::uint8_t flags = data[1];
  std::uint32_t density_bits;
  std::memcpy(&density_bits, data + 2, 4);
  // Mostly densities in (0, 1]; sometimes the raw float bits (NaN, Inf, negative, > 1).
  const double delta = (flags & 0x80) ? double(std::bit_cast<float>(density_bits))
                                      : double(density_bits % 1000001) / 1e6;
  const bool feedback = flags & 1, per_layer = flags & 0x40;
  std::size_t at = 6;
  std::vector<std::uint8_t> weights;
  bool each_layer_at_delta = false;
  if (per_layer) {
    const std::uint8_t layers = data[at++];
    each_layer_at_delta = layers & 8;
    for (int l = 0; l < 1 + (layers & 7) && at < size; ++l) weights.push_back(data[at++]);
  }
  const std::size_t count = std::min<std::size_t>((size - at) / 4, 1 << 14);
  const bool with_residual = feedback && (flags & 2) && count >= 2;
  const std::size_t n = with_residual ? count / 2 : count;
  std::vector<float> g(n);
  if (n > 0) std::memcpy(g.data(), data + at, n * 4);
  sidco::feedback::residual<float> residual(n);
  if (with_residual) std::memcpy(residual.values().data(), data + at + n * 4, n * 4);

  // Every method of the table (sidco/methods.hpp) on backend::cpu, and one more: top-k on
  // the serial oracle.
  const auto& table = sidco::methods::table;
  const auto& entry = table[std::size_t(method) % table.size()];
  const call_case c{method, std::size_t(method) < table.size() ? entry.count : count_promise::top_k, g, delta, feedback};
  auto run = [&](auto compressor) {
    if (!per_layer || weights.empty() || n == 0) {
      const sidco::segment whole{0, n};
      call_once(compressor, std::span<const sidco::segment>(&whole, 1), c, residual);
      return;
    }
    using layered_type = sidco::segmented<decltype(compressor)>;
    typename layered_type::budget_policy budget;
    if (each_layer_at_delta) budget = [](std::size_t, const sidco::segment&, double d) { return d; };
    layered_type layered(layers_of(weights, n), compressor, budget);
    for (int call = 0; call < 2; ++call)
      if (!call_once(layered, layered.layout(), c, residual)) return;
  };
  if (std::size_t(method) < table.size())
    sidco::methods::visit(entry.name, {}, run);
  else
    sidco::methods::visit<sidco::backend::serial>("top-k", {}, run);
  return 0;
}
