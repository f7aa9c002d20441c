// Single-threaded scans over a source in host memory that the serial oracle and backend::cpu
// share: the cheap or cold ones, where threads or SIMD would not pay.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>

#include "sidco/backend/pass_statistics.hpp"
#include "sidco/core/float_traits.hpp"
#include "sidco/core/magnitude_key.hpp"
#include "sidco/core/moments.hpp"
#include "sidco/core/splitmix.hpp"
#include "sidco/core/sparse_vector.hpp"

namespace sidco::backend::host {

/// Counts only over [lo, hi) (zeros and non-finite values). Integer compares on the
/// magnitude bits, without branches, so the compiler can vectorize it; backend::cpu runs
/// it on each thread's range.
template <class Source>
moments counts_in(const Source& source, std::size_t lo, std::size_t hi) {
  using T = typename Source::value_type;
  using Key = magnitude_key_t<T>;
  const Key infinity = float_traits<T>::infinity;
  std::uint64_t zeros = 0, nonfinite = 0;
  for (std::size_t i = lo; i < hi; ++i) {
    const Key key = magnitude_key(source.value(i));
    zeros += key == 0;
    nonfinite += key >= infinity;
  }
  moments m;
  m.count = hi - lo;
  m.zeros = zeros;
  m.nonfinite = nonfinite;
  return m;
}

/// The first NaN or infinity (the error path), or {source.size, 0}.
template <class Source>
nonfinite_value first_nonfinite(const Source& source) {
  for (std::size_t i = 0; i < source.size; ++i)
    if (!(magnitude_key(source.value(i)) < float_traits<typename Source::value_type>::infinity))
      return {i, double(source.value(i))};
  return {source.size, 0.0};
}

/// out[j] = |x at sample_position(state, first + j, size)|: draws first, first + 1, ... of the
/// sample, so that ranges of it can be drawn apart.
template <class Source>
void sample_magnitudes(const Source& source, std::uint64_t state, std::span<double> out, std::size_t first = 0) {
  // A block of positions first, then their reads: the reads' cache misses overlap as in a
  // gather from a table (drawn inside the read loop, fewer reads are in flight).
  constexpr std::size_t block = 256;
  std::size_t at[block];
  for (std::size_t done = 0; done < out.size(); done += block) {
    const std::size_t count = std::min(block, out.size() - done);
    for (std::size_t j = 0; j < count; ++j) at[j] = sample_position(state, first + done + j, source.size);
    for (std::size_t j = 0; j < count; ++j) out[done + j] = std::fabs(double(source.value(at[j])));
  }
}

/// Marks out's entries from begin on as sent in the source's error-feedback state.
template <class Source, class T, class Index, class Memory>
void mark_sent(const Source& source, const sparse_vector<T, Index, Memory>& out, std::size_t begin) {
  if constexpr (Source::has_state) {
    const Index* indices = Memory::address(out.indices().data());
    for (std::size_t j = begin; j < out.size(); ++j) source.mark_sent(std::size_t(indices[j]) - source.base);
  }
}

}  // namespace sidco::backend::host
