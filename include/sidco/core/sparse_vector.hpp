// The compressed form of a gradient: ascending indices and the values found there.
#pragma once

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <utility>

#include "sidco/core/error.hpp"
#include "sidco/memory/host.hpp"

namespace sidco {

/// Indices are strictly ascending after a compress. Index is 32-bit by default (a gradient
/// of up to 2^32 values); use std::uint64_t beyond that. The entries live in Memory (host
/// memory by default; a backend's memory space otherwise, e.g. device memory for CUDA).
/// Storage is kept across clear(), so a vector reused for the same tensor and density
/// allocates only on its first calls.
template <class T, class Index = std::uint32_t, class Memory = memory::host>
class sparse_vector {
  static_assert(std::unsigned_integral<Index>, "sparse_vector<T, Index>: Index must be unsigned");

 public:
  using value_type = T;
  using index_type = Index;
  using memory_space = Memory;
  template <class U>
  using view = typename Memory::template view<U>;
  template <class U>
  using pointer = typename Memory::template pointer<U>;

  /// The largest dense size whose every index fits in Index.
  static constexpr std::size_t max_dense_size =
      sizeof(Index) >= sizeof(std::size_t) ? std::numeric_limits<std::size_t>::max()
                                           : std::size_t(std::numeric_limits<Index>::max()) + 1;

  sparse_vector() = default;
  explicit sparse_vector(std::size_t dense_size) { clear(dense_size); }

  /// Empties the vector for a dense vector of dense_size values, keeping the storage.
  void clear(std::size_t dense_size) {
    if (dense_size > max_dense_size)
      detail::fail("sparse_vector: dense size ", dense_size, " exceeds the ", 8 * sizeof(Index),
                   "-bit index range (", max_dense_size, "); use std::uint64_t indices");
    dense_size_ = dense_size;
    indices_.clear();
    values_.clear();
  }

  void reserve(std::size_t count) {
    indices_.reserve(count);
    values_.reserve(count);
  }

  /// Appends one entry (host memory only); the caller keeps indices ascending and below
  /// dense_size().
  void push_back(Index index, T value) {
    indices_.push_back(index);
    values_.push_back(value);
  }

  std::size_t size() const { return indices_.size(); }
  bool empty() const { return size() == 0; }
  std::size_t dense_size() const { return dense_size_; }
  std::size_t capacity() const { return std::min(indices_.capacity(), values_.capacity()); }
  double density() const { return dense_size_ ? double(size()) / double(dense_size_) : 0.0; }

  /// The entries, in Memory (for host memory, std::span).
  view<const Index> indices() const { return {pointer<const Index>(indices_.data()), size()}; }
  view<const T> values() const { return {pointer<const T>(values_.data()), size()}; }

  /// Mutable access for backends, which keep indices ascending.
  view<Index> mutable_indices() { return {indices_.data(), size()}; }
  view<T> mutable_values() { return {values_.data(), size()}; }
  pointer<Index> index_data() { return indices_.data(); }
  pointer<T> value_data() { return values_.data(); }

  /// Grows or shrinks to count entries; new ones are unspecified until a backend writes
  /// them. Growth is geometric, so counts that creep up call after call (error feedback) do
  /// not allocate on every call.
  void resize(std::size_t count) {
    if (count > capacity()) reserve(std::max(count, 2 * capacity()));
    indices_.resize(count);
    values_.resize(count);
  }

  /// Keeps the first count entries.
  void truncate(std::size_t count) {
    if (count < size()) {
      indices_.resize(count);
      values_.resize(count);
    }
  }

  /// f(buffer) for both buffers: for a memory space's own settings (backend::cuda orders
  /// their growth on its stream).
  template <class F>
  void for_each_buffer(F&& f) {
    f(indices_);
    f(values_);
  }
  template <class F>
  void for_each_buffer(F&& f) const {
    f(indices_);
    f(values_);
  }

  void swap(sparse_vector& other) noexcept {
    std::swap(dense_size_, other.dense_size_);
    indices_.swap(other.indices_);
    values_.swap(other.values_);
  }

  /// Bytes this vector puts on the wire (indices and values).
  std::size_t payload_bytes() const { return size() * (sizeof(Index) + sizeof(T)); }

 private:
  std::size_t dense_size_ = 0;
  typename Memory::template buffer<Index> indices_;
  typename Memory::template buffer<T> values_;
};

}  // namespace sidco
