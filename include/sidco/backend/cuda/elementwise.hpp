// What backend::cuda's kernels compute per element, as host-and-device functions, so that
// the host tests check them against the serial oracle on machines without a GPU: the
// moments and tail accumulation of one thread, the selection and band predicates, and the
// radix digit of the Top-k select. No CUDA header is needed here.
#pragma once

#include <cstddef>
#include <cstdint>

#include "sidco/core/config.hpp"
#include "sidco/core/fast_log.hpp"
#include "sidco/core/float_traits.hpp"
#include "sidco/core/magnitude_key.hpp"
#include "sidco/core/moments.hpp"

namespace sidco::backend::cuda_detail {

/// A probe threshold t >= 0 as the kernels use it: |x| > t exactly when the signed key of
/// x exceeds key; excesses are |x| - value, in the accumulator type.
template <class T>
struct device_probe {
  signed_key_t<T> key;
  typename float_traits<T>::accumulator value;
};

/// One thread's statistics over the values it reads: counts, sums of |x|, |x|^2 (and ln|x|)
/// in double whatever T (as the serial oracle: float squares underflow below ~1e-22 and
/// overflow above ~1.8e19, and gradients that small are real), the smallest and largest
/// keys, and per probe the count above it and the excesses' sums. Each element's magnitude,
/// excess and logarithm are computed in T's accumulator type (float for float and 16-bit).
template <class T, std::size_t Probes>
struct thread_statistics {
  using A = typename float_traits<T>::accumulator;
  using Key = magnitude_key_t<T>;
  struct tail_sums {
    double sum = 0, sum_sq = 0, sum_log = 0;
    std::uint64_t count = 0;
  };
  double sum = 0, sum_sq = 0, sum_log = 0;
  std::uint64_t count = 0, zeros = 0, nonfinite = 0;
  Key low = Key(float_traits<T>::infinity), high = 0;
  tail_sums tails[Probes == 0 ? 1 : Probes];

  template <bool Log, bool TailLog>
  SIDCO_HOST_DEVICE void add(T v, const device_probe<T>* probes) {
    ++count;
    const Key key = magnitude_key(v);
    if (key >= Key(float_traits<T>::infinity)) {
      ++nonfinite;
      return;
    }
    if (key == 0) {
      ++zeros;
      return;
    }
    const A a = to_accumulator(magnitude_of_key<T>(key));
    const double wide = double(a);
    sum += wide;
    sum_sq += wide * wide;
    if constexpr (Log) sum_log += double(fast_log(a));
    low = key < low ? key : low;
    high = key > high ? key : high;
    if constexpr (Probes > 0) {
      for (std::size_t p = 0; p < Probes; ++p) {
        if (!(signed_key_t<T>(key) > probes[p].key)) continue;
        const A excess = a - probes[p].value;
        const double wide_excess = double(excess);
        tail_sums& t = tails[p];
        ++t.count;
        t.sum += wide_excess;
        t.sum_sq += wide_excess * wide_excess;
        if constexpr (TailLog) t.sum_log += double(fast_log(excess));
      }
    }
  }

  /// The thread's moments of |x| (out[0]) and tails (out[1 + p]), in double.
  SIDCO_HOST_DEVICE void to_moments(moments* out) const {
    moments m;
    m.count = count;
    m.zeros = zeros;
    m.nonfinite = nonfinite;
    m.sum = sum;
    m.sum_sq = sum_sq;
    m.sum_log = sum_log;
    if (high != 0) {
      m.min = double(to_accumulator(magnitude_of_key<T>(low)));
      m.max = double(to_accumulator(magnitude_of_key<T>(high)));
    }
    out[0] = m;
    if constexpr (Probes > 0) {
      for (std::size_t p = 0; p < Probes; ++p) {
        moments t;
        t.count = tails[p].count;
        t.sum = tails[p].sum;
        t.sum_sq = tails[p].sum_sq;
        t.sum_log = tails[p].sum_log;
        out[1 + p] = t;
      }
    }
  }
};

/// The moments of Probes + 1 kinds a block reduces together, merged field by field.
template <std::size_t Width>
struct moments_bundle {
  moments m[Width];
  SIDCO_HOST_DEVICE moments_bundle merged(const moments_bundle& other) const {
    moments_bundle out = *this;
    for (std::size_t w = 0; w < Width; ++w) out.m[w].merge(other.m[w]);
    return out;
  }
};

struct merge_bundles {
  template <class B>
  SIDCO_HOST_DEVICE B operator()(const B& a, const B& b) const {
    return a.merged(b);
  }
};

/// |x| > t for above = the threshold's key.
template <class T>
struct above_key {
  signed_key_t<T> above;
  SIDCO_HOST_DEVICE bool operator()(T v) const { return exceeds<T>(signed_key(v), above); }
};

/// low < |x| <= high, keys of low and high.
template <class T>
struct in_band {
  signed_key_t<T> above, upto;
  SIDCO_HOST_DEVICE bool operator()(T v) const {
    const auto key = signed_key(v);
    return exceeds<T>(key, above) & (key <= upto);
  }
};

}  // namespace sidco::backend::cuda_detail
