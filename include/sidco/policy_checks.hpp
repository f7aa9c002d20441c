// What a type must have to be given on each axis of compressor<Estimator, Selection,
// Backend>, so that a type given on the wrong axis fails with a sentence naming the axis.
#pragma once

#include <concepts>

namespace sidco::estimate {
template <class First, class Tail, class Stages, class Fit>
class statistical;
}  // namespace sidco::estimate

namespace sidco::detail {

template <class E>
concept estimator_policy = requires {
  { E::provides_threshold } -> std::convertible_to<bool>;
  typename E::statistics;
};

/// estimate::statistical<...>, known by name: checks that read it would instantiate it, and
/// its own sentences (a policy in the wrong slot) come first.
template <class E>
inline constexpr bool is_statistical = false;
template <class First, class Tail, class Stages, class Fit>
inline constexpr bool is_statistical<estimate::statistical<First, Tail, Stages, Fit>> = true;

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
