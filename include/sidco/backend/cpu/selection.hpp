// The selection pass's per-range loops: count the |x| > t, and write them with their
// indices while settling error feedback.
#pragma once

#include <cstddef>

#include "sidco/backend/cpu/highway.hpp"
#include "sidco/backend/cpu/tuning.hpp"
#include "sidco/core/magnitude_key.hpp"

namespace sidco::backend::cpu_detail {

/// How many |x_i| > t in [lo, hi), above = threshold_key(t).
template <class Source, class S>
std::size_t count_above_in(const Source& source, std::size_t lo, std::size_t hi, S above) {
  using T = typename Source::value_type;
  std::size_t n = 0, i = lo;
  if constexpr (simd::handles<Source>) i = simd::count_above(source, lo, hi, above, n);
  for (; i < hi; ++i) n += exceeds<T>(signed_key(source.value(i)), above);
  return n;
}

/// Writes (base + i, v) for |v| > t over [lo, hi) at indices/values[at, end), settling
/// every value it passes (as sent where kept when Final). Bounded: stops before a block that
/// might not fit below end and returns where it stopped (hi when it finished); unsettled
/// values remain from there. Otherwise end is exactly where the range's entries end, and it
/// finishes.
template <bool Final, bool Bounded, class Source, class S, class T, class Index>
std::size_t write_above(const Source& source, std::size_t lo, std::size_t hi, S above, Index* indices,
                        T* values, std::size_t& at, std::size_t end) {
  constexpr std::size_t block = tuning::select_block;
  std::size_t i = lo;
  // Whole vectors while a whole vector's store fits; the loops below finish.
  if constexpr (simd::selects<Source, Index>)
    i = simd::write_above<Final>(source, lo, hi, above, indices, values, at, end);
  // Blocks: settle every value without a branch (vectorizes), and look for kept values only
  // in blocks whose largest key is above t (a max reduction; a NaN key only sends a block
  // to the exact test).
  for (; i + block <= hi; i += block) {
    if (Bounded && at + block > end) return i;
    T v[block];
    auto largest = signed_key(source.value(i));
    for (std::size_t j = 0; j < block; ++j) {
      v[j] = source.value(i + j);
      const auto key = signed_key(v[j]);
      largest = key > largest ? key : largest;
    }
    if constexpr (Source::has_state)
      for (std::size_t j = 0; j < block; ++j) source.settle(i + j, v[j], Final & exceeds<T>(signed_key(v[j]), above));
    if (!(largest > above)) continue;
    for (std::size_t j = 0; j < block; ++j)
      if (exceeds<T>(signed_key(v[j]), above)) {
        indices[at] = Index(source.base + i + j);
        values[at] = v[j];
        ++at;
      }
  }
  if (Bounded && at + block > end) return i;
  for (; i < hi; ++i) {
    const T v = source.value(i);
    const bool keep = exceeds<T>(signed_key(v), above);
    if (keep) {
      indices[at] = Index(source.base + i);
      values[at] = v;
      ++at;
    }
    if constexpr (Source::has_state) source.settle(i, v, Final && keep);
  }
  return hi;
}

}  // namespace sidco::backend::cpu_detail
