// What every selection a compressor returns promises, checked by the fuzz targets that
// compress (compress_fuzz after arbitrary input, state_fuzz after a loaded checkpoint), and
// what a top-k method promises besides.
#pragma once

#include <cstddef>
#include <cstring>
#include <span>
#include <vector>

#include <sidco/core/sparse_vector.hpp>

#include "../reference.hpp"

namespace fuzz {

/// The first promise out breaks, or nullptr: its dense size is the gradient's; its indices
/// are in range and strictly ascending; each value is bit-equal to the input there (gradient
/// + old residual with error feedback, the gradient alone without: residuals empty); with
/// error feedback, sent + new residual = gradient + old residual at every element.
inline const char* broken_selection_promise(const sidco::sparse_vector<float>& out, std::span<const float> gradient,
                                            std::span<const float> old_residual, std::span<const float> new_residual) {
  const bool feedback = !old_residual.empty();
  if (out.dense_size() != gradient.size()) return "dense size is not the gradient's";
  std::vector<float> sent(gradient.size(), 0.f);
  for (std::size_t j = 0; j < out.size(); ++j) {
    const std::size_t i = out.indices()[j];
    if (i >= gradient.size()) return "index out of range";
    if (j > 0 && out.indices()[j - 1] >= i) return "indices not strictly ascending";
    const float input = feedback ? gradient[i] + old_residual[i] : gradient[i];
    if (std::memcmp(&out.values()[j], &input, sizeof(float)) != 0) return "a selected value differs from the input";
    sent[i] = out.values()[j];
  }
  if (feedback)
    for (std::size_t i = 0; i < gradient.size(); ++i)
      if (sent[i] + new_residual[i] != gradient[i] + old_residual[i]) return "the residual lost mass";
  return nullptr;
}

/// For a method that promises the top k: nullptr when out's entries in [begin, end) are the k
/// largest |input| there (k: how many it holds), ties to the lower index (the tests' brute-force
/// reference_top_k); else what is wrong.
inline const char* broken_top_k(const sidco::sparse_vector<float>& out, std::span<const float> input, std::size_t begin,
                                std::size_t end) {
  std::vector<std::size_t> kept;
  for (std::size_t j = 0; j < out.size(); ++j)
    if (out.indices()[j] >= begin && out.indices()[j] < end) kept.push_back(out.indices()[j] - begin);
  const auto expected = sidco::test::reference_top_k<float>(input.subspan(begin, end - begin), kept.size());
  for (std::size_t j = 0; j < kept.size(); ++j)
    if (expected[j].first != kept[j]) return "not the k largest magnitudes, ties to the lower index";
  return nullptr;
}

}  // namespace fuzz
