// The CPU backend: threads (OpenMP) over contiguous ranges, and loops written so that the
// compiler vectorizes them (branch-free blocks, independent lane accumulators). Compile with
// -O3 -fopenmp, and -march=native for the widest vectors; without OpenMP it runs on one
// thread and gives the same results. Results are deterministic for a given thread count.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <type_traits>
#include <utility>
#include <vector>

#if defined(_OPENMP)
#include <omp.h>
#endif

#include "sidco/core/fast_log.hpp"
#include "sidco/core/magnitude_key.hpp"
#include "sidco/core/moments.hpp"
#include "sidco/backend/serial.hpp"
#include "sidco/backend/source.hpp"
#include "sidco/core/sparse_vector.hpp"

namespace sidco::backend {

class cpu {
 public:
  static constexpr const char* name = "cpu";
  /// Below this many values per thread, threads cost more than they save.
  static constexpr std::size_t min_per_thread = std::size_t(1) << 15;

  /// OpenMP's default thread count (OMP_NUM_THREADS or the core count).
  cpu() = default;
  /// A fixed thread count (0: OpenMP's default).
  explicit cpu(int threads) : threads_(threads) {}

  int threads() const { return threads_; }

  /// Moments of |x| over the whole source.
  template <bool Log, class Source>
  moments magnitudes(const Source& source) const {
    return reduce_ranges(source.size, [&](int, std::size_t lo, std::size_t hi) {
      return range_moments<Log>(source, lo, hi);
    });
  }

  /// Counts only (zeros and non-finite values).
  template <class Source>
  moments counts(const Source& source) const {
    return reduce_ranges(source.size, [&](int, std::size_t lo, std::size_t hi) {
      return serial::counts_in(source, lo, hi);
    });
  }

  /// Moments of |x| - t over |x| > t, and those |x| written to exceedances (replacing its
  /// contents), in index order. Compaction without branches (store always, advance when
  /// kept: a quarter of the values are kept here, which a branch would mispredict), then the
  /// vectorized moments kernel over what was kept.
  template <bool Log, class Source, class T>
  moments excess(const Source& source, double t, std::vector<T>& exceedances) const {
    const auto above = threshold_key<T>(t);
    const std::size_t total = count_ranges(source, [&](std::size_t i) {
      return exceeds(signed_key(source.value(i)), above);
    });
    if (total > exceedances.capacity())
      exceedances.reserve(std::max(total, 2 * exceedances.capacity()));
    exceedances.resize(total);
    T* out = exceedances.data();
    for_each_range(source.size, [&](int r, std::size_t lo, std::size_t hi) {
      // The store lands one past the last kept value, which is the next range's first
      // slot: stop once this range's count is written (nothing after it is kept).
      std::size_t at = offsets_[std::size_t(r)];
      const std::size_t end = offsets_[std::size_t(r) + 1];
      for (std::size_t i = lo; i < hi && at < end; ++i) {
        const T v = source.value(i);
        out[at] = std::fabs(v);
        at += exceeds(signed_key(v), above);
      }
    });
    // Every kept value is above t: count is total; an excess that rounds to 0 in T counts
    // as a zero and stays out of the fit's sample, as it should.
    return magnitudes<Log>(excess_source<T>{exceedances.data(), total, T(t)});
  }

  template <class Source>
  std::size_t count_above(const Source& source, double t) const {
    const auto above = threshold_key<value_t<Source>>(t);
    return count_ranges(source, [&](std::size_t i) { return exceeds(signed_key(source.value(i)), above); });
  }

  /// counts[d] += how many magnitude keys have (key >> shift) == d.
  template <class Source>
  void key_histogram(const Source& source, int shift, std::span<std::uint64_t> counts) const {
    const int ranges = range_count(source.size);
    histograms_.assign(std::size_t(ranges) * counts.size(), 0);
    for_each_range(source.size, [&](int r, std::size_t lo, std::size_t hi) {
      std::uint64_t* h = histograms_.data() + std::size_t(r) * counts.size();
      for (std::size_t i = lo; i < hi; ++i) ++h[magnitude_key(source.value(i)) >> shift];
    });
    for (int r = 0; r < ranges; ++r)
      for (std::size_t d = 0; d < counts.size(); ++d)
        counts[d] += histograms_[std::size_t(r) * counts.size() + d];
  }

  /// Index of the first NaN or Inf (the error path only: the serial scan is enough).
  template <class Source>
  std::size_t first_nonfinite(const Source& source) const {
    return serial{}.first_nonfinite(source);
  }

  /// Appends every (base + i, x_i) with |x_i| > t to out in index order, settling the
  /// source's state in the same pass (as sent where kept when Final, else all unsent).
  /// Two passes over each range: count, then write at the range's offset, so threads keep
  /// indices ascending without any temporary beyond one offset per thread.
  template <bool Final, class Source, class T, class Index>
  void select_above(const Source& source, double t, sparse_vector<T, Index>& out) const {
    const auto above = threshold_key<T>(t);
    const std::size_t total = count_ranges(source, [&](std::size_t i) {
      return exceeds(signed_key(source.value(i)), above);
    });
    // Plain pointers, not a structured binding: clang 14 cannot capture those in lambdas.
    const auto region = append(out, total);
    Index* const indices = region.first;
    T* const values = region.second;
    for_each_range(source.size, [&](int r, std::size_t lo, std::size_t hi) {
      std::size_t at = offsets_[std::size_t(r)];
      std::size_t i = lo;
      // 16-value blocks: settle every value without a branch (vectorizes), and look for
      // kept values only in blocks whose largest key is above t (a max reduction; a NaN
      // key only sends a block to the exact test).
      constexpr std::size_t block = 16;
      for (; i + block <= hi; i += block) {
        T v[block];
        auto largest = signed_key(source.value(i));
        for (std::size_t j = 0; j < block; ++j) {
          v[j] = source.value(i + j);
          const auto key = signed_key(v[j]);
          largest = key > largest ? key : largest;
        }
        if constexpr (Source::has_state)
          for (std::size_t j = 0; j < block; ++j)
            source.settle(i + j, v[j], Final & exceeds(signed_key(v[j]), above));
        if (!(largest > above)) continue;
        for (std::size_t j = 0; j < block; ++j)
          if (exceeds(signed_key(v[j]), above)) {
            indices[at] = Index(source.base + i + j);
            values[at] = v[j];
            ++at;
          }
      }
      for (; i < hi; ++i) {
        const T v = source.value(i);
        const bool keep = exceeds(signed_key(v), above);
        if (keep) {
          indices[at] = Index(source.base + i);
          values[at] = v;
          ++at;
        }
        if constexpr (Source::has_state) source.settle(i, v, Final && keep);
      }
    });
  }

  /// After select_above<false>: appends (base + i, v) for low < |v| <= high, v re-read from
  /// the settled state, in index order.
  template <class Source, class T, class Index>
  void select_band(const Source& source, double low, double high,
                   sparse_vector<T, Index>& out) const {
    const auto above = threshold_key<T>(low), upto = threshold_key<T>(high);
    auto in_band = [&](std::size_t i) {
      const auto key = signed_key(source.rescan_value(i));
      return exceeds(key, above) & (key <= upto);
    };
    const auto region = append(out, count_ranges(source, in_band));
    Index* const indices = region.first;
    T* const values = region.second;
    for_each_range(source.size, [&](int r, std::size_t lo, std::size_t hi) {
      std::size_t at = offsets_[std::size_t(r)];
      for (std::size_t i = lo; i < hi; ++i)
        if (in_band(i)) {
          indices[at] = Index(source.base + i);
          values[at] = source.rescan_value(i);
          ++at;
        }
    });
  }

  /// Appends the entries at the given ascending local indices and settles every entry.
  template <class Source, class T, class Index>
  void select_indices(const Source& source, std::span<const std::size_t> chosen,
                      sparse_vector<T, Index>& out) const {
    const auto region = append(out, chosen.size());
    Index* const indices = region.first;
    T* const values = region.second;
    for_each_range(source.size, [&](int, std::size_t lo, std::size_t hi) {
      std::size_t next = std::size_t(std::lower_bound(chosen.begin(), chosen.end(), lo) - chosen.begin());
      for (std::size_t i = lo; i < hi; ++i) {
        const T v = source.value(i);
        const bool keep = next < chosen.size() && chosen[next] == i;
        if (keep) {
          indices[next] = Index(source.base + i);
          values[next] = v;
          ++next;
        }
        if constexpr (Source::has_state) source.settle(i, v, keep);
      }
    });
  }

 private:
  // Grows out by count entries; returns where the new indices and values go.
  template <class T, class Index>
  static std::pair<Index*, T*> append(sparse_vector<T, Index>& out, std::size_t count) {
    const std::size_t start = out.size();
    out.resize(start + count);
    return {out.mutable_indices().data() + start, out.mutable_values().data() + start};
  }

  // |v| > t for the key of v and threshold_key(t); NaN (keys above infinity's) never is, as
  // in the serial oracle's double compare.
  template <class S>
  static bool exceeds(S key, S above) {
    constexpr S infinity = sizeof(S) == 4 ? S(0x7f800000) : S(0x7ff0000000000000ll);
    return (key > above) & (key <= infinity);
  }

  template <class Source>
  using value_t = std::remove_cvref_t<decltype(std::declval<const Source&>().value(0))>;

  // One pass over [lo, hi). Blocks of 1024 values are summed in T lanes, then added in
  // double. Every test is an integer compare on the magnitude bits: float compares may trap
  // on NaN, which stops the compiler from vectorizing them; for non-negative floats the
  // bits order like the values, so min and max are integer too.
  template <bool Log, class Source>
  static moments range_moments(const Source& source, std::size_t lo, std::size_t hi) {
    using T = value_t<Source>;
    using Key = magnitude_key_t<T>;
    constexpr std::size_t lanes = 64 / sizeof(T);
    constexpr std::size_t block = 1024;
    const Key infinity = magnitude_key(std::numeric_limits<T>::infinity());
    moments total;
    std::size_t i = lo;
    for (; i + block <= hi; i += block) {
      T sum[lanes] = {}, sum_sq[lanes] = {}, sum_log[lanes] = {};
      Key zeros[lanes] = {}, nonfinite[lanes] = {}, low[lanes], high[lanes] = {};
      std::fill(low, low + lanes, infinity);
      for (std::size_t b = 0; b < block; b += lanes) {
        for (std::size_t j = 0; j < lanes; ++j) {
          const Key key = magnitude_key(source.value(i + b + j));
          const Key finite = key < infinity;
          const Key positive = finite & (key != 0);
          // Masks, not ?: selects, which GCC takes for control flow and will not vectorize.
          const Key mask = Key(0) - positive;
          const Key kept = key & mask;
          const T x = magnitude_of_key<T>(kept);
          zeros[j] += finite & (key == 0);
          nonfinite[j] += Key(1) - finite;
          sum[j] += x;
          sum_sq[j] += x * x;
          if constexpr (Log)
            sum_log[j] += fast_log(magnitude_of_key<T>(kept | (~mask & magnitude_key(T(1)))));
          low[j] = std::min(low[j], kept | (~mask & infinity));
          high[j] = std::max(high[j], kept);
        }
      }
      moments m;
      m.count = block;
      for (std::size_t j = 0; j < lanes; ++j) {
        m.zeros += zeros[j];
        m.nonfinite += nonfinite[j];
        m.sum += double(sum[j]);
        m.sum_sq += double(sum_sq[j]);
        m.sum_log += double(sum_log[j]);
        if (low[j] != infinity) m.min = std::min(m.min, double(magnitude_of_key<T>(low[j])));
        m.max = std::max(m.max, double(magnitude_of_key<T>(high[j])));
      }
      total.merge(m);
    }
    for (; i < hi; ++i) {
      const T a = std::fabs(source.value(i));
      total.add<false>(double(a));
      if constexpr (Log)
        if (std::isfinite(a) && a > T(0)) total.sum_log += double(fast_log(a));
    }
    return total;
  }

  int range_count(std::size_t n) const {
#if defined(_OPENMP)
    const int available = threads_ > 0 ? threads_ : omp_get_max_threads();
#else
    const int available = 1;
#endif
    const std::size_t useful = std::max<std::size_t>(1, n / min_per_thread);
    return int(std::min<std::size_t>(std::size_t(std::max(available, 1)), useful));
  }

  // Range r of R over [0, n): contiguous, ends aligned to 64 values.
  static std::size_t range_begin(std::size_t n, int ranges, int r) {
    if (r >= ranges) return n;
    const std::size_t step = (n / std::size_t(ranges)) & ~std::size_t(63);
    return std::min(n, std::size_t(r) * step);
  }

  template <class F>
  void for_each_range(std::size_t n, F&& f) const {
    const int ranges = range_count(n);
#if defined(_OPENMP)
#pragma omp parallel for num_threads(ranges) schedule(static, 1) if (ranges > 1)
#endif
    for (int r = 0; r < ranges; ++r) {
      const std::size_t lo = range_begin(n, ranges, r);
      const std::size_t hi = r + 1 == ranges ? n : range_begin(n, ranges, r + 1);
      f(r, lo, hi);
    }
  }

  // Per-range results merged in range order: deterministic for a given thread count.
  template <class F>
  moments reduce_ranges(std::size_t n, F&& f) const {
    partials_.resize(std::size_t(range_count(n)));
    for_each_range(n, [&](int r, std::size_t lo, std::size_t hi) {
      partials_[std::size_t(r)] = f(r, lo, hi);
    });
    moments total;
    for (const auto& m : partials_) total.merge(m);
    return total;
  }

  // Counts per range; leaves each range's starting offset in offsets_ and returns the total.
  template <class Source, class Predicate>
  std::size_t count_ranges(const Source& source, Predicate&& keep) const {
    const std::size_t ranges = std::size_t(range_count(source.size));
    offsets_.assign(ranges + 1, 0);
    for_each_range(source.size, [&](int r, std::size_t lo, std::size_t hi) {
      std::size_t n = 0;
      for (std::size_t i = lo; i < hi; ++i) n += keep(i);
      offsets_[std::size_t(r) + 1] = n;
    });
    for (std::size_t r = 0; r < ranges; ++r) offsets_[r + 1] += offsets_[r];
    return offsets_[ranges];
  }

  int threads_ = 0;
  // Per-thread scratch, kept across calls: O(threads), never O(N).
  mutable std::vector<moments> partials_;
  mutable std::vector<std::size_t> offsets_;
  mutable std::vector<std::uint64_t> histograms_;
};

}  // namespace sidco::backend
