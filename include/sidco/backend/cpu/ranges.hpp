// Threads over contiguous ranges of a buffer (OpenMP), results combined in range order so
// that they depend on the thread count only, never on scheduling.
#pragma once

#include <algorithm>
#include <cstddef>
#include <span>
#include <vector>

#if defined(_OPENMP)
#include <omp.h>
#endif

#include "sidco/backend/cpu/tuning.hpp"
#include "sidco/core/segment.hpp"

namespace sidco::backend::cpu_detail {

class thread_ranges {
 public:
  /// threads: a fixed count, or 0 for OpenMP's default (OMP_NUM_THREADS or the core count).
  explicit thread_ranges(int threads = 0) : threads_(threads) {}

  int threads() const { return threads_; }

  /// How many ranges n values are split into.
  int count(std::size_t n) const {
    const std::size_t useful = std::max<std::size_t>(1, n / tuning::min_per_thread);
    return int(std::min<std::size_t>(std::size_t(available()), useful));
  }

  /// Range r of `ranges` over [0, n): contiguous, inner ends aligned.
  static std::size_t begin(std::size_t n, int ranges, int r) {
    if (r >= ranges) return n;
    const std::size_t step = (n / std::size_t(ranges)) & ~(tuning::range_alignment - 1);
    return std::min(n, std::size_t(r) * step);
  }

  /// f(r, lo, hi) for every range, one thread each.
  template <class F>
  void for_each(std::size_t n, F&& f) const {
    const int ranges = count(n);
    if (ranges == 1) {  // no OpenMP team: even a one-thread region ends in a futex wake
      f(0, std::size_t(0), n);
      return;
    }
#if defined(_OPENMP)
#pragma omp parallel for num_threads(ranges) schedule(static, 1)
#endif
    for (int r = 0; r < ranges; ++r) {
      const std::size_t lo = begin(n, ranges, r);
      const std::size_t hi = r + 1 == ranges ? n : begin(n, ranges, r + 1);
      f(r, lo, hi);
    }
  }

  /// How many threads the backend may use.
  int available() const {
#if defined(_OPENMP)
    return std::max(1, threads_ > 0 ? threads_ : omp_get_max_threads());
#else
    return 1;
#endif
  }

  /// f(thread, i) for every i in [0, n), the items shared out among the threads as they
  /// free up (their costs differ); thread is the caller's index in [0, available()). For
  /// items whose results do not depend on which thread runs them.
  template <class F>
  void for_each_item(std::size_t n, F&& f) const {
    const int threads = int(std::min<std::size_t>(std::size_t(available()), n));
    if (threads <= 1) {  // as for_each: no team for one thread
      for (std::size_t i = 0; i < n; ++i) f(0, i);
      return;
    }
#if defined(_OPENMP)
#pragma omp parallel num_threads(threads)
    {
      const int thread = omp_get_thread_num();
#pragma omp for schedule(dynamic, tuning::items_per_grab)
      for (std::size_t i = 0; i < n; ++i) f(thread, i);
    }
#endif
  }

  /// count(lo, hi) per range; offsets[r] is where range r's entries start, offsets[ranges]
  /// the total (returned).
  template <class Count>
  std::size_t count_each(std::size_t n, Count&& count, std::vector<std::size_t>& offsets) const {
    const std::size_t ranges = std::size_t(this->count(n));
    offsets.assign(ranges + 1, 0);
    for_each(n, [&](int r, std::size_t lo, std::size_t hi) { offsets[std::size_t(r) + 1] = count(lo, hi); });
    for (std::size_t r = 0; r < ranges; ++r) offsets[r + 1] += offsets[r];
    return offsets[ranges];
  }

 private:
  int threads_ = 0;
};

/// The segment of layout that holds position i (layout tiles [0, total), i < total).
inline std::size_t segment_at(std::span<const segment> layout, std::size_t i) {
  if (layout.size() == 1) return 0;
  const auto after = std::upper_bound(layout.begin(), layout.end(), i,
                                      [](std::size_t at, const segment& g) { return at < g.offset; });
  return std::size_t(after - layout.begin()) - 1;
}

/// f(s, lo', hi') for each piece of [lo, hi) that lies in one segment s, in order; stops
/// early and returns false when f returns false.
template <class F>
bool for_each_piece(std::span<const segment> layout, std::size_t lo, std::size_t hi, F&& f) {
  if (lo >= hi) return true;
  for (std::size_t s = segment_at(layout, lo); lo < hi; ++s) {
    const std::size_t end = std::min(hi, layout[s].end());
    if (!f(s, lo, end)) return false;
    lo = end;
  }
  return true;
}

}  // namespace sidco::backend::cpu_detail
