// Random-k's draw: a uniformly random k-subset of [0, n) from a SplitMix64 state, the same
// subset on every backend (backend::cuda makes the small-k procedure's draws on the device).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "sidco/core/splitmix.hpp"

namespace sidco {

/// Whether uniform_subset draws with repeats (k <= n / 32: draw the missing indices, sort,
/// drop repeats, until k remain) rather than by selection sampling.
constexpr bool subset_by_redraws(std::size_t n, std::size_t k) { return k <= n / 32; }

/// A uniformly random k-subset (k <= n) of [0, n), ascending, into chosen; the draws are
/// the words of a splitmix64 at state, in order.
/// By redraws: round r appends as many draws as are missing (from word d_r on, d_r = the
/// draws of the rounds before), sorts and drops repeats; uniform because the procedure
/// treats every index alike; O(k log k).
/// Otherwise (several sorts would be needed): Knuth's selection sampling (Algorithm S),
/// index i taken with probability (still needed) / (still left); one draw per index.
inline void uniform_subset(std::size_t n, std::size_t k, std::uint64_t state, std::vector<std::size_t>& chosen) {
  splitmix64 rng{state};
  chosen.clear();
  chosen.reserve(k);
  if (subset_by_redraws(n, k)) {
    while (chosen.size() < k) {
      for (std::size_t missing = k - chosen.size(); missing > 0; --missing) chosen.push_back(rng.below(n));
      std::sort(chosen.begin(), chosen.end());
      chosen.erase(std::unique(chosen.begin(), chosen.end()), chosen.end());
    }
    return;
  }
  for (std::size_t i = 0; i < n && chosen.size() < k; ++i)
    if (rng.below(n - i) < k - chosen.size()) chosen.push_back(i);
}

}  // namespace sidco
