// The exact top-k among runs of candidates in host memory (one run per segment), by radix
// select on the magnitude bits (the digit walk of core/radix_select.hpp).
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <span>
#include <vector>

#include "sidco/core/error.hpp"
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

/// The same entries, reading them three times: a histogram of the keys' top 12 bits
/// (coarse_bins; an eighth of a binade each for float) finds the bin of the k-th largest key; the
/// keys in that bin, a small part of the entries on gradients, are gathered into survivors
/// and the k-th largest found among them; a last pass keeps the top k. survivors is the
/// caller's, kept from call to call so that a warm call allocates nothing.
template <class T, class Index>
std::size_t keep_top_k(Index* indices, T* values, std::size_t count, std::size_t k,
                       std::vector<magnitude_key_t<T>>& survivors) {
  using Key = magnitude_key_t<T>;
  if (count <= k) return count;
  if (k == 0) return 0;
  if (count > std::numeric_limits<std::uint32_t>::max()) return keep_top_k(indices, values, count, k, [](Index, T) {});

  constexpr int shift = coarse_shift<Key>;
  std::array<std::uint32_t, coarse_bins> counts{};
  for (std::size_t r = 0; r < count; ++r) ++counts[std::size_t(magnitude_key(values[r]) >> shift)];
  const key_bin found = kth_largest_bin(counts.data(), coarse_bins, k);
  const std::size_t above_bin = found.at_or_above - counts[found.bin];  // in the bins above it
  // The bin's count is known: its keys are written by position, without push_back's
  // capacity check (the branch is rarely taken, so it predicts well).
  const std::size_t in_found_bin = counts[found.bin];
  survivors.resize(in_found_bin);
  Key* const bin = survivors.data();
  std::size_t gathered = 0;
  for (std::size_t r = 0; r < count; ++r) {
    const Key key = magnitude_key(values[r]);
    if (std::size_t(key >> shift) == found.bin) bin[gathered++] = key;
  }
  // The (k - above_bin)-th largest key of the bin is the k-th largest of all.
  const std::size_t in_bin = k - above_bin;
  const auto bin_end = survivors.begin() + std::ptrdiff_t(in_found_bin);
  std::nth_element(survivors.begin(), survivors.begin() + std::ptrdiff_t(in_bin - 1), bin_end, std::greater<Key>());
  const Key kth = survivors[in_bin - 1];
  std::size_t above = above_bin;
  for (auto key = survivors.begin(); key != bin_end; ++key) above += *key > kth;
  const std::size_t ties = k - above;  // entries equal to kth that complete the top k

  // Every entry is copied to the next free slot and kept there only when it is among the
  // top k (no branch: an owner keeps about half of its union, a branch that mispredicts);
  // kept <= r, so no entry is overwritten before it is read.
  std::size_t kept = 0, taken = 0;
  for (std::size_t r = 0; r < count; ++r) {
    const T value = values[r];
    const Index index = indices[r];
    const Key key = magnitude_key(value);
    const bool tie = key == kth;
    const bool keep = (key > kth) | (tie & (taken < ties));
    values[kept] = value;
    indices[kept] = index;
    taken += std::size_t(tie & keep);
    kept += std::size_t(keep);
  }
  return kept;
}

template <class T, class Index>
std::size_t keep_top_k(Index* indices, T* values, std::size_t count, std::size_t k) {
  return keep_top_k(indices, values, count, k, [](Index, T) {});
}

/// Throws unless the runs hold exactly the entries after begin (every backend's check).
inline void check_runs_hold(std::size_t in_runs, std::size_t after_begin) {
  if (in_runs != after_begin)
    sidco::detail::fail("keep_top_k: the runs hold ", in_runs, " entries, the vector ", after_begin, " from begin");
}

/// out's entries from begin on are consecutive runs of run_sizes[s] entries: keeps the top
/// keep[s] of each run (all of it when keep[s] >= its size), runs compacted in their order.
template <class T, class Index, class Memory>
void keep_top_k(sparse_vector<T, Index, Memory>& out, std::size_t begin, std::span<const std::size_t> run_sizes,
                std::span<const std::size_t> keep) {
  std::size_t total = 0;
  for (std::size_t size : run_sizes) total += size;
  check_runs_hold(total, out.size() - begin);
  Index* indices = Memory::address(out.index_data());
  T* values = Memory::address(out.value_data());
  std::size_t read = begin, write = begin;
  for (std::size_t s = 0; s < run_sizes.size(); ++s) {
    const std::size_t kept = keep_top_k(indices + read, values + read, run_sizes[s], keep[s]);
    if (write != read) {
      std::copy(indices + read, indices + read + kept, indices + write);
      std::copy(values + read, values + read + kept, values + write);
    }
    read += run_sizes[s];
    write += kept;
  }
  out.truncate(write);
}

}  // namespace sidco::backend::host
