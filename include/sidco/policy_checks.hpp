// What a type must have to be given on each axis of compressor<Estimator, Selection,
// Backend>, so that a type given on the wrong axis fails with a sentence naming the axis.
#pragma once

#include <concepts>

namespace sidco::detail {

template <class E>
concept estimator_policy = requires {
  { E::provides_threshold } -> std::convertible_to<bool>;
  typename E::statistics;
};

template <class S>
concept selection_policy = requires(const S& s) {
  { S::needs_threshold } -> std::convertible_to<bool>;
  { S::fuses_layers } -> std::convertible_to<bool>;
  s.estimation_density(0.1);
};

template <class B>
concept backend_like = requires { typename B::memory; };

template <class S>
constexpr bool needs_threshold() {
  if constexpr (selection_policy<S>)
    return S::needs_threshold;
  else
    return false;
}

template <class E>
constexpr bool provides_threshold() {
  if constexpr (estimator_policy<E>)
    return E::provides_threshold;
  else
    return false;
}

}  // namespace sidco::detail
