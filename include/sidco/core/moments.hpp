// Moments of magnitudes gathered in one streaming pass; mergeable across threads and blocks.
#pragma once

#include <cmath>
#include <cstdint>

#include "sidco/core/config.hpp"

namespace sidco {

/// Streaming statistics of magnitudes a = |x| (or of excesses a - t over a threshold).
/// Exact zeros and non-finite values are counted but kept out of the sums, so a fit can use
/// the non-zeros alone. Sums are in double whatever the element type.
struct moments {
  std::uint64_t count = 0;      // every value seen
  std::uint64_t zeros = 0;      // exact zeros (dead ReLUs, unused embedding rows)
  std::uint64_t nonfinite = 0;  // NaN or +-Inf
  double sum = 0;               // sum of a over finite non-zeros
  double sum_sq = 0;            // sum of a^2
  double sum_log = 0;           // sum of ln a (only when gathered with log)
  double min = __builtin_huge_val();  // smallest finite non-zero a
  double max = 0;                     // largest finite a

  /// Adds one magnitude (a >= 0 or non-finite). Log = also gather ln a.
  template <bool Log = true>
  SIDCO_HOST_DEVICE void add(double a) {
    ++count;
    if (!(a < __builtin_huge_val())) {  // NaN compares false too
      ++nonfinite;
      return;
    }
    if (a == 0) {
      ++zeros;
      return;
    }
    sum += a;
    sum_sq += a * a;
    if constexpr (Log) sum_log += std::log(a);
    min = a < min ? a : min;
    max = a > max ? a : max;
  }

  SIDCO_HOST_DEVICE void merge(const moments& other) {
    count += other.count;
    zeros += other.zeros;
    nonfinite += other.nonfinite;
    sum += other.sum;
    sum_sq += other.sum_sq;
    sum_log += other.sum_log;
    min = other.min < min ? other.min : min;
    max = other.max > max ? other.max : max;
  }

  /// Finite non-zero values: the sample every zero-aware fit uses.
  SIDCO_HOST_DEVICE std::uint64_t nonzero() const { return count - zeros - nonfinite; }

  SIDCO_HOST_DEVICE double mean() const { return nonzero() ? sum / double(nonzero()) : 0.0; }
  SIDCO_HOST_DEVICE double mean_log() const {
    return nonzero() ? sum_log / double(nonzero()) : 0.0;
  }
  /// Population variance of the non-zeros, clamped at 0 against cancellation.
  SIDCO_HOST_DEVICE double variance() const {
    if (nonzero() == 0) return 0.0;
    const double m = mean();
    const double v = sum_sq / double(nonzero()) - m * m;
    return v > 0 ? v : 0.0;
  }

  /// The same statistics with the exact zeros counted as part of the sample (the original
  /// SIDCo fit, which does not separate them). ln 0 has no value, so mean_log() stays the
  /// mean over the non-zeros.
  SIDCO_HOST_DEVICE moments with_zeros_as_sample() const {
    moments m = *this;
    if (m.zeros == 0) return m;
    const std::uint64_t logged = nonzero();
    m.min = 0;
    m.zeros = 0;
    m.sum_log = logged ? sum_log * (double(m.nonzero()) / double(logged)) : 0.0;
    return m;
  }
};

}  // namespace sidco
