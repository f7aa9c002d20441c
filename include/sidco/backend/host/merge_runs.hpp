// Merging ascending runs of (index, value) entries in host memory into one.
#pragma once

#include <algorithm>
#include <cstddef>
#include <span>
#include <utility>
#include <vector>

#include "sidco/core/sparse_vector.hpp"

namespace sidco::backend::host {

/// Entries [begin, end) are runs that each ascend by index: the first from begin, the others
/// from each of run_starts (ascending positions). Merges them into one run. Linear in the
/// entries per run, with a temporary (the rescan that makes runs is the cold path).
template <class T, class Index>
void merge_runs(Index* indices, T* values, std::size_t begin, std::size_t end,
                std::span<const std::size_t> run_starts) {
  const std::size_t count = end - begin;
  indices += begin;
  values += begin;
  std::vector<std::pair<Index, T>> entries(count);
  for (std::size_t i = 0; i < count; ++i) entries[i] = {indices[i], values[i]};
  const auto by_index = [](const auto& a, const auto& b) { return a.first < b.first; };
  for (std::size_t r = 0; r < run_starts.size(); ++r) {
    const std::size_t stop = (r + 1 < run_starts.size() ? run_starts[r + 1] : end) - begin;
    std::inplace_merge(entries.begin(), entries.begin() + std::ptrdiff_t(run_starts[r] - begin),
                       entries.begin() + std::ptrdiff_t(stop), by_index);
  }
  for (std::size_t i = 0; i < count; ++i) {
    indices[i] = entries[i].first;
    values[i] = entries[i].second;
  }
}

template <class T, class Index, class Memory>
void merge_runs(sparse_vector<T, Index, Memory>& out, std::size_t begin, std::span<const std::size_t> run_starts) {
  merge_runs(Memory::address(out.index_data()), Memory::address(out.value_data()), begin, out.size(), run_starts);
}

}  // namespace sidco::backend::host
