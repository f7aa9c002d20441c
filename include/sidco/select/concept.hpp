// The selection contract: what compressor<Estimator, Selection, Backend> and segmented<>
// call, and the optional hooks a selection declares. As for estimators, a hook is declared
// by a flag, so that a misspelt hook is a compile error with a sentence instead of a
// feature silently switched off.
//
// Required: name; needs_threshold (true: it keeps values above the estimator's threshold);
// fuses_layers (true: it is |x| > t itself, which the backend runs over every layer in one
// pass, so it has nothing more to provide); estimation_density(delta), the density the
// estimator should aim at. Then one of three ways to select:
//   fuses_layers = true: nothing else.
//   ranks_candidates = true: start(backend, source, threshold, k) -> candidate_start (where
//     its candidate pass starts) or, with starts_from_kth_bin = true, start_from_bin(bin);
//     and keep(k, candidates) -> how many of the candidates it keeps (select/candidates.hpp).
//   neither: select(backend, source, threshold, k, out) -> selection_result.
//
// Optional hook:
//   widens = true (with ranks_candidates): widen(backend, source, k, threshold, out, count,
//     result, band_starts) appends bands below the threshold until count reaches k.
#pragma once

#include <concepts>
#include <cstddef>
#include <string_view>
#include <type_traits>

#include "sidco/core/named.hpp"
#include "sidco/core/requirement.hpp"

namespace sidco::select {

namespace contract {

template <class S>
concept flagged = requires {
  { S::needs_threshold } -> std::convertible_to<bool>;
  { S::fuses_layers } -> std::convertible_to<bool>;
};

template <class S>
concept aims = requires(const S& s) {
  { s.estimation_density(0.1) } -> std::convertible_to<double>;
};

// Whether S declares the static flag Name = true (absent: false).
#define SIDCO_SELECTION_FLAG(Name)                   \
  template <class S>                                 \
  constexpr bool declares_##Name() {                 \
    if constexpr (requires { S::Name; })             \
      return bool(S::Name);                          \
    else                                             \
      return false;                                  \
  }
SIDCO_SELECTION_FLAG(fuses_layers)
SIDCO_SELECTION_FLAG(ranks_candidates)
SIDCO_SELECTION_FLAG(starts_from_kth_bin)
SIDCO_SELECTION_FLAG(widens)
#undef SIDCO_SELECTION_FLAG

// Whether S has a member of this name, whatever its kind or signature (a template
// included): a class that also inherits one from a base makes the name ambiguous.
#define SIDCO_SELECTION_MEMBER(Name)                                                  \
  struct Name##_decoy {                                                               \
    void Name();                                                                      \
  };                                                                                  \
  template <class S>                                                                  \
  struct Name##_probe : S, Name##_decoy {};                                           \
  template <class S>                                                                  \
  constexpr bool has_##Name() {                                                       \
    if constexpr (std::is_class_v<S> && !std::is_final_v<S>)                          \
      return !requires { &Name##_probe<S>::Name; };                                   \
    else                                                                              \
      return false;                                                                   \
  }
SIDCO_SELECTION_MEMBER(select)
SIDCO_SELECTION_MEMBER(start)
SIDCO_SELECTION_MEMBER(start_from_bin)
SIDCO_SELECTION_MEMBER(keep)
SIDCO_SELECTION_MEMBER(widen)
#undef SIDCO_SELECTION_MEMBER

}  // namespace contract

/// Whether S looks like an attempt at a selection (so that diagnose's sentences fit).
template <class S>
concept selection_like = requires { S::needs_threshold; } || requires { S::fuses_layers; } ||
                         requires { S::ranks_candidates; };

/// Every requirement above, each with its sentence; true when all hold.
template <class S>
constexpr bool diagnose() {
  using sidco::detail::requirement;  // names the type in the assertion's first line
  using namespace contract;
  static_assert(requirement<S, named_policy<S>>::holds, "sidco selection: missing `static constexpr const char* name`");
  static_assert(requirement<S, flagged<S>>::holds,
                "sidco selection: missing `static constexpr bool needs_threshold` or `fuses_layers`");
  static_assert(requirement<S, aims<S>>::holds,
                "sidco selection: missing estimation_density(delta), the density the estimator aims at");
  static_assert(requirement<S, (!(declares_fuses_layers<S>() && declares_ranks_candidates<S>()))>::holds,
                "sidco selection: declares both fuses_layers and ranks_candidates; a selection is one of them");
  static_assert(
      requirement<S, (declares_fuses_layers<S>() || declares_ranks_candidates<S>() || has_select<S>())>::holds,
      "sidco selection: neither fuses_layers nor ranks_candidates, so it needs "
      "select(backend, source, threshold, k, out) returning a selection_result");
  static_assert(requirement<S, (!declares_ranks_candidates<S>() || has_keep<S>())>::holds,
                "sidco selection: declares ranks_candidates = true but has no keep(k, candidates)");
  static_assert(
      requirement<S, (!declares_ranks_candidates<S>() || declares_starts_from_kth_bin<S>() || has_start<S>())>::holds,
      "sidco selection: declares ranks_candidates = true but has no start(backend, source, threshold, k)");
  static_assert(requirement<S, (!declares_starts_from_kth_bin<S>() || has_start_from_bin<S>())>::holds,
                "sidco selection: declares starts_from_kth_bin = true but has no start_from_bin(bin)");
  static_assert(requirement<S, (!declares_widens<S>() || (declares_ranks_candidates<S>() && has_widen<S>()))>::holds,
                "sidco selection: declares widens = true but has no widen(backend, source, k, threshold, out, "
                "count, result, band_starts), or does not rank candidates");
  static_assert(requirement<S, (declares_widens<S>() || !has_widen<S>())>::holds,
                "sidco selection: has widen(...) but does not declare `static constexpr bool widens = true`, "
                "so it would never be called");
  return true;
}

}  // namespace sidco::select
