// The serial CPU backend: plain loops, one element at a time. It is the oracle that every
// faster backend is tested against, so it stays simple.
#pragma once

#include <cmath>
#include <cstddef>
#include <limits>

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

  /// Moments of |x| - t over the values with |x| > t (peaks over threshold).
  template <bool Log, class Source>
  moments excess(const Source& source, double t) const {
    moments m;
    for (std::size_t i = 0; i < source.size; ++i) {
      const double a = std::fabs(double(source.value(i)));
      if (a > t) m.template add<Log>(a - t);
    }
    return m;
  }

  template <class Source>
  std::size_t count_above(const Source& source, double t) const {
    std::size_t n = 0;
    for (std::size_t i = 0; i < source.size; ++i) n += std::fabs(double(source.value(i))) > t;
    return n;
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
