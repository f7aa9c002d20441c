// The exact top-k among a run of candidates, by radix select on the magnitude bits.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <span>
#include <utility>
#include <vector>

#include "sidco/core/magnitude_key.hpp"
#include "sidco/core/sparse_vector.hpp"

namespace sidco::select::detail {

/// Keeps, of out's entries from position begin on, exactly k: the k largest magnitudes, ties
/// going to the lower index (Top-k's deterministic rule). Entries keep their order.
/// Precondition: every entry whose magnitude equals the k-th largest is in the run.
template <class T, class Index>
void keep_top_k(sparse_vector<T, Index>& out, std::size_t begin, std::size_t k) {
  using Key = magnitude_key_t<T>;
  const std::size_t count = out.size() - begin;
  if (count <= k) return;
  const auto values = out.mutable_values().subspan(begin);
  const auto indices = out.mutable_indices().subspan(begin);

  // Eight bits a round from the top: the key of the k-th largest, and how many entries with
  // exactly that key belong to the top k.
  Key prefix = 0, mask = 0;
  std::size_t needed = k;
  std::array<std::size_t, 256> counts;
  for (int shift = int(8 * sizeof(Key)) - 8; shift >= 0; shift -= 8) {
    counts.fill(0);
    for (const T v : values) {
      const Key key = magnitude_key(v);
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
    }
  }
  out.truncate(begin + kept);
}

/// Merges out's entries from position begin on into one run ascending by index. They are
/// runs that each ascend: the first from begin, the others from each of run_starts (a
/// rescan appends one band per pass). Linear in the entries per run, with a temporary (the
/// rescan is the cold path).
template <class T, class Index>
void merge_runs(sparse_vector<T, Index>& out, std::size_t begin,
                std::span<const std::size_t> run_starts) {
  const auto values = out.mutable_values().subspan(begin);
  const auto indices = out.mutable_indices().subspan(begin);
  std::vector<std::pair<Index, T>> entries(values.size());
  for (std::size_t i = 0; i < values.size(); ++i) entries[i] = {indices[i], values[i]};
  const auto by_index = [](const auto& a, const auto& b) { return a.first < b.first; };
  for (std::size_t r = 0; r < run_starts.size(); ++r) {
    const std::size_t end = r + 1 < run_starts.size() ? run_starts[r + 1] : out.size();
    std::inplace_merge(entries.begin(), entries.begin() + std::ptrdiff_t(run_starts[r] - begin),
                       entries.begin() + std::ptrdiff_t(end - begin), by_index);
  }
  for (std::size_t i = 0; i < values.size(); ++i) {
    indices[i] = entries[i].first;
    values[i] = entries[i].second;
  }
}

/// Clears the error-feedback state of the entries finally sent.
template <class Source, class T, class Index>
void mark_sent(const Source& source, const sparse_vector<T, Index>& out, std::size_t begin) {
  if constexpr (Source::has_state) {
    const auto indices = out.indices();
    for (std::size_t i = begin; i < indices.size(); ++i)
      source.mark_sent(std::size_t(indices[i]) - source.base);
  }
}

}  // namespace sidco::select::detail
