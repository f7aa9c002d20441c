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
#include "sidco/pipeline/wrong_call.hpp"

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

  /// Any other call: a compile error that names the mistake (pipeline/wrong_call.hpp)
  /// instead of a list of candidates.
  template <class Gradient, class Out, class... State>
    requires(!compress_call<Memory, Gradient, Out, State...>::viable &&
             !compress_call<Memory, Gradient, Out, State...>::host_span_for_device)
  compress_report compress(const Gradient&, double, Out&, State&...) {
    wrong_call<Gradient, Out, State...>();
    return {};
  }

  /// The same with an explicit element type, compress<T>(...) (T is never deduced here, so
  /// only such calls reach it): a T that is not the output's, or any mistake above.
  template <class T, class Gradient, class Out, class... State>
    requires((!compress_call<Memory, Gradient, Out, State...>::viable ||
              !std::is_same_v<T, typename compress_call<Memory, Gradient, Out, State...>::T>) &&
             !compress_call<Memory, Gradient, Out, State...>::host_span_for_device)
  compress_report compress(const Gradient&, double, Out&, State&...) {
    using call = compress_call<Memory, Gradient, Out, State...>;
    constexpr bool t_ok = !call::output_ok || std::is_same_v<T, typename call::T>;
    static_assert(t_ok,
                  "sidco compress: compress<T>(...) names a T that is not the output sparse_vector's element "
                  "type; leave it out (compress(gradient, delta, out) deduces it)");
    if constexpr (t_ok) wrong_call<Gradient, Out, State...>();
    return {};
  }

 private:
  /// One sentence for the first thing wrong with a call no overload takes.
  template <class Gradient, class Out, class... State>
  static constexpr void wrong_call() {
    using call = compress_call<Memory, Gradient, Out, State...>;
    static_assert(call::output::sparse,
                  "sidco compress: the third argument must be a sidco::sparse_vector<T> (it receives the "
                  "selection), with T the gradient's element type");
    static_assert(!call::output::sparse || call::output_ok,
                  "sidco compress: the output sparse_vector is in another memory space than this compressor's "
                  "backend writes (backend::cuda: sparse_vector<T, std::uint32_t, memory::device>; the host "
                  "backends: sparse_vector<T>)");
    static_assert(!call::output_ok || !call::pointer,
                  "sidco compress: a raw pointer carries no size; pass std::span<const T>(pointer, size), or "
                  "memory::device::view<const T>(pointer, size) to a device compressor");
    static_assert(!call::output_ok || call::pointer || call::gradient_ok,
                  "sidco compress: the gradient is not a contiguous range of the output's element type T (T "
                  "comes from the sparse_vector: a std::vector<double> into a sparse_vector<float> is this "
                  "mistake; give both the same type)");
    static_assert(!call::output_ok || !call::gradient_ok || call::state_count_ok,
                  "sidco compress: at most one feedback state follows the output (a feedback::residual, or "
                  "DGC's feedback::momentum)");
    static_assert(!call::output_ok || !call::gradient_ok || !call::state_count_ok || call::state_kind_ok,
                  "sidco compress: the fourth argument must be a feedback::residual<T> or a "
                  "feedback::momentum<T>");
    static_assert(!call::output_ok || !call::gradient_ok || !call::state_count_ok || !call::state_kind_ok,
                  "sidco compress: the feedback state's element type or memory space is not the output's "
                  "(feedback::residual<T> with the sparse_vector's T, in the backend's memory space)");
  }

  Derived& derived() { return static_cast<Derived&>(*this); }
};

}  // namespace sidco::pipeline
