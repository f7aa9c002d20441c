// The moments pass over one piece of a source: moments of |x| and the tails above a few
// probe thresholds, in blocks summed in lanes (Highway's or portable loops), then added in
// double. Float lanes are exact enough for a block whose magnitudes stay in float's safe
// range; a block that leaves it (squares that would overflow, or all underflow) is summed
// again in double lanes, so every finite scale matches the double oracle. Every test is an integer compare on the magnitude bits: float compares may
// trap on NaN, which stops the compiler from vectorizing them; for non-negative floats the
// bits order like the values, so min and max are integer too.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>

#include "sidco/backend/cpu/highway.hpp"
#include "sidco/backend/cpu/lanes.hpp"
#include "sidco/backend/cpu/tuning.hpp"
#include "sidco/core/fast_log.hpp"
#include "sidco/core/magnitude_key.hpp"
#include "sidco/core/moments.hpp"

namespace sidco::backend::cpu_detail {

// The portable block loop: 64 bytes of lanes, masks rather than ?: selects (which GCC
// takes for control flow and will not vectorize).
template <bool Log, bool TailLog, std::size_t Probes, class Source, class Sum, class T = typename Source::value_type>
void portable_block(const Source& source, std::size_t i, std::size_t block, const probe_at<T>* probes,
                    lane_statistics<T, Probes, Sum>& out) {
  using A = lane_t<T>;
  using Key = magnitude_key_t<A>;
  using S = signed_key_t<A>;
  constexpr std::size_t lanes = lane_statistics<T, Probes, Sum>::max_lanes;
  const Key infinity = float_traits<A>::infinity;
  std::fill(std::begin(out.sum), std::end(out.sum), Sum(0));
  std::fill(std::begin(out.sum_sq), std::end(out.sum_sq), Sum(0));
  std::fill(std::begin(out.sum_log), std::end(out.sum_log), A(0));
  std::fill(std::begin(out.zeros), std::end(out.zeros), Key(0));
  std::fill(std::begin(out.nonfinite), std::end(out.nonfinite), Key(0));
  std::fill(std::begin(out.low), std::end(out.low), infinity);
  std::fill(std::begin(out.high), std::end(out.high), Key(0));
  for (std::size_t p = 0; p != Probes; ++p) {  // !=: Probes may be 0 (nvcc: "p < 0" is pointless)
    auto& t = out.tails[p];
    std::fill(std::begin(t.sum), std::end(t.sum), Sum(0));
    std::fill(std::begin(t.sum_sq), std::end(t.sum_sq), Sum(0));
    std::fill(std::begin(t.sum_log), std::end(t.sum_log), A(0));
    std::fill(std::begin(t.count), std::end(t.count), Key(0));
  }
  out.lanes = lanes;
  for (std::size_t b = 0; b < block; b += lanes) {
    // Each lane is its own: GCC vectorizes it at -O2 too, where its cost model would not
    // (clang warns where it cannot honour the pragma, and vectorizes by its own model).
#if defined(_OPENMP) && defined(__GNUC__) && !defined(__clang__)
#pragma omp simd
#endif
    for (std::size_t j = 0; j < lanes; ++j) {
      const Key key = magnitude_key(to_accumulator(source.value(i + b + j)));
      const Key finite = key < infinity;
      const Key positive = finite & (key != 0);
      const Key mask = Key(0) - positive;
      const Key kept = key & mask;
      const A x = magnitude_of_key<A>(kept);
      out.zeros[j] += finite & (key == 0);
      out.nonfinite[j] += Key(1) - finite;
      out.sum[j] += Sum(x);
      out.sum_sq[j] += Sum(x) * Sum(x);
      if constexpr (Log) out.sum_log[j] += fast_log(magnitude_of_key<A>(Key(kept | (~mask & magnitude_key(A(1))))));
      out.low[j] = std::min(out.low[j], Key(kept | (~mask & infinity)));
      out.high[j] = std::max(out.high[j], kept);
      for (std::size_t p = 0; p != Probes; ++p) {  // !=: Probes may be 0 (nvcc: "p < 0" is pointless)
        const Key above = Key(S(kept) > probes[p].key);
        const Key above_mask = Key(0) - above;
        // The excess where above, else +0: bits masked, never multiplied (x - value may be
        // any value where not above).
        const A excess = magnitude_of_key<A>(Key(detail::bit_cast<Key>(A(x - probes[p].value)) & above_mask));
        auto& t = out.tails[p];
        t.count[j] += above;
        t.sum[j] += Sum(excess);
        t.sum_sq[j] += Sum(excess) * Sum(excess);
        if constexpr (TailLog)
          t.sum_log[j] += fast_log(magnitude_of_key<A>(Key((magnitude_key(excess) & above_mask) |
                                                           (~above_mask & magnitude_key(A(1))))));
      }
    }
  }
}

// Adds |x| over [lo, hi) value by value, with the tails (arithmetic in the lane type, as the
// lanes do it).
template <bool Log, bool TailLog, std::size_t Probes, class Source, class T = typename Source::value_type>
void add_values(const Source& source, std::size_t lo, std::size_t hi, const probe_at<T>* probes, moments* out) {
  using A = lane_t<T>;
  for (std::size_t i = lo; i < hi; ++i) {
    const A v = to_accumulator(source.value(i));
    const A a = magnitude_of_key<A>(magnitude_key(v));
    out[0].add<false>(double(a));
    const bool positive = magnitude_key(v) < float_traits<A>::infinity && magnitude_key(v) != 0;
    if constexpr (Log)
      if (positive) out[0].sum_log += double(fast_log(a));
    for (std::size_t p = 0; p != Probes; ++p) {  // !=: Probes may be 0 (nvcc: "p < 0" is pointless)
      if (!positive || !(signed_key(v) > probes[p].key)) continue;
      const A excess = a - probes[p].value;
      moments& t = out[1 + p];
      ++t.count;
      t.sum += double(excess);
      t.sum_sq += double(excess) * double(excess);
      if constexpr (TailLog) t.sum_log += double(fast_log(excess));
    }
  }
}

/// Moments of |x| over [lo, hi) into out[0], the tails above probes[p] into out[1 + p]
/// (merged into what out holds): whole blocks, then whole vectors, then values. A block
/// whose lanes do not fit their sum type is summed again in double lanes.
template <bool Log, bool TailLog, std::size_t Probes, class Source, class T = typename Source::value_type>
void piece_statistics(const Source& source, std::size_t lo, std::size_t hi, const probe_at<T>* probes, moments* out) {
  constexpr std::size_t block = tuning::moments_block;
  lane_statistics<T, Probes> lanes{};  // zeroed once per piece: GCC cannot see the SIMD stores
  // The Highway kernels when this source has them and the CPU runs a target they were built for.
  bool simd_runs = false;
  std::size_t simd_lanes = 1;
  if constexpr (simd::handles<Source>) {
    simd_runs = simd::active();
    if (simd_runs) simd_lanes = simd::lanes<T>();
  }
  // Whether the next block does every vector's tail work: when the last block's vectors
  // above a probe were neither rare nor all (a scattered mix, which the skip mispredicts).
  bool every_vector = false;
  auto fill = [&](std::size_t i, std::size_t n, auto& into) {
    if constexpr (simd::handles<Source>)
      if (simd_runs) {
        const std::size_t touched = simd::block_statistics<Log, TailLog, Probes>(source, i, n, probes, into, every_vector);
        const std::size_t vectors = n / simd_lanes;
        every_vector = touched * tuning::scattered_tails >= vectors && touched < vectors;
        return;
      }
    portable_block<Log, TailLog, Probes>(source, i, n, probes, into);
  };
  auto gather = [&](std::size_t i, std::size_t n) {
    if (lanes.fits_sum()) return lanes.gather_into(n, out);
    lane_statistics<T, Probes, double> wide{};
    fill(i, n, wide);
    wide.gather_into(n, out);
  };
  std::size_t i = lo;
  for (; i + block <= hi; i += block) {
    fill(i, block, lanes);
    gather(i, block);
  }
  if constexpr (simd::handles<Source>) {
    const std::size_t vectors = simd_runs ? (hi - i) / simd_lanes * simd_lanes : 0;
    if (vectors > 0) {
      fill(i, vectors, lanes);
      gather(i, vectors);
      i += vectors;
    }
  }
  add_values<Log, TailLog, Probes>(source, i, hi, probes, out);
}

}  // namespace sidco::backend::cpu_detail
