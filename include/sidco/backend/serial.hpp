// The serial CPU backend: plain loops, one element at a time. It is the oracle that every
// faster backend is tested against, so it stays simple.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <vector>

#include "sidco/core/magnitude_key.hpp"
#include "sidco/core/moments.hpp"
#include "sidco/core/sparse_vector.hpp"

namespace sidco::backend {

struct serial {
  static constexpr const char* name = "serial";

  /// Moments of |x| over the whole source.
  template <bool Log, class Source>
  moments magnitudes(const Source& source) const {
    moments m;
    for (std::size_t i = 0; i < source.size; ++i)
      m.template add<Log>(std::fabs(double(source.value(i))));
    return m;
  }

  /// magnitudes, and the |x| > t written to exceedances as excess writes them (none, and kept
  /// false, when there are more than limit).
  template <bool Log, class Source, class T>
  moments magnitudes_above(const Source& source, double t, std::vector<T>& exceedances,
                           std::size_t, std::size_t limit, bool& kept) const {
    excess<false>(source, t, exceedances);
    kept = exceedances.size() <= limit;
    if (!kept) exceedances.clear();
    return magnitudes<Log>(source);
  }

  /// Counts only (zeros and non-finite values), for methods that fit nothing. Integer
  /// compares on the magnitude bits, without branches, so the compiler can vectorize it.
  template <class Source>
  moments counts(const Source& source) const {
    return counts_in(source, 0, source.size);
  }

  /// The same over [lo, hi): the per-range kernel backend::cpu runs on each thread.
  template <class Source>
  static moments counts_in(const Source& source, std::size_t lo, std::size_t hi) {
    using T = decltype(source.value(0));
    using Key = magnitude_key_t<T>;
    const Key infinity = magnitude_key(std::numeric_limits<T>::infinity());
    std::uint64_t zeros = 0, nonfinite = 0;
    for (std::size_t i = lo; i < hi; ++i) {
      const Key key = magnitude_key(source.value(i));
      zeros += key == 0;
      nonfinite += key >= infinity;
    }
    moments m;
    m.count = hi - lo;
    m.zeros = zeros;
    m.nonfinite = nonfinite;
    return m;
  }

  /// Moments of |x| - t over the values with |x| > t (peaks over threshold); appends those
  /// |x| to exceedances so that later stages need not read the whole source again.
  template <bool Log, class Source, class T>
  moments excess(const Source& source, double t, std::vector<T>& exceedances,
                 std::size_t = 0) const {
    moments m;
    for (std::size_t i = 0; i < source.size; ++i) {
      const T v = std::fabs(source.value(i));
      if (double(v) > t) {
        m.template add<Log>(double(v) - t);
        exceedances.push_back(v);
      }
    }
    return m;
  }

  template <class Source>
  std::size_t count_above(const Source& source, double t) const {
    std::size_t n = 0;
    for (std::size_t i = 0; i < source.size; ++i) n += std::fabs(double(source.value(i))) > t;
    return n;
  }

  /// counts[d] += how many magnitude keys have (key >> shift) == d.
  template <class Source>
  void key_histogram(const Source& source, int shift, std::span<std::uint64_t> counts) const {
    for (std::size_t i = 0; i < source.size; ++i) ++counts[magnitude_key(source.value(i)) >> shift];
  }

  /// Index of the first NaN or Inf, or size when there is none.
  template <class Source>
  std::size_t first_nonfinite(const Source& source) const {
    for (std::size_t i = 0; i < source.size; ++i)
      if (!std::isfinite(source.value(i))) return i;
    return source.size;
  }

  /// Appends every (base + i, x_i) with |x_i| > t to out, in index order, and settles the
  /// source's state in the same pass: as sent where kept when Final, else all as unsent
  /// (the selection decides later and calls mark_sent).
  template <bool Final, class Source, class T, class Index>
  void select_above(const Source& source, double t, sparse_vector<T, Index>& out,
                    std::size_t expected = 0) const {
    out.reserve(out.size() + expected);
    for (std::size_t i = 0; i < source.size; ++i) {
      const T v = source.value(i);
      const bool keep = std::fabs(double(v)) > t;
      if (keep) out.push_back(Index(source.base + i), v);
      if constexpr (Source::has_state) source.settle(i, v, Final && keep);
    }
  }

  /// After select_above<false>: appends (base + i, v) for low < |v| <= high, v re-read from
  /// the settled state, in index order.
  template <class Source, class T, class Index>
  void select_band(const Source& source, double low, double high,
                   sparse_vector<T, Index>& out) const {
    for (std::size_t i = 0; i < source.size; ++i) {
      const T v = source.rescan_value(i);
      const double a = std::fabs(double(v));
      if (a > low && a <= high) out.push_back(Index(source.base + i), v);
    }
  }

  /// Appends the entries at the given ascending local indices and settles every entry.
  template <class Source, class T, class Index>
  void select_indices(const Source& source, std::span<const std::size_t> chosen,
                      sparse_vector<T, Index>& out) const {
    std::size_t next = 0;
    for (std::size_t i = 0; i < source.size; ++i) {
      const T v = source.value(i);
      const bool keep = next < chosen.size() && chosen[next] == i;
      next += keep;
      if (keep) out.push_back(Index(source.base + i), v);
      if constexpr (Source::has_state) source.settle(i, v, keep);
    }
  }
};

}  // namespace sidco::backend
