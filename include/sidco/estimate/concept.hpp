// The estimator contract: what compressor<Estimator, ...> calls, and the optional hooks an
// estimator declares. A hook is declared by a flag, so that a misspelt hook is a compile
// error with a sentence instead of a feature silently switched off.
//
// Required: name; provides_threshold (false: the selection ignores the threshold);
// statistics (a backend::pass_statistics: what the moments pass gathers); and
// estimate(all, probes, delta, pass) -> threshold_estimate, where all is the moments of the
// whole input, probes the tails the moments pass measured where the estimator asked, delta
// the density to aim at, and pass its way to passes of its own (pass.tail<Log>(t),
// pass.count_above(t), pass.sample_magnitudes(state, out)). segmented<> on backend::cpu
// runs the estimates of different layers at once, on different threads: estimate() may
// change its own object and nothing shared.
//
// Optional hooks:
//   observes = true: observe(achieved_density, delta) after every call, with the density
//     the threshold yielded before any trimming (adaptive stages learn from it).
//   probes = true: probe_count() and probe_thresholds(span<double>): where the next moments
//     pass should measure tails (at most pipeline::tensor_state::max_probes, 2).
#pragma once

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

#include "sidco/core/moments.hpp"
#include "sidco/estimate/result.hpp"
#include "sidco/core/named.hpp"
#include "sidco/core/requirement.hpp"

namespace sidco::estimate {

namespace contract {

/// A stand-in for the pass the compressor hands to estimate(): the calls an estimator may make.
struct pass_archetype {
  template <bool Log>
  moments tail(double) { return {}; }
  std::size_t count_above(double) { return 0; }
  void sample_magnitudes(std::uint64_t, std::span<double>) {}
};

template <class E>
concept estimates = requires(E& e, const moments& all, std::span<const moments> probes, pass_archetype& pass) {
  { e.estimate(all, probes, 0.1, pass) } -> std::convertible_to<threshold_estimate>;
};

template <class E>
concept observer = requires(E& e) { e.observe(0.0, 0.0); };

template <class E>
concept prober = requires(const E& e, std::span<double> out) {
  { e.probe_count() } -> std::convertible_to<std::size_t>;
  e.probe_thresholds(out);
};

template <class E>
constexpr bool declares_observes() {
  if constexpr (requires { E::observes; })
    return E::observes;
  else
    return false;
}

template <class E>
constexpr bool declares_probes() {
  if constexpr (requires { E::probes; })
    return E::probes;
  else
    return false;
}

}  // namespace contract

/// Every requirement above, each with its sentence; true when all hold.
template <class E>
constexpr bool diagnose() {
  using sidco::detail::requirement;  // names the type in the assertion's first line
  static_assert(requirement<E, named_policy<E>>::holds,
                "sidco estimator: missing `static constexpr const char* name` (a checkpoint records it, so that a "
                "state is never loaded into another estimator)");
  static_assert(requirement<E, contract::estimates<E>>::holds,
                "sidco estimator: missing estimate(all, probes, delta, pass) returning a threshold_estimate");
  static_assert(requirement<E, (!contract::declares_observes<E>() || contract::observer<E>)>::holds,
                "sidco estimator: declares observes = true but has no observe(achieved_density, delta)");
  static_assert(requirement<E, (contract::declares_observes<E>() || !contract::observer<E>)>::holds,
                "sidco estimator: has observe(achieved_density, delta) but does not declare "
                "static constexpr bool observes = true, so it would never be called");
  static_assert(requirement<E, (!contract::declares_probes<E>() || contract::prober<E>)>::holds,
                "sidco estimator: declares probes = true but lacks probe_count() or "
                "probe_thresholds(span<double>)");
  static_assert(requirement<E, (contract::declares_probes<E>() || !contract::prober<E>)>::holds,
                "sidco estimator: has probe_count() and probe_thresholds() but does not declare "
                "static constexpr bool probes = true, so they would never be called");
  return true;
}

}  // namespace sidco::estimate
