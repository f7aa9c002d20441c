// Error feedback: what was not sent is kept and added to the next gradient.
#pragma once

#include <algorithm>
#include <cstddef>
#include <span>
#include <vector>

namespace sidco::feedback {

/// The residual r of one tensor. compressor::compress(g, delta, out, r) compresses g + r and
/// leaves in r exactly what it did not send, in the same passes (no extra copy of g).
template <class T>
class residual {
 public:
  residual() = default;
  explicit residual(std::size_t size) : values_(size, T(0)) {}

  std::size_t size() const { return values_.size(); }
  std::span<const T> values() const { return values_; }
  std::span<T> values() { return values_; }
  T* data() { return values_.data(); }

  /// Forget what was accumulated (e.g. after a model reset).
  void reset() { std::fill(values_.begin(), values_.end(), T(0)); }

 private:
  std::vector<T> values_;
};

}  // namespace sidco::feedback
