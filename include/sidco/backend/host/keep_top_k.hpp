// The exact top-k among a run of candidates in host memory, by radix select on the
// magnitude bits (the digit walk of core/radix_select.hpp).
#pragma once

#include <array>
#include <cstddef>

#include "sidco/core/magnitude_key.hpp"
#include "sidco/core/radix_select.hpp"
#include "sidco/core/sparse_vector.hpp"

namespace sidco::backend::host {

/// Keeps, of the count entries, exactly k: the k largest magnitudes, ties going to the
/// lower index (Top-k's deterministic rule), in their order, and calls dropped(index, value)
/// for each of the others, in order. Returns the new count.
/// Precondition: every entry whose magnitude equals the k-th largest is in the run.
template <class T, class Index, class Dropped>
std::size_t keep_top_k(Index* indices, T* values, std::size_t count, std::size_t k, Dropped&& dropped) {
  using Key = magnitude_key_t<T>;
  if (count <= k) return count;

  radix_select<Key> walk(k);
  std::array<std::size_t, radix_select<Key>::bins> counts;
  for (int round = 0; round < radix_select<Key>::rounds; ++round) {
    counts.fill(0);
    for (std::size_t r = 0; r < count; ++r) {
      const int d = walk.digit(magnitude_key(values[r]), round);
      if (d >= 0) ++counts[std::size_t(d)];
    }
    walk.choose(counts.data(), round);
  }

  std::size_t kept = 0, ties = 0;
  for (std::size_t r = 0; r < count; ++r) {
    const int rank = walk.rank(magnitude_key(values[r]));
    if (rank > 0 || (rank == 0 && ties < walk.needed)) {
      ties += rank == 0;
      values[kept] = values[r];
      indices[kept] = indices[r];
      ++kept;
    } else {
      dropped(indices[r], values[r]);
    }
  }
  return kept;
}

template <class T, class Index>
std::size_t keep_top_k(Index* indices, T* values, std::size_t count, std::size_t k) {
  return keep_top_k(indices, values, count, k, [](Index, T) {});
}

/// Keeps the top k of out's entries from begin on (a sparse vector in host-addressable memory).
template <class T, class Index, class Memory>
void keep_top_k(sparse_vector<T, Index, Memory>& out, std::size_t begin, std::size_t k) {
  const std::size_t kept = keep_top_k(Memory::address(out.index_data()) + begin,
                                      Memory::address(out.value_data()) + begin, out.size() - begin, k);
  out.truncate(begin + kept);
}

}  // namespace sidco::backend::host
