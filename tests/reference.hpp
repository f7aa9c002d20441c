// Brute-force references the tests compare the methods with.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <numeric>
#include <span>
#include <utility>
#include <vector>

#include <sidco/core/sparse_vector.hpp>

namespace sidco::test {

/// Exact Top-k by a full stable sort: the k largest |x|, ties to the lower index, returned
/// in index order.
template <class T>
std::vector<std::pair<std::size_t, T>> reference_top_k(std::span<const T> x, std::size_t k) {
  std::vector<std::size_t> order(x.size());
  std::iota(order.begin(), order.end(), std::size_t(0));
  std::stable_sort(order.begin(), order.end(),
                   [&](std::size_t a, std::size_t b) { return std::fabs(x[a]) > std::fabs(x[b]); });
  order.resize(std::min(k, x.size()));
  std::sort(order.begin(), order.end());
  std::vector<std::pair<std::size_t, T>> out;
  for (std::size_t i : order) out.emplace_back(i, x[i]);
  return out;
}

/// Every (i, x_i) with |x_i| > t, in index order.
template <class T>
std::vector<std::pair<std::size_t, T>> reference_above(std::span<const T> x, double t) {
  std::vector<std::pair<std::size_t, T>> out;
  for (std::size_t i = 0; i < x.size(); ++i)
    if (std::fabs(double(x[i])) > t) out.emplace_back(i, x[i]);
  return out;
}

template <class T, class Index>
std::vector<std::pair<std::size_t, T>> entries(const sparse_vector<T, Index>& s) {
  std::vector<std::pair<std::size_t, T>> out;
  for (std::size_t i = 0; i < s.size(); ++i) out.emplace_back(std::size_t(s.indices()[i]), s.values()[i]);
  return out;
}

}  // namespace sidco::test
