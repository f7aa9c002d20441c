// Random-k: k indices drawn uniformly without replacement.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "sidco/backend/concept.hpp"
#include "sidco/core/state_io.hpp"
#include "sidco/select/result.hpp"

namespace sidco::select {

namespace detail {

// SplitMix64: tiny, fast, and the same stream on every platform and compiler, which the
// shared-seed convention needs (std:: distributions are implementation-defined).
struct splitmix64 {
  std::uint64_t state;
  std::uint64_t operator()() {
    std::uint64_t z = (state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  // Uniform in [0, n) by multiply-shift; the bias, below n / 2^64, is far below any test.
  std::size_t below(std::size_t n) {
    __extension__ using wide = unsigned __int128;
    return std::size_t((wide((*this)()) * n) >> 64);
  }
};

/// A uniformly random k-subset of [0, n), ascending, into chosen.
/// Small k: draw k indices, sort, drop repeats, draw the missing ones, until k distinct
/// remain (uniform because the procedure treats every index alike; O(k log k)).
/// Large k, where repeats would cost several sorts: Knuth's selection sampling (Algorithm S),
/// index i taken with probability (still needed) / (still left); one draw per index.
inline void uniform_subset(std::size_t n, std::size_t k, splitmix64& rng,
                           std::vector<std::size_t>& chosen) {
  chosen.clear();
  chosen.reserve(k);
  if (k <= n / 32) {
    while (chosen.size() < k) {
      for (std::size_t missing = k - chosen.size(); missing > 0; --missing)
        chosen.push_back(rng.below(n));
      std::sort(chosen.begin(), chosen.end());
      chosen.erase(std::unique(chosen.begin(), chosen.end()), chosen.end());
    }
    return;
  }
  for (std::size_t i = 0; i < n && chosen.size() < k; ++i)
    if (rng.below(n - i) < k - chosen.size()) chosen.push_back(i);
}

}  // namespace detail

/// Every worker that uses the same seed and calls in step draws the same indices (GRACE's
/// convention), so the selections can also be summed densely. Each call draws anew; the
/// stream depends on the seed, the call number and the segment's offset only.
class random_k {
 public:
  static constexpr const char* name = "random_k";
  static constexpr bool needs_threshold = false;
  static constexpr bool fuses_layers = false;

  explicit random_k(std::uint64_t seed = 0x51dc0) : seed_(seed) {}

  double estimation_density(double delta) const { return delta; }

  template <backend::backend Backend, class Source, class Out>
  selection_result select(Backend& backend, const Source& source, double, std::size_t k, Out& out) {
    detail::splitmix64 rng{seed_ ^ (calls_++ * 0xd1b54a32d192ed03ull) ^
                           (std::uint64_t(source.base) * 0x8cb92ba72f3d8dd7ull)};
    detail::uniform_subset(source.size, std::min(k, source.size), rng, chosen_);
    const std::size_t begin = out.size();
    backend.select_indices(source, std::span<const std::size_t>(chosen_), out);
    return {out.size() - begin, 0};
  }

  std::uint64_t seed() const { return seed_; }
  std::uint64_t calls() const { return calls_; }

  /// The call count; the seed is saved to refuse a state drawn from another seed.
  void save_state(state_writer& out) const {
    out.name(name);
    out.word(seed_);
    out.word(calls_);
  }
  void load_state(state_reader& in) {
    in.expect(name);
    const std::uint64_t seed = in.word("random_k: seed");
    if (seed != seed_) sidco::detail::fail("state: random_k: drawn with seed ", seed, ", this selection has seed ", seed_);
    calls_ = in.word("random_k: calls");
  }

 private:
  std::uint64_t seed_;
  std::uint64_t calls_ = 0;
  std::vector<std::size_t> chosen_;
};

}  // namespace sidco::select
