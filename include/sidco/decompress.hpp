// From sparse back to dense (host memory): scatter-add of one or many sparse vectors. A
// backend's scatter_add does the same in its own memory space.
#pragma once

#include <algorithm>
#include <cstddef>
#include <span>
#include <vector>

#include "sidco/backend/host/scatter_add.hpp"
#include "sidco/core/sparse_vector.hpp"

namespace sidco {

namespace detail {

template <class T, class Index>
void check_scatter_target(const sparse_vector<T, Index>& sparse, std::size_t dense_size) {
  backend::host::check_scatter("sparse vector", sparse.dense_size(), sparse.indices().data(), sparse.size(),
                               dense_size);
}

template <class T, class Index>
void add_checked(const sparse_vector<T, Index>& sparse, std::span<T> dense, T scale) {
  backend::host::add_checked(sparse.indices().data(), sparse.values().data(), sparse.size(), dense.data(), scale);
}

}  // namespace detail

/// dense[i] += scale * v for every entry (i, v). Checks everything before the first write.
template <class T, class Index>
void scatter_add(const sparse_vector<T, Index>& sparse, std::span<T> dense, T scale = T(1)) {
  detail::check_scatter_target(sparse, dense.size());
  detail::add_checked(sparse, dense, scale);
}

/// Sum (times scale) of many sparse vectors, e.g. what every worker sent, added into dense
/// in order.
template <class T, class Index>
void scatter_add(std::span<const sparse_vector<T, Index>> sparse, std::span<T> dense, T scale = T(1)) {
  for (const auto& s : sparse) detail::check_scatter_target(s, dense.size());
  for (const auto& s : sparse) detail::add_checked(s, dense, scale);
}

/// Writes the dense form of sparse into dense (zeros elsewhere).
template <class T, class Index>
void decompress(const sparse_vector<T, Index>& sparse, std::span<T> dense) {
  detail::check_scatter_target(sparse, dense.size());
  std::fill(dense.begin(), dense.end(), T(0));
  detail::add_checked(sparse, dense, T(1));
}

template <class T, class Index>
std::vector<T> decompress(const sparse_vector<T, Index>& sparse) {
  std::vector<T> dense(sparse.dense_size(), T(0));
  scatter_add(sparse, std::span<T>(dense));
  return dense;
}

}  // namespace sidco
