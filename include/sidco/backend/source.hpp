// What a pass reads: the gradient alone, or the gradient plus an error-feedback residual.
#pragma once

#include <cstddef>

namespace sidco::backend {

/// The gradient as it is.
template <class T>
struct plain_source {
  static constexpr bool has_residual = false;
  const T* gradient;
  std::size_t size;

  T value(std::size_t i) const { return gradient[i]; }
};

/// gradient + residual, read in the same pass. settle() writes the new residual: zero where
/// the value was sent, the whole value where it was not, so nothing is ever lost.
template <class T>
struct feedback_source {
  static constexpr bool has_residual = true;
  const T* gradient;
  T* residual;
  std::size_t size;

  T value(std::size_t i) const { return gradient[i] + residual[i]; }
  void settle(std::size_t i, T value, bool sent) const { residual[i] = sent ? T(0) : value; }
};

}  // namespace sidco::backend
