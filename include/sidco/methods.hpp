// The registry of published methods: each method's composition (estimator and selection)
// written once, with its name, a one-line description and what it promises about the count.
// Presets (presets.hpp) are one-line aliases of these entries; bindings (PyTorch), tools
// (sidco-eval), examples, fuzzers and the tests iterate the table, so an entry added here is
// picked up by all of them.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>

#include "sidco/backend/cpu.hpp"
#include "sidco/backend/serial.hpp"
#include "sidco/compressor.hpp"
#include "sidco/core/error.hpp"
#include "sidco/models/exponential.hpp"
#include "sidco/models/gamma.hpp"
#include "sidco/models/generalized_pareto.hpp"
#include "sidco/models/weibull.hpp"
#include "sidco/estimate/gaussian_k.hpp"
#include "sidco/estimate/none.hpp"
#include "sidco/estimate/redsync.hpp"
#include "sidco/estimate/sampled.hpp"
#include "sidco/estimate/statistical.hpp"
#include "sidco/select/exact_k.hpp"
#include "sidco/select/random_k.hpp"
#include "sidco/select/top_k.hpp"
#include "sidco/select/trimmed.hpp"
#include "sidco/stages/stages.hpp"

namespace sidco::methods {

/// Run-time options a method may take by name (a binding passes them through).
struct options {
  std::uint64_t seed = 0x51dc0;  // random-k's shared seed
};

/// What a method promises about how many values it keeps per tensor.
enum class count_promise : std::uint8_t {
  about_k,    // a threshold decides: about k = max(1, floor(delta N))
  exactly_k,  // exactly k, whichever they are
  top_k,      // exactly the k largest |x|, ties to the lower index
};

struct info {
  std::string_view name;
  std::string_view description;
  count_promise count;
  /// Delivers exactly k = max(1, floor(delta N)) values per tensor.
  constexpr bool exact_count() const { return count != count_promise::about_k; }
};

// An entry: `about`, the `estimator` and the `selection`; make_selection(options) where a
// run-time option matters. Backend is the one parameter left (compressor_of below).
template <class First, class Tail, class Stages, class Fit = fit::zero_aware>
using sidco_estimator = estimate::statistical<First, Tail, Stages, Fit>;

struct sidco_e {
  static constexpr info about{"sidco-e", "SIDCo, exponential fits, adaptive stages (the default)",
                              count_promise::about_k};
  using estimator = sidco_estimator<models::exponential, models::exponential, stages::adaptive>;
  using selection = select::above_threshold;
};
struct sidco_gp {
  static constexpr info about{"sidco-gp", "SIDCo, generalized Pareto fits, adaptive stages", count_promise::about_k};
  using estimator = sidco_estimator<models::generalized_pareto, models::generalized_pareto, stages::adaptive>;
  using selection = select::above_threshold;
};
struct sidco_gamma_gp {
  static constexpr info about{"sidco-gamma-gp", "SIDCo, gamma for stage 1, then generalized Pareto",
                              count_promise::about_k};
  using estimator = sidco_estimator<models::gamma, models::generalized_pareto, stages::adaptive>;
  using selection = select::above_threshold;
};
struct sidco_weibull {
  static constexpr info about{"sidco-weibull", "SIDCo, Weibull fits, adaptive stages", count_promise::about_k};
  using estimator = sidco_estimator<models::weibull, models::weibull, stages::adaptive>;
  using selection = select::above_threshold;
};
struct sidco_e_single {
  static constexpr info about{"sidco-e-single", "SIDCo, one exponential fit", count_promise::about_k};
  using estimator = sidco_estimator<models::exponential, models::exponential, stages::single>;
  using selection = select::above_threshold;
};
struct sidco_gp_single {
  static constexpr info about{"sidco-gp-single", "SIDCo, one generalized Pareto fit", count_promise::about_k};
  using estimator = sidco_estimator<models::generalized_pareto, models::generalized_pareto, stages::single>;
  using selection = select::above_threshold;
};
struct sidco_gamma_single {
  static constexpr info about{"sidco-gamma-single", "SIDCo, one gamma fit", count_promise::about_k};
  using estimator = sidco_estimator<models::gamma, models::gamma, stages::single>;
  using selection = select::above_threshold;
};
struct sidco_e_paper {
  static constexpr info about{"sidco-e-paper",
                              "the original SIDCo-E fit (zeros in the sample, fixed stage fractions)",
                              count_promise::about_k};
  using estimator = sidco_estimator<models::exponential, models::exponential, stages::adaptive, fit::paper>;
  using selection = select::above_threshold;
};
struct sidco_gp_paper {
  static constexpr info about{"sidco-gp-paper", "the original SIDCo-GP fit", count_promise::about_k};
  using estimator =
      sidco_estimator<models::generalized_pareto, models::generalized_pareto, stages::adaptive, fit::paper>;
  using selection = select::above_threshold;
};
struct sidco_gamma_gp_paper {
  static constexpr info about{"sidco-gamma-gp-paper", "the original SIDCo-Gamma-GP fit", count_promise::about_k};
  using estimator = sidco_estimator<models::gamma, models::generalized_pareto, stages::adaptive, fit::paper>;
  using selection = select::above_threshold;
};
struct top_k {
  static constexpr info about{"top-k", "exact Top-k by radix select (ties to the lower index)",
                              count_promise::top_k};
  using estimator = estimate::none;
  using selection = select::top_k;
};
struct sidco_e_exact {
  static constexpr info about{"sidco-e-exact", "the SIDCo-E threshold, then exactly k (exact_k)",
                              count_promise::top_k};
  using estimator = sidco_e::estimator;
  using selection = select::exact_k;
};
struct sidco_gp_exact {
  static constexpr info about{"sidco-gp-exact", "the SIDCo-GP threshold, then exactly k (exact_k)",
                              count_promise::top_k};
  using estimator = sidco_gp::estimator;
  using selection = select::exact_k;
};
struct random_k {
  static constexpr info about{"random-k", "k uniformly random indices, the same on every worker (seed)",
                              count_promise::exactly_k};
  using estimator = estimate::none;
  using selection = select::random_k;
  static selection make_selection(const options& o) { return select::random_k{o.seed}; }
};
struct dgc {
  static constexpr info about{"dgc", "DGC: a sampled threshold, trimmed to k beyond 1.2 k", count_promise::about_k};
  using estimator = estimate::sampled;
  using selection = select::trimmed<20>;
};
struct gaussian_k {
  static constexpr info about{"gaussian-k", "Gaussian-k: a normal quantile, adjusted towards k",
                              count_promise::about_k};
  using estimator = estimate::gaussian_k;
  using selection = select::above_threshold;
};
struct redsync {
  static constexpr info about{"redsync", "RedSync: mean + r (max - mean), r by bisection", count_promise::about_k};
  using estimator = estimate::redsync;
  using selection = select::above_threshold;
};
struct redsync_trimmed {
  static constexpr info about{"redsync-trimmed", "RedSync, trimmed to k when it keeps more", count_promise::about_k};
  using estimator = estimate::redsync;
  using selection = select::trimmed<0>;
};

/// The compressor an entry composes, on Backend.
template <class Method, class Backend = backend::cpu>
using compressor_of = compressor<typename Method::estimator, typename Method::selection, Backend>;

/// The entry's compressor built with the run-time options it takes (random-k's seed).
template <class Method, class Backend = backend::cpu>
compressor_of<Method, Backend> make(const options& o = {}) {
  if constexpr (requires { Method::make_selection(o); })
    return compressor_of<Method, Backend>(typename Method::estimator{}, Method::make_selection(o));
  else
    return compressor_of<Method, Backend>{};
}

template <class... Entries>
struct table_of {
  static constexpr std::array<info, sizeof...(Entries)> infos{Entries::about...};

  /// f(std::type_identity<Entry>{}) for every entry, in order: how tests and tools iterate
  /// the registry at compile time.
  template <class F>
  static void for_each(F&& f) {
    (f(std::type_identity<Entries>{}), ...);
  }

  /// f(compressor) with the method called name built for Backend; an unknown name is a
  /// sidco::error that lists the known ones.
  template <class Backend, class F>
  static auto visit(std::string_view name, const options& o, F&& f) {
    using first = std::tuple_element_t<0, std::tuple<Entries...>>;
    using result = decltype(f(std::declval<compressor_of<first, Backend>>()));
    if constexpr (std::is_void_v<result>) {
      const bool found = ((name == Entries::about.name ? (f(make<Entries, Backend>(o)), true) : false) || ...);
      if (!found) unknown(name);
    } else {
      std::optional<result> out;
      const bool found =
          ((name == Entries::about.name ? (out.emplace(f(make<Entries, Backend>(o))), true) : false) || ...);
      if (!found) unknown(name);
      return std::move(*out);
    }
  }

  /// The names, comma-separated, for messages and help texts.
  static std::string names() {
    std::string out;
    for (const info& i : infos) out += (out.empty() ? "" : ", ") + std::string(i.name);
    return out;
  }

  static const info* find(std::string_view name) {
    for (const info& i : infos)
      if (i.name == name) return &i;
    return nullptr;
  }

 private:
  [[noreturn]] static void unknown(std::string_view name) {
    detail::fail("method '", name, "' is not one of ", names());
  }
};

/// Every method, in the order tools list them.
using all = table_of<sidco_e, sidco_gp, sidco_gamma_gp, sidco_weibull, sidco_e_single, sidco_gp_single,
                     sidco_gamma_single, sidco_e_paper, sidco_gp_paper, sidco_gamma_gp_paper, top_k,
                     sidco_e_exact, sidco_gp_exact, random_k, dgc, gaussian_k, redsync, redsync_trimmed>;

/// name, description and promise of every method.
inline constexpr const auto& table = all::infos;

/// f(compressor) with the method called name on Backend (default backend::cpu).
template <class Backend = backend::cpu, class F>
auto visit(std::string_view name, const options& o, F&& f) {
  return all::visit<Backend>(name, o, std::forward<F>(f));
}

}  // namespace sidco::methods
