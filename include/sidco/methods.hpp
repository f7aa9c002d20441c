// The published methods by name: the one table that bindings (PyTorch), tools (sidco-eval),
// examples and fuzzers choose from at run time. Each entry is a name, a one-line
// description, what it promises, and the preset it builds on any backend.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

#include "sidco/core/error.hpp"
#include "sidco/presets.hpp"

namespace sidco::methods {

/// Run-time options a method may take by name (a binding passes them through).
struct options {
  std::uint64_t seed = 0x51dc0;  // random-k's shared seed
};

struct info {
  std::string_view name;
  std::string_view description;
  bool exact_count;  // delivers exactly k = max(1, floor(delta N)) values per tensor
};

// One entry per method: about, and preset<Backend>. make<Backend>(options) builds it where
// an option matters; otherwise the preset's default is used.
struct sidco_e {
  static constexpr info about{"sidco-e", "SIDCo, exponential fits, adaptive stages (the default)", false};
  template <class B>
  using preset = presets::sidco_e<select::above_threshold, B>;
};
struct sidco_gp {
  static constexpr info about{"sidco-gp", "SIDCo, generalized Pareto fits, adaptive stages", false};
  template <class B>
  using preset = presets::sidco_gp<select::above_threshold, B>;
};
struct sidco_gamma_gp {
  static constexpr info about{"sidco-gamma-gp", "SIDCo, gamma for stage 1, then generalized Pareto", false};
  template <class B>
  using preset = presets::sidco_gamma_gp<select::above_threshold, B>;
};
struct sidco_weibull {
  static constexpr info about{"sidco-weibull", "SIDCo, Weibull fits, adaptive stages", false};
  template <class B>
  using preset = presets::sidco_weibull<select::above_threshold, B>;
};
struct sidco_e_single {
  static constexpr info about{"sidco-e-single", "SIDCo, one exponential fit", false};
  template <class B>
  using preset = presets::sidco_e_single<select::above_threshold, B>;
};
struct sidco_gp_single {
  static constexpr info about{"sidco-gp-single", "SIDCo, one generalized Pareto fit", false};
  template <class B>
  using preset = presets::sidco_gp_single<select::above_threshold, B>;
};
struct sidco_gamma_single {
  static constexpr info about{"sidco-gamma-single", "SIDCo, one gamma fit", false};
  template <class B>
  using preset = presets::sidco_gamma_single<select::above_threshold, B>;
};
struct sidco_e_paper {
  static constexpr info about{"sidco-e-paper", "the original SIDCo-E fit (zeros in the sample, fixed stage fractions)",
                              false};
  template <class B>
  using preset = presets::sidco_e_paper<select::above_threshold, B>;
};
struct sidco_gp_paper {
  static constexpr info about{"sidco-gp-paper", "the original SIDCo-GP fit", false};
  template <class B>
  using preset = presets::sidco_gp_paper<select::above_threshold, B>;
};
struct sidco_gamma_gp_paper {
  static constexpr info about{"sidco-gamma-gp-paper", "the original SIDCo-Gamma-GP fit", false};
  template <class B>
  using preset = presets::sidco_gamma_gp_paper<select::above_threshold, B>;
};
struct top_k {
  static constexpr info about{"top-k", "exact Top-k by radix select (ties to the lower index)", true};
  template <class B>
  using preset = presets::top_k<B>;
};
struct sidco_e_exact {
  static constexpr info about{"sidco-e-exact", "the SIDCo-E threshold, then exactly k (exact_k)", true};
  template <class B>
  using preset = presets::sidco_e_exact<B>;
};
struct sidco_gp_exact {
  static constexpr info about{"sidco-gp-exact", "the SIDCo-GP threshold, then exactly k (exact_k)", true};
  template <class B>
  using preset = presets::sidco_gp_exact<B>;
};
struct random_k {
  static constexpr info about{"random-k", "k uniformly random indices, the same on every worker (seed)", true};
  template <class B>
  using preset = presets::random_k<B>;
  template <class B>
  static preset<B> make(const options& o) {
    return preset<B>(estimate::none{}, select::random_k{o.seed});
  }
};
struct dgc {
  static constexpr info about{"dgc", "DGC: a sampled threshold, trimmed to k beyond 1.2 k", false};
  template <class B>
  using preset = presets::dgc<select::trimmed<20>, B>;
};
struct gaussian_k {
  static constexpr info about{"gaussian-k", "Gaussian-k: a normal quantile, adjusted towards k", false};
  template <class B>
  using preset = presets::gaussian_k<select::above_threshold, B>;
};
struct redsync {
  static constexpr info about{"redsync", "RedSync: mean + r (max - mean), r by bisection", false};
  template <class B>
  using preset = presets::redsync<select::above_threshold, B>;
};
struct redsync_trimmed {
  static constexpr info about{"redsync-trimmed", "RedSync, trimmed to k when it keeps more", false};
  template <class B>
  using preset = presets::redsync_trimmed<B>;
};

template <class... Entries>
struct table_of {
  static constexpr std::array<info, sizeof...(Entries)> infos{Entries::about...};

  /// f(preset) with the method called name built for Backend; an unknown name is a
  /// sidco::error that lists the known ones.
  template <class Backend, class F>
  static auto visit(std::string_view name, const options& o, F&& f) {
    using result = decltype(f(std::declval<typename first<Entries...>::template preset<Backend>>()));
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
  template <class First, class...>
  struct first {
    template <class B>
    using preset = typename First::template preset<B>;
  };

  template <class Entry, class Backend>
  static typename Entry::template preset<Backend> make(const options& o) {
    if constexpr (requires { Entry::template make<Backend>(o); })
      return Entry::template make<Backend>(o);
    else
      return typename Entry::template preset<Backend>{};
  }

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

/// f(preset) with the method called name on Backend (default backend::cpu).
template <class Backend = backend::cpu, class F>
auto visit(std::string_view name, const options& o, F&& f) {
  return all::visit<Backend>(name, o, std::forward<F>(f));
}

}  // namespace sidco::methods
