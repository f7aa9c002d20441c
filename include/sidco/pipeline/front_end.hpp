// The compress overloads every front end of the pipeline offers (compressor for one segment,
// segmented for many), written once: Derived supplies check_call(size, delta, out), which
// refuses a bad call before anything is read, and run(input, delta, out).
#pragma once

#include <cstddef>
#include <span>
#include <type_traits>

#include "sidco/core/sparse_vector.hpp"
#include "sidco/feedback/momentum.hpp"
#include "sidco/feedback/residual.hpp"
#include "sidco/pipeline/input.hpp"
#include "sidco/pipeline/report.hpp"

namespace sidco::pipeline {

template <class Derived, class Memory>
class front_end {
  template <class T>
  using view = typename Memory::template view<T>;

 public:
  /// Compresses gradient at density delta in (0, 1] into out (cleared first).
  template <class T, class Index>
  compress_report compress(view<const std::type_identity_t<T>> gradient, double delta,
                           sparse_vector<T, Index, Memory>& out) {
    derived().check_call(gradient.size(), delta, out);
    return derived().run(plain<T, Memory>(gradient), delta, out);
  }

  /// Compresses gradient + residual and leaves in residual what was not sent.
  template <class T, class Index>
  compress_report compress(view<const std::type_identity_t<T>> gradient, double delta,
                           sparse_vector<T, Index, Memory>& out, feedback::residual<T, Memory>& residual) {
    derived().check_call(gradient.size(), delta, out);
    return derived().run(with_residual<T, Memory>(gradient, residual), delta, out);
  }

  /// DGC: compresses the momentum-corrected accumulation and masks what was sent.
  template <class T, class Index>
  compress_report compress(view<const std::type_identity_t<T>> gradient, double delta,
                           sparse_vector<T, Index, Memory>& out, feedback::momentum<T, Memory>& state) {
    derived().check_call(gradient.size(), delta, out);
    return derived().run(with_momentum<T, Memory>(gradient, state), delta, out);
  }

  /// A host span or vector given to a front end over another memory space: a compile error
  /// with a sentence instead of a list of candidates.
  template <class T, class Index, class... State>
    requires(!host_views<Memory, T>)
  compress_report compress(std::span<const std::type_identity_t<T>>, double, sparse_vector<T, Index, Memory>&,
                           State&...) {
    static_assert(host_views<Memory, T>, SIDCO_HOST_GRADIENT_FOR_DEVICE_MESSAGE);
    return {};
  }

 private:
  Derived& derived() { return static_cast<Derived&>(*this); }
};

}  // namespace sidco::pipeline
