// Scatter-add of sparse entries into a dense host buffer: the one add loop that
// decompress, scatter_add and the MPI all-reduce share.
#pragma once

#include <cstddef>

#include "sidco/core/arithmetic.hpp"
#include "sidco/core/error.hpp"
#include "sidco/core/sparse_vector.hpp"

namespace sidco::backend::host {

/// Everything a scatter-add checks before its first write: the sparse vector's dense size
/// and every index against the dense buffer's size. `what` names the sparse side.
template <class Index>
void check_scatter(const char* what, std::size_t sparse_dense_size, const Index* indices,
                   std::size_t count, std::size_t dense_size) {
  if (sparse_dense_size != dense_size)
    detail::fail("dense: size ", dense_size, " does not match the ", what, "'s dense size ",
                 sparse_dense_size);
  // A negative index of a signed type is out of range too, and named as given (-1, not 2^64 - 1).
  for (std::size_t i = 0; i < count; ++i)
    if (std::size_t(indices[i]) >= dense_size)
      detail::fail(what, ": index ", +indices[i], " at position ", i,
                   " is out of range for dense size ", dense_size);
}

/// dense[indices[i]] += scale values[i] (rounded once), after check_scatter.
template <class T, class Index>
void add_checked(const Index* indices, const T* values, std::size_t count, T* dense, T scale) {
  for (std::size_t i = 0; i < count; ++i)
    dense[indices[i]] = detail::fused_multiply_add(scale, values[i], dense[indices[i]]);
}

/// dense += scale in, after checking every index (nothing is written when one is bad).
template <class T, class Index, class Memory>
void scatter_add(const sparse_vector<T, Index, Memory>& in, typename Memory::template view<T> dense, T scale) {
  const Index* indices = Memory::address(in.indices().data());
  check_scatter("sparse vector", in.dense_size(), indices, in.size(), dense.size());
  add_checked(indices, Memory::address(in.values().data()), in.size(), Memory::address(dense.data()), scale);
}

}  // namespace sidco::backend::host
