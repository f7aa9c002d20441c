// Per-lane partial statistics of one block, filled by the SIMD loops (Highway's or the
// portable ones) and gathered into moments in double, lane by lane, in the same order.
#pragma once

#include <algorithm>
#include <cstddef>
#include <limits>
#include <type_traits>

#include "sidco/core/float_traits.hpp"
#include "sidco/core/half.hpp"
#include "sidco/core/magnitude_key.hpp"
#include "sidco/core/moments.hpp"

namespace sidco::backend::cpu_detail {

/// The type the lanes hold T's values in: T's accumulator (float for the 16-bit types,
/// whose values it holds exactly; T itself for float and double). Keys and compares run on
/// its bits, so 16-bit values take float's lanes and conversions once per value.
template <class T>
using lane_t = typename float_traits<T>::accumulator;

/// The host's 16-bit types: the ones whose lanes are wider than their values.
template <class T>
inline constexpr bool is_16_bit = std::is_same_v<T, float16> || std::is_same_v<T, bfloat16>;

/// A probe threshold t >= 0 as the kernels compare and subtract it, in T's lane type: |x| >
/// t exactly when signed_key(lane value of x) > key; excesses are |x| - value (value: the
/// largest T not above t).
template <class T>
struct probe_at {
  signed_key_t<lane_t<T>> key;
  lane_t<T> value;
};

/// threshold_key<T>(t) as a key of T's lane type: the same values exceed it.
template <class T>
signed_key_t<lane_t<T>> lane_key(signed_key_t<T> above) {
  if constexpr (is_16_bit<T>) {
    if (above < 0) return -1;  // every value (t < 0)
    return signed_key(to_accumulator(magnitude_of_key<T>(magnitude_key_t<T>(above))));
  } else {
    return above;
  }
}

template <class T>
probe_at<T> make_probe(double t) {
  const auto key = lane_key<T>(threshold_key<T>(t < 0 ? 0.0 : t));
  return {key, magnitude_of_key<lane_t<T>>(magnitude_key_t<lane_t<T>>(key))};
}

/// Lanes of one block: moments of |x| (counts, smallest and largest keys of the lane type;
/// sums of |x| and |x|^2 in Sum; sums of ln|x|, which lie within +-745, in the lane type)
/// and, for each of Probes thresholds, the count above it and the excesses' sums alike. Sum
/// is the lane type, or double for a block whose magnitudes leave float's safe range (see
/// fits_sum).
template <class T, std::size_t Probes, class Sum = lane_t<T>>
struct lane_statistics {
  using Lane = lane_t<T>;
  using Key = magnitude_key_t<Lane>;
  using Log = Lane;
  using sum_type = Sum;
  static constexpr std::size_t max_lanes = 64 / sizeof(Lane);
  struct tail_lanes {
    alignas(64) Sum sum[max_lanes];
    alignas(64) Sum sum_sq[max_lanes];
    alignas(64) Log sum_log[max_lanes];
    alignas(64) Key count[max_lanes];
  };
  alignas(64) Sum sum[max_lanes];
  alignas(64) Sum sum_sq[max_lanes];
  alignas(64) Log sum_log[max_lanes];
  alignas(64) Key zeros[max_lanes];
  alignas(64) Key nonfinite[max_lanes];
  alignas(64) Key low[max_lanes];
  alignas(64) Key high[max_lanes];
  tail_lanes tails[Probes == 0 ? 1 : Probes];
  std::size_t lanes = max_lanes;

  /// Whether the block's sums in Sum are as good as double's: in float, a block's largest
  /// magnitude must lie in [2^-40, 2^59] (or be 0), so that its 1024 squares cannot
  /// overflow and the squares that underflow are below 2^-36 of the largest. Tail excesses
  /// are at most the largest magnitude, and at least its float spacing.
  bool fits_sum() const {
    if constexpr (sizeof(Sum) >= 8) {
      return true;
    } else {
      Key largest = 0;
      for (std::size_t j = 0; j < lanes; ++j) largest = high[j] > largest ? high[j] : largest;
      const float a = float(magnitude_of_key<Lane>(largest));
      return a == 0.0f || (a >= 0x1p-40f && a <= 0x1p59f);
    }
  }

  /// Merges the block's lanes (block values in all) into out[0] and the tails into
  /// out[1 + j], in double.
  void gather_into(std::size_t block, moments* out) const {
    const Key infinity = float_traits<Lane>::infinity;
    moments m;
    m.count = block;
    for (std::size_t j = 0; j < lanes; ++j) {
      m.zeros += zeros[j];
      m.nonfinite += nonfinite[j];
      m.sum += double(sum[j]);
      m.sum_sq += double(sum_sq[j]);
      m.sum_log += double(sum_log[j]);
      if (low[j] != infinity) m.min = std::min(m.min, double(magnitude_of_key<Lane>(low[j])));
      m.max = std::max(m.max, double(magnitude_of_key<Lane>(high[j])));
    }
    out[0].merge(m);
    for (std::size_t p = 0; p != Probes; ++p) {  // !=: Probes may be 0 (nvcc: "p < 0" is pointless)
      moments t;
      for (std::size_t j = 0; j < lanes; ++j) {
        t.count += tails[p].count[j];
        t.sum += double(tails[p].sum[j]);
        t.sum_sq += double(tails[p].sum_sq[j]);
        t.sum_log += double(tails[p].sum_log[j]);
      }
      out[1 + p].merge(t);
    }
  }
};

}  // namespace sidco::backend::cpu_detail
