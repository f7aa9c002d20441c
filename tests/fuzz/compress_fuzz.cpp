// libFuzzer target: arbitrary bytes become a gradient (NaN, +-Inf, denormals, +-0, huge and
// tiny values included), a residual, a length, a density and a method. Every call must
// either throw sidco::error and change nothing, or return a selection that keeps every
// promise: indices in range, strictly ascending; values equal to the input there; exactly k
// where the method promises it; sent + new residual = gradient + old residual, per element.
// Anything else aborts.
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include <sidco/methods.hpp>
#include <sidco/sidco.hpp>

#include "selection_promises.hpp"

namespace {

[[noreturn]] void violated(const char* what, int method) {
  std::fprintf(stderr, "invariant violated: %s (method %d)\n", what, method);
  std::abort();
}

template <class Compressor>
void run(Compressor compressor, int method, bool exact_count, const std::vector<float>& g, double delta,
         bool feedback, const std::vector<float>& residual_start) {
  sidco::sparse_vector<float> out(1);
  out.push_back(0, 42.f);  // what must survive an error
  sidco::feedback::residual<float> residual(g.size());
  for (std::size_t i = 0; i < g.size(); ++i) residual.values()[i] = residual_start[i];

  bool valid = delta > 0 && delta <= 1 && !g.empty();
  for (std::size_t i = 0; i < g.size() && valid; ++i)
    valid = std::isfinite(feedback ? g[i] + residual_start[i] : g[i]);

  sidco::compress_report report;
  try {
    report = feedback ? compressor.template compress<float>(g, delta, out, residual)
                      : compressor.template compress<float>(g, delta, out);
  } catch (const sidco::error&) {
    if (valid) violated("valid input rejected", method);
    if (out.size() != 1 || out.indices()[0] != 0 || out.values()[0] != 42.f)
      violated("output changed by a rejected call", method);
    for (std::size_t i = 0; i < g.size(); ++i)
      if (std::memcmp(&residual.values()[i], &residual_start[i], sizeof(float)) != 0)
        violated("residual changed by a rejected call", method);
    return;
  }
  if (!valid) violated("invalid input accepted", method);
  if (report.selected != out.size()) violated("report count", method);
  if (exact_count && out.size() != sidco::target_count(delta, g.size())) violated("count is not k", method);
  const std::span<const float> old_residual = feedback ? std::span<const float>(residual_start) : std::span<const float>();
  if (const char* broken = fuzz::broken_selection_promise(out, g, old_residual, residual.values()))
    violated(broken, method);
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
  const bool feedback = flags & 1;
  const std::size_t count = std::min<std::size_t>((size - 6) / 4, 1 << 14);
  const bool with_residual = feedback && (flags & 2) && count >= 2;
  const std::size_t n = with_residual ? count / 2 : count;
  std::vector<float> g(n), residual(n, 0.f);
  if (n > 0) std::memcpy(g.data(), data + 6, n * 4);
  if (with_residual) std::memcpy(residual.data(), data + 6 + n * 4, n * 4);

  // Every method of the table (sidco/methods.hpp) on backend::cpu, and one more: top-k on
  // the serial oracle.
  const auto& table = sidco::methods::table;
  const auto& entry = table[std::size_t(method) % table.size()];
  auto call = [&](auto compressor) { run(std::move(compressor), method, entry.exact_count(), g, delta, feedback, residual); };
  if (std::size_t(method) < table.size())
    sidco::methods::visit(entry.name, {}, call);
  else
    sidco::methods::visit<sidco::backend::serial>("top-k", {}, [&](auto c) {
      run(std::move(c), method, true, g, delta, feedback, residual);
    });
  return 0;
}
