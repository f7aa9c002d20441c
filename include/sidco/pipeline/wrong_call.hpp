// What is wrong with a compress call that matches none of the front end's overloads, so that
// the front end's catch-all can say it in one sentence instead of listing every candidate.
#pragma once

#include <cstddef>
#include <span>
#include <type_traits>

#include "sidco/core/sparse_vector.hpp"
#include "sidco/feedback/momentum.hpp"
#include "sidco/feedback/residual.hpp"

namespace sidco::pipeline {

/// Out's value type when Out is a sparse_vector in Memory.
template <class Memory, class Out>
struct output_of {
  static constexpr bool in_memory = false;  // not a sparse_vector of this memory space
  static constexpr bool sparse = false;     // not a sparse_vector at all
  using value = void;
};
template <class Memory, class T, class Index, class OtherMemory>
struct output_of<Memory, sparse_vector<T, Index, OtherMemory>> {
  static constexpr bool in_memory = std::is_same_v<Memory, OtherMemory>;
  static constexpr bool sparse = true;
  using value = T;
};

/// Whether State is feedback state the front end takes with values of T in Memory.
template <class Memory, class T, class State>
inline constexpr bool feedback_of = std::is_same_v<State, feedback::residual<T, Memory>> ||
                                    std::is_same_v<State, feedback::momentum<T, Memory>>;

/// A feedback state of some value type (to tell a wrong T from a wrong kind of argument).
template <class State>
inline constexpr bool any_feedback = false;
template <class U, class M>
inline constexpr bool any_feedback<feedback::residual<U, M>> = true;
template <class U, class M>
inline constexpr bool any_feedback<feedback::momentum<U, M>> = true;

template <class Memory, class Gradient, class Out, class... State>
struct compress_call {
  using output = output_of<Memory, std::remove_cvref_t<Out>>;
  using T = typename output::value;
  static constexpr bool output_ok = output::in_memory;
  static constexpr bool pointer = std::is_pointer_v<std::remove_cvref_t<Gradient>>;
  static constexpr bool gradient_ok = [] {
    if constexpr (output_ok)
      return std::is_convertible_v<const Gradient&, typename Memory::template view<const T>>;
    else
      return false;
  }();
  static constexpr bool state_count_ok = sizeof...(State) <= 1;
  static constexpr bool state_kind_ok = (any_feedback<std::remove_cvref_t<State>> && ...);
  static constexpr bool state_ok = [] {
    if constexpr (output_ok)
      return state_count_ok && (feedback_of<Memory, T, std::remove_cvref_t<State>> && ...);
    else
      return false;
  }();
  /// What one of the front end's overloads takes.
  static constexpr bool viable = output_ok && gradient_ok && state_ok;
  /// A host range given to a front end over device memory: the front end's own overload for
  /// that case says so.
  static constexpr bool host_span_for_device = [] {
    if constexpr (output_ok)
      return !std::is_same_v<typename Memory::template view<const T>, std::span<const T>> &&
             std::is_convertible_v<const Gradient&, std::span<const T>>;
    else
      return false;
  }();
};

}  // namespace sidco::pipeline
