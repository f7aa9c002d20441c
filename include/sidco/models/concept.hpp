// The distribution-model contract: what estimate::statistical<First, Tail, ...> calls on a
// model of gradient magnitudes.
//
// Required: name; needs_log (whether fit reads sum_log, so that the moments pass gathers
// ln a only when a model needs it); static fit(const moments&) -> Model, from the non-zero
// magnitudes (count, sum, sum of squares, sum of logs, min, max); and
// upper_quantile(rho) -> double, the t with P(a > t) = rho for rho in (0, 1]. A degenerate
// fit may return a quantile that is not finite: the estimator and the compressor's fallback
// handle it, so a model need not throw. ccdf(t) = P(a > t) is not called by the library; the
// oracle tests use it.
#pragma once

#include <concepts>

#include "sidco/core/moments.hpp"
#include "sidco/core/requirement.hpp"

namespace sidco::models {

namespace contract {

template <class M>
concept named = requires {
  { M::name } -> std::convertible_to<const char*>;
  { M::needs_log } -> std::convertible_to<bool>;
};

template <class M>
concept fits = requires(const moments& m) {
  { M::fit(m) } -> std::convertible_to<M>;
};

template <class M>
concept has_quantile = requires(const M& model) {
  { model.upper_quantile(0.01) } -> std::convertible_to<double>;
};

}  // namespace contract

/// Looks like a distribution model (fits moments or gives a quantile): to tell one given
/// where an estimator belongs.
template <class M>
concept model_like = contract::fits<M> || contract::has_quantile<M>;

/// Every requirement above.
template <class M>
concept distribution_model = contract::named<M> && contract::fits<M> && contract::has_quantile<M>;

/// Every requirement above, each with its sentence; true when all hold.
template <class M>
constexpr bool diagnose() {
  using sidco::detail::requirement;  // names the type in the assertion's first line
  static_assert(requirement<M, contract::named<M>>::holds,
                "sidco distribution model: missing static constexpr name or needs_log (whether fit reads sum_log)");
  static_assert(requirement<M, contract::fits<M>>::holds,
                "sidco distribution model: missing static Model fit(const moments&)");
  static_assert(requirement<M, contract::has_quantile<M>>::holds,
                "sidco distribution model: missing double upper_quantile(double rho) const (t with P(a > t) = rho)");
  return true;
}

}  // namespace sidco::models
