// How backend::cuda's keep_top_k sees runs of entries (one run per layer): each run's range,
// where its kept entries go, which run holds an entry, and where a kept entry lands. Host
// and device code; no CUDA header, so the host tests check it against the oracle.
#pragma once

#include <algorithm>
#include <cstddef>
#include <span>

#include "sidco/core/config.hpp"
#include "sidco/core/radix_select.hpp"

namespace sidco::backend::cuda_detail {

/// One run: its entries [begin, end) (from the call's begin), where its kept entries go,
/// and how many it keeps (keep < end - begin: it is trimmed, else kept whole).
struct run_plan {
  std::size_t begin = 0, end = 0, out = 0, keep = 0;
  SIDCO_HOST_DEVICE bool trims() const { return keep < end - begin; }
};

/// What plan_runs found: the entries the runs hold, how many they keep, whether any trims.
struct run_totals {
  std::size_t entries = 0, kept = 0;
  bool trims = false;
};

/// plans[s] for runs of run_sizes[s] entries keeping keep[s] of them.
inline run_totals plan_runs(std::span<const std::size_t> run_sizes, std::span<const std::size_t> keep,
                            run_plan* plans) {
  run_totals totals;
  for (std::size_t s = 0; s < run_sizes.size(); ++s) {
    plans[s] = {totals.entries, totals.entries + run_sizes[s], totals.kept, std::min(keep[s], run_sizes[s])};
    totals.trims = totals.trims || plans[s].trims();
    totals.entries += run_sizes[s];
    totals.kept += plans[s].keep;
  }
  return totals;
}

/// The run holding entry j (runs may be empty: the last whose begin is at or before j).
SIDCO_HOST_DEVICE inline std::size_t run_of(const run_plan* plans, std::size_t runs, std::size_t j) {
  std::size_t low = 0, high = runs - 1;
  while (low < high) {
    const std::size_t mid = (low + high + 1) / 2;
    if (plans[mid].begin <= j)
      low = mid;
    else
      high = mid - 1;
  }
  return low;
}

/// Per entry, in the scan's order: the keys above its run's k-th largest and the ties with it.
struct top_k_tally {
  unsigned long long above = 0, ties = 0;
};

struct add_tallies {
  SIDCO_HOST_DEVICE top_k_tally operator()(const top_k_tally& a, const top_k_tally& b) const {
    return {a.above + b.above, a.ties + b.ties};
  }
};

/// An entry's tally: every entry of a run kept whole counts as above; else by its rank
/// against the run's finished walk.
template <class Key>
SIDCO_HOST_DEVICE top_k_tally tally(const run_plan& plan, const radix_select<Key>& walk, Key key) {
  if (!plan.trims()) return {1ull, 0ull};
  const int r = walk.rank(key);
  return {r > 0 ? 1ull : 0ull, r == 0 ? 1ull : 0ull};
}

/// Where entry j of its run lands in the output, or npos when it is not kept: after the
/// keys above the run's k-th before it and at most walk.needed ties before it (ties go to the
/// lower index). before: the exclusive scan of the tallies at j; start: at the run's begin.
inline constexpr std::size_t not_kept = ~std::size_t(0);
template <class Key>
SIDCO_HOST_DEVICE std::size_t kept_at(const run_plan& plan, const radix_select<Key>& walk, Key key, std::size_t j,
                                      const top_k_tally& before, const top_k_tally& start) {
  if (!plan.trims()) return plan.out + (j - plan.begin);
  const int r = walk.rank(key);
  if (r < 0) return not_kept;
  const unsigned long long needed = walk.needed, ties = before.ties - start.ties;
  if (r == 0 && ties >= needed) return not_kept;
  return plan.out + std::size_t(before.above - start.above + (ties < needed ? ties : needed));
}

}  // namespace sidco::backend::cuda_detail
