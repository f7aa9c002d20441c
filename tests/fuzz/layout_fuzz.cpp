// libFuzzer target for layouts: arbitrary bytes as a gradient manifest (JSON text), and the
// same bytes as raw (offset, size) pairs. Every input must either be refused with
// sidco::error or give layouts that tile their buffer; each accepted layout small enough to
// allocate is then compressed per segment, whose output must stay inside the buffer and keep
// every bit under error feedback. Anything else (another exception, a crash, a read past a
// buffer under ASan) aborts.
#include <cstdint>
#include <cstdio>
#include <span>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <sidco/sidco.hpp>

#include <sidco/io/manifest.hpp>

namespace {

constexpr std::size_t largest_buffer = std::size_t(1) << 16;

[[noreturn]] void broken(const char* what) {
  std::fprintf(stderr, "layout fuzz: %s\n", what);
  std::abort();
}

// A tiling layout's total, checked independently of check::layout.
std::size_t tiled_total(const std::vector<sidco::segment>& layout) {
  std::size_t at = 0;
  for (const auto& s : layout) {
    if (s.offset != at || s.size == 0 || s.size > SIZE_MAX - at) broken("an accepted layout does not tile");
    at += s.size;
  }
  return at;
}

void compress_over(const std::vector<sidco::segment>& layout, std::uint64_t seed) {
  const std::size_t total = tiled_total(layout);
  if (total > largest_buffer) return;
  std::vector<float> g(total);
  for (std::size_t i = 0; i < total; ++i) {
    seed = seed * 6364136223846793005ull + 1442695040888963407ull;
    g[i] = float(std::int32_t(seed >> 32)) * 1e-9f;
  }
  sidco::segmented<sidco::presets::sidco_e<>> per_layer(layout);
  sidco::feedback::residual<float> residual(total);
  sidco::sparse_vector<float> out;
  per_layer.compress<float>(g, 0.01, out, residual);
  for (std::size_t j = 0; j < out.size(); ++j) {
    const std::size_t i = out.indices()[j];
    if (i >= total || (j && out.indices()[j - 1] >= i)) broken("an index outside the buffer or out of order");
    if (out.values()[j] != g[i] || residual.values()[i] != 0) broken("a sent value changed or stayed behind");
  }
  // A buffer one value short is refused before anything is written.
  if (total > 1) {
    try {
      per_layer.compress<float>(std::span<const float>(g.data(), total - 1), 0.01, out, residual);
      broken("a layout was accepted for a shorter buffer");
    } catch (const sidco::error&) {
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    for (const auto& [file, layout] : sidco::io::parse_manifest(text, "fuzz")) compress_over(layout, size);
  } catch (const sidco::error&) {
  }
  // The bytes as (offset, size) pairs of 64-bit words: sums that wrap must be refused.
  std::vector<sidco::segment> layout(size / 16);
  for (std::size_t i = 0; i < layout.size(); ++i) {
    std::memcpy(&layout[i].offset, data + 16 * i, 8);
    std::memcpy(&layout[i].size, data + 16 * i + 8, 8);
  }
  try {
    sidco::check::layout(layout);
    compress_over(layout, size);
  } catch (const sidco::error&) {
  }
  return 0;
}
