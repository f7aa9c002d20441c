// From sparse back to dense: scatter-add of one or many sparse vectors.
#pragma once

#include <algorithm>
#include <cstddef>
#include <span>
#include <vector>

#include "sidco/core/error.hpp"
#include "sidco/core/sparse_vector.hpp"

namespace sidco {

namespace detail {

template <class T, class Index>
void check_scatter_target(const sparse_vector<T, Index>& sparse, std::size_t dense_size) {
  if (sparse.dense_size() != dense_size)
    fail("dense: size ", dense_size, " does not match the sparse vector's dense size ",
         sparse.dense_size());
  for (std::size_t i = 0; i < sparse.size(); ++i)
    if (std::size_t(sparse.indices()[i]) >= dense_size)
      fail("sparse vector: index ", std::size_t(sparse.indices()[i]), " at position ", i,
           " is out of range for dense size ", dense_size);
}

// The add itself, after check_scatter_target.
template <class T, class Index>
void add_checked(const sparse_vector<T, Index>& sparse, std::span<T> dense, T scale) {
  const auto indices = sparse.indices();
  const auto values = sparse.values();
  for (std::size_t i = 0; i < indices.size(); ++i) dense[indices[i]] += scale * values[i];
}

}  // namespace detail

/// dense[i] += scale * v for every entry (i, v). Checks everything before the first write.
template <class T, class Index>
void scatter_add(const sparse_vector<T, Index>& sparse, std::span<T> dense, T scale = T(1)) {
  detail::check_scatter_target(sparse, dense.size());
  detail::add_checked(sparse, dense, scale);
}

/// Sum (times scale) of many sparse vectors, e.g. what every worker sent, added into dense.
template <class T, class Index>
void scatter_add(std::span<const sparse_vector<T, Index>> sparse, std::span<T> dense,
                 T scale = T(1)) {
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
