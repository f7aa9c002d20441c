// The serial CPU backend: plain loops, one element at a time. It is the oracle that every
// faster backend is tested against, so it stays simple.
#pragma once

#include <cmath>
#include <cstddef>
#include <vector>

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

  /// Moments of |x| - t over the values with |x| > t (peaks over threshold); appends those
  /// |x| to exceedances so that later stages need not read the whole source again.
  template <bool Log, class Source, class T>
  moments excess(const Source& source, double t, std::vector<T>& exceedances) const {
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

  /// Index of the first NaN or Inf, or size when there is none.
  template <class Source>
  std::size_t first_nonfinite(const Source& source) const {
    for (std::size_t i = 0; i < source.size; ++i)
      if (!std::isfinite(source.value(i))) return i;
    return source.size;
  }

  /// Appends every (i, x_i) with |x_i| > t to out, in index order; settles the residual in
  /// the same pass when the source has one.
  template <class Source, class T, class Index>
  void select_above(const Source& source, double t, sparse_vector<T, Index>& out) const {
    for (std::size_t i = 0; i < source.size; ++i) {
      const T v = source.value(i);
      const bool keep = std::fabs(double(v)) > t;
      if (keep) out.push_back(Index(i), v);
      if constexpr (Source::has_residual) source.settle(i, v, keep);
    }
  }
};

}  // namespace sidco::backend
