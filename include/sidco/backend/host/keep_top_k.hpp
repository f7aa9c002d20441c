// The exact top-k among a run of candidates in host memory, by radix select on the
// magnitude bits.
#pragma once

#include <array>
#include <cstddef>

#include "sidco/core/magnitude_key.hpp"

namespace sidco::backend::host {

/// Keeps, of the count entries, exactly k: the k largest magnitudes, ties going to the
/// lower index (Top-k's deterministic rule), in their order, and calls dropped(index, value)
/// for each of the others, in order. Returns the new count.
/// Precondition: every entry whose magnitude equals the k-th largest is in the run.
template <class T, class Index, class Dropped>
std::size_t keep_top_k(Index* indices, T* values, std::size_t count, std::size_t k, Dropped&& dropped) {
  using Key = magnitude_key_t<T>;
  if (count <= k) return count;

  // Eight bits a round from the top: the key of the k-th largest, and how many entries with
  // exactly that key belong to the top k.
  Key prefix = 0, mask = 0;
  std::size_t needed = k;
  std::array<std::size_t, 256> counts;
  for (int shift = int(8 * sizeof(Key)) - 8; shift >= 0; shift -= 8) {
    counts.fill(0);
    for (std::size_t r = 0; r < count; ++r) {
      const Key key = magnitude_key(values[r]);
      if ((key & mask) == prefix) ++counts[(key >> shift) & 0xff];
    }
    int digit = 255;
    for (; digit > 0 && counts[std::size_t(digit)] < needed; --digit)
      needed -= counts[std::size_t(digit)];
    prefix |= Key(digit) << shift;
    mask |= Key(0xff) << shift;
  }

  std::size_t kept = 0, ties = 0;
  for (std::size_t r = 0; r < count; ++r) {
    const Key key = magnitude_key(values[r]);
    const bool tie = key == prefix;
    if (key > prefix || (tie && ties < needed)) {
      ties += tie;
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

}  // namespace sidco::backend::host
