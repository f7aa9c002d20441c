// The CPU backend: threads (OpenMP) over contiguous ranges, and SIMD inner loops: Highway's
// (highway_kernels.hpp) when SIDCO_HIGHWAY=1, else loops written so that the compiler
// vectorizes them (branch-free blocks, independent lane accumulators). Compile with -O3
// -fopenmp, and -march=native for the widest vectors; without OpenMP it runs on one thread
// and gives the same results. Results are deterministic for a given thread count.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
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
#include "sidco/backend/highway_kernels.hpp"
#include "sidco/backend/serial.hpp"
#include "sidco/backend/source.hpp"
#include "sidco/core/sparse_vector.hpp"

namespace sidco::backend {

class cpu {
 public:
  static constexpr const char* name = "cpu";
  /// Which inner loops this build runs: a Highway target, or "portable".
  static constexpr const char* kernels = simd::target_name();
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
  /// contents), in index order: a compaction as in select_above (one pass given a hint of
  /// the count), then the moments kernel over what was kept.
  template <bool Log, class Source, class T>
  moments excess(const Source& source, double t, std::vector<T>& exceedances,
                 std::size_t expected = 0) const {
    const std::size_t total = keep_exceeding<false, false>(source, t, exceedances, expected, gave_up);
    // Every kept value is above t: count is total; an excess that rounds to 0 in T counts
    // as a zero and stays out of the fit's sample, as it should.
    return magnitudes<Log>(excess_source<T>{exceedances.data(), total, T(t)});
  }

  /// magnitudes and excess's compaction in one pass: the moments of |x| over the whole
  /// source, with the |x| > t written to exceedances (replacing its contents) in index
  /// order. Given no hint of the count, it makes the two passes. kept is false, and
  /// exceedances empty, when more than about limit values exceed t: the pass gives up
  /// keeping them rather than grow the buffer beyond a quarter over that.
  template <bool Log, class Source, class T>
  moments magnitudes_above(const Source& source, double t, std::vector<T>& exceedances,
                           std::size_t expected, std::size_t limit, bool& kept) const {
    if (expected == 0) {
      kept = keep_exceeding<false, false>(source, t, exceedances, 0, limit) != gave_up;
      return magnitudes<Log>(source);
    }
    kept = keep_exceeding<Log, true>(source, t, exceedances, expected, limit) != gave_up;
    moments all;
    for (const auto& m : partials_) all.merge(m);
    return all;
  }

  template <class Source>
  std::size_t count_above(const Source& source, double t) const {
    return count_ranges_above(source, threshold_key<value_t<Source>>(t));
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
  ///
  /// With a hint of the expected count, one pass: each thread writes into its own region of
  /// out, sized from the hint and from what each range kept last time, and the regions are
  /// then closed up (only the kept entries move). A range that fills its region stops there
  /// and the rest of it is counted and written after (correct, only slower). Without a hint,
  /// two passes: count, then write at each range's offset. Either way threads keep indices
  /// ascending with O(threads) scratch.
  template <bool Final, class Source, class T, class Index>
  void select_above(const Source& source, double t, sparse_vector<T, Index>& out,
                    std::size_t expected = 0) const {
    const auto above = threshold_key<T>(t);
    const std::size_t start = out.size();
    const std::size_t total = compact(
        source.size, expected, last_selected_, out.capacity() - start,
        [&](std::size_t lo, std::size_t hi) { return count_above_in(source, lo, hi, above); },
        [&]<bool Bounded>(std::bool_constant<Bounded>, int, std::size_t lo, std::size_t hi,
                          std::size_t& at, std::size_t end) {
          return write_above<Final, Bounded>(source, lo, hi, above,
                                             out.mutable_indices().data() + start,
                                             out.mutable_values().data() + start, at, end);
        },
        [&](std::size_t slots) { out.resize(start + slots); },
        [&](std::size_t to, std::size_t from, std::size_t count) {
          std::memmove(out.mutable_indices().data() + start + to,
                       out.mutable_indices().data() + start + from, count * sizeof(Index));
          std::memmove(out.mutable_values().data() + start + to,
                       out.mutable_values().data() + start + from, count * sizeof(T));
        });
    out.truncate(start + total);
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
    const auto region = append(out, count_ranges(source.size, [&](std::size_t lo, std::size_t hi) {
      std::size_t n = 0;
      for (std::size_t i = lo; i < hi; ++i) n += in_band(i);
      return n;
    }));
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

  // Values per moments block: summed in T lanes, then added in double.
  static constexpr std::size_t moments_block = 1024;

  // Moments of |x| over [i, i + moments_block). Every test is an integer compare on the
  // magnitude bits: float compares may trap on NaN, which stops the compiler from
  // vectorizing them; for non-negative floats the bits order like the values, so min and
  // max are integer too.
  template <bool Log, class Source>
  static moments block_moments(const Source& source, std::size_t i) {
    using T = value_t<Source>;
    using Key = magnitude_key_t<T>;
    constexpr std::size_t block = moments_block;
    if constexpr (simd::handles<Source>) {
      simd::lane_moments<T, Key> part;
      simd::block_moments<Log>(source, i, block, part);
      return gather_lanes(part.lanes, block, part.sum, part.sum_sq, part.sum_log, part.zeros,
                          part.nonfinite, part.low, part.high);
    } else {
      constexpr std::size_t lanes = 64 / sizeof(T);
      const Key infinity = magnitude_key(std::numeric_limits<T>::infinity());
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
      return gather_lanes(lanes, block, sum, sum_sq, sum_log, zeros, nonfinite, low, high);
    }
  }

  // Adds |x| over [lo, hi), fewer than a block, value by value.
  template <bool Log, class Source>
  static void add_moments(moments& total, const Source& source, std::size_t lo, std::size_t hi) {
    for (std::size_t i = lo; i < hi; ++i) {
      const auto a = std::fabs(source.value(i));
      total.add<false>(double(a));
      if constexpr (Log)
        if (std::isfinite(a) && a > 0) total.sum_log += double(fast_log(a));
    }
  }

  // One pass over [lo, hi).
  template <bool Log, class Source>
  static moments range_moments(const Source& source, std::size_t lo, std::size_t hi) {
    moments total;
    std::size_t i = lo;
    for (; i + moments_block <= hi; i += moments_block) total.merge(block_moments<Log>(source, i));
    add_moments<Log>(total, source, i, hi);
    return total;
  }

  // range_moments, also writing |x| > t at out[at, end) block by block (each block is
  // compacted while it is still in L1) until the room runs out; stop is where writing
  // stopped (hi when it did not).
  template <bool Log, class Source, class S, class T>
  static moments range_moments_writing(const Source& source, std::size_t lo, std::size_t hi,
                                       S above, T* out, std::size_t& at, std::size_t end,
                                       std::size_t& stop) {
    moments total;
    stop = hi;
    std::size_t i = lo;
    for (; i + moments_block <= hi; i += moments_block) {
      total.merge(block_moments<Log>(source, i));
      if (stop == hi) {
        const std::size_t next = i + moments_block;
        const std::size_t written = write_magnitudes_above<true>(source, i, next, above, out, at, end);
        if (written < next) stop = written;
      }
    }
    add_moments<Log>(total, source, i, hi);
    if (stop == hi) stop = write_magnitudes_above<true>(source, i, hi, above, out, at, end);
    return total;
  }

  // One block's lane partials, added in double lane by lane.
  template <class T, class Key>
  static moments gather_lanes(std::size_t lanes, std::size_t block, const T* sum,
                              const T* sum_sq, const T* sum_log, const Key* zeros,
                              const Key* nonfinite, const Key* low, const Key* high) {
    const Key infinity = magnitude_key(std::numeric_limits<T>::infinity());
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
    return m;
  }

  // How many |x_i| > t in [lo, hi).
  template <class Source, class S>
  static std::size_t count_above_in(const Source& source, std::size_t lo, std::size_t hi,
                                    S above) {
    std::size_t n = 0, i = lo;
    if constexpr (simd::handles<Source>) i = simd::count_above(source, lo, hi, above, n);
    for (; i < hi; ++i) n += exceeds(signed_key(source.value(i)), above);
    return n;
  }

  // count_ranges for |x_i| > t.
  template <class Source, class S>
  std::size_t count_ranges_above(const Source& source, S above) const {
    return count_ranges(source.size, [&](std::size_t lo, std::size_t hi) {
      return count_above_in(source, lo, hi, above);
    });
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

  // Counts per range (count(lo, hi)); leaves each range's starting offset in offsets_ and
  // returns the total.
  template <class Count>
  std::size_t count_ranges(std::size_t n, Count&& count) const {
    const std::size_t ranges = std::size_t(range_count(n));
    offsets_.assign(ranges + 1, 0);
    for_each_range(n, [&](int r, std::size_t lo, std::size_t hi) {
      offsets_[std::size_t(r) + 1] = count(lo, hi);
    });
    for (std::size_t r = 0; r < ranges; ++r) offsets_[r + 1] += offsets_[r];
    return offsets_[ranges];
  }

  // The compaction of the |x| > t into exceedances (replacing its contents), in index order,
  // for excess and magnitudes_above. With Moments, the one pass (given a hint) also leaves
  // each range's moments of |x| in partials_. Returns the count, or gave_up (exceedances
  // then empty) when more than about limit exceed t.
  template <bool Log, bool Moments, class Source, class T>
  std::size_t keep_exceeding(const Source& source, double t, std::vector<T>& exceedances,
                             std::size_t expected, std::size_t limit) const {
    const auto above = threshold_key<T>(t);
    if constexpr (Moments) partials_.resize(std::size_t(range_count(source.size)));
    const std::size_t total = compact(
        source.size, expected, last_exceeding_, exceedances.capacity(),
        [&](std::size_t lo, std::size_t hi) { return count_above_in(source, lo, hi, above); },
        [&]<bool Bounded>(std::bool_constant<Bounded>, int r, std::size_t lo, std::size_t hi,
                          std::size_t& at, std::size_t end) {
          // The bounded call covers each whole range once: it takes the moments too.
          if constexpr (Moments && Bounded) {
            std::size_t stop;
            partials_[std::size_t(r)] = range_moments_writing<Log>(
                source, lo, hi, above, exceedances.data(), at, end, stop);
            return stop;
          } else {
            return write_magnitudes_above<Bounded>(source, lo, hi, above, exceedances.data(), at, end);
          }
        },
        [&](std::size_t slots) {
          // Geometric growth, as this buffer is N-sized: by half without a limit, so that
          // counts varying from call to call settle its size within a few calls; with one,
          // doubling up to a quarter over the limit, so that it stays bounded by it.
          const std::size_t capacity = exceedances.capacity();
          const std::size_t most = limit == gave_up ? capacity + capacity / 2
                                                    : std::min(2 * capacity, limit + limit / 4);
          if (slots > capacity) exceedances.reserve(std::max(slots, most));
          exceedances.resize(slots);
        },
        [&](std::size_t to, std::size_t from, std::size_t count) {
          std::memmove(exceedances.data() + to, exceedances.data() + from, count * sizeof(T));
        },
        limit);
    exceedances.resize(total == gave_up ? 0 : total);
    return total;
  }

  // One range's share of a one-pass compaction: [begin, end) of the output, at the next free
  // slot, stop where the range's pass stopped, hi where the range ends, leftover kept after
  // stop, place its final offset.
  struct region {
    std::size_t begin, end, at, stop, hi, leftover, place;
  };

  // Regions of the output for a one-pass compaction: the hint shared out as the ranges
  // shared the last such compaction (evenly the first time), with a quarter more room (half
  // more the first time), plus room for whole blocks. When the buffer already has room for a
  // tenth more than the hint, the regions share that room instead, so that a count creeping
  // up from call to call does not grow the buffer every time. Never more than limit in all
  // (or than the room for whole blocks, if that is more).
  void plan_regions(std::size_t ranges, std::size_t expected, std::vector<std::size_t>& last,
                    std::size_t room, std::size_t limit) const {
    if (last.size() != ranges) last.assign(ranges, 0);
    std::size_t last_total = 0;
    for (std::size_t kept : last) last_total += kept;
    const double slack = last_total ? 1.25 : 1.5;
    const double blocks = double(ranges * 4 * select_block);
    const double wanted = slack * double(expected) + blocks;
    const double enough = 1.1 * double(expected) + blocks;
    double scale = double(room) >= enough ? double(room) / wanted : 1.0;
    scale = std::min(scale, std::max(double(limit), blocks) / wanted);
    regions_.resize(ranges);
    std::size_t end = 0;
    for (std::size_t r = 0; r < ranges; ++r) {
      const double share = last_total ? double(last[r]) / double(last_total) : 1.0 / double(ranges);
      const auto size = std::size_t(scale * (slack * share * double(expected) + double(4 * select_block)));
      regions_[r] = {end, end + size, end, 0, 0, 0, 0};
      end += size;
    }
  }

  // Compacts, in range order, what count(lo, hi) counts and write(bounded, r, lo, hi, at, end)
  // writes for range r (see write_above) into slots [0, total) of a buffer that resize(slots)
  // sizes, keeping its contents, and move(to, from, count) moves within. Returns total, or
  // gave_up, having written nothing it keeps, when a limit on the slots was given and the
  // two passes count more, or the one pass would have exceeded it.
  //
  // With a hint of the count, one pass: each range writes into its own region, then the
  // regions are closed up (only kept entries move). A range that fills its region stops
  // there; the rest of it is counted and written after (correct, only slower). Without a
  // hint, two passes: count, then write at each range's offset.
  template <class Count, class Write, class Resize, class Move>
  std::size_t compact(std::size_t n, std::size_t expected, std::vector<std::size_t>& last,
                      std::size_t room, Count&& count, Write&& write, Resize&& resize,
                      Move&& move, std::size_t limit = gave_up) const {
    const std::size_t ranges = std::size_t(range_count(n));
    const bool limited = limit != gave_up;
    if (expected == 0) {
      const std::size_t total = count_ranges(n, count);
      if (limited && total > limit) return gave_up;
      resize(total);
      for_each_range(n, [&](int r, std::size_t lo, std::size_t hi) {
        // A copy: the next range's thread reads offsets_[r + 1] as its end.
        std::size_t at = offsets_[std::size_t(r)];
        write(std::false_type{}, r, lo, hi, at, offsets_[std::size_t(r) + 1]);
      });
      last.resize(ranges);
      for (std::size_t r = 0; r < ranges; ++r) last[r] = offsets_[r + 1] - offsets_[r];
      return total;
    }
    plan_regions(ranges, expected, last, room, limit);
    resize(regions_.back().end);
    for_each_range(n, [&](int r, std::size_t lo, std::size_t hi) {
      region& g = regions_[std::size_t(r)];
      g.stop = write(std::true_type{}, r, lo, hi, g.at, g.end);
      g.hi = hi;
      g.leftover = g.stop < hi && !limited ? count(g.stop, hi) : 0;
    });
    std::size_t total = 0;
    bool overflow = false;  // a range stopped early: its rest is unwritten (and unsettled)
    for (auto& g : regions_) {
      g.place = total;  // range r's kept entries, then its leftovers, in range order
      total += (g.at - g.begin) + g.leftover;
      overflow |= g.stop < g.hi;
    }
    if (overflow && limited) return gave_up;
    if (total > regions_.back().end) resize(total);
    // Places are ascending and disjoint, as are the regions: moving those that go right from
    // the last, then those that go left from the first, never overwrites unmoved entries.
    for (auto g = regions_.rbegin(); g != regions_.rend(); ++g)
      if (g->place > g->begin && g->at > g->begin) move(g->place, g->begin, g->at - g->begin);
    for (const auto& g : regions_)
      if (g.place < g.begin && g.at > g.begin) move(g.place, g.begin, g.at - g.begin);
    if (overflow) {
      for_each_range(n, [&](int r, std::size_t, std::size_t hi) {
        const region& g = regions_[std::size_t(r)];
        std::size_t at = g.place + (g.at - g.begin);
        if (g.stop < hi) write(std::false_type{}, r, g.stop, hi, at, at + g.leftover);
      });
    }
    for (std::size_t r = 0; r < ranges; ++r)
      last[r] = (regions_[r].at - regions_[r].begin) + regions_[r].leftover;
    return total;
  }

  static constexpr std::size_t select_block = 16;
  static constexpr std::size_t gave_up = std::size_t(-1);

  // Writes |v| for |v| > t over [lo, hi) at out[at, end), with write_above's contract.
  // Without branches: store always, advance when kept (a quarter of the values are kept
  // here, which a branch would mispredict), and only while a slot is free below end.
  template <bool Bounded, class Source, class S, class T>
  static std::size_t write_magnitudes_above(const Source& source, std::size_t lo, std::size_t hi,
                                            S above, T* out, std::size_t& at, std::size_t end) {
    std::size_t i = lo;
    if constexpr (simd::handles<Source>)
      i = simd::write_magnitudes_above(source, lo, hi, above, out, at, end);
    for (; i < hi && at < end; ++i) {
      const T v = source.value(i);
      out[at] = std::fabs(v);
      at += exceeds(signed_key(v), above);
    }
    return i;
  }

  // Writes (base + i, v) for |v| > t over [lo, hi) at indices/values[at, end), settling
  // every value it passes. Bounded: stops before a block that might not fit below end and
  // returns where it stopped (hi when it finished); unsettled values remain from there.
  // Otherwise end is exactly where the range's entries end, and it finishes.
  template <bool Final, bool Bounded, class Source, class S, class T, class Index>
  static std::size_t write_above(const Source& source, std::size_t lo, std::size_t hi, S above,
                                 Index* indices, T* values, std::size_t& at, std::size_t end) {
    std::size_t i = lo;
    // Whole vectors while a whole vector's store fits; the loops below finish.
    if constexpr (simd::selects<Source, Index>)
      i = simd::write_above<Final>(source, lo, hi, above, indices, values, at, end);
    // 16-value blocks: settle every value without a branch (vectorizes), and look for kept
    // values only in blocks whose largest key is above t (a max reduction; a NaN key only
    // sends a block to the exact test).
    for (; i + select_block <= hi; i += select_block) {
      if (Bounded && at + select_block > end) return i;
      T v[select_block];
      auto largest = signed_key(source.value(i));
      for (std::size_t j = 0; j < select_block; ++j) {
        v[j] = source.value(i + j);
        const auto key = signed_key(v[j]);
        largest = key > largest ? key : largest;
      }
      if constexpr (Source::has_state)
        for (std::size_t j = 0; j < select_block; ++j)
          source.settle(i + j, v[j], Final & exceeds(signed_key(v[j]), above));
      if (!(largest > above)) continue;
      for (std::size_t j = 0; j < select_block; ++j)
        if (exceeds(signed_key(v[j]), above)) {
          indices[at] = Index(source.base + i + j);
          values[at] = v[j];
          ++at;
        }
    }
    if (Bounded && at + select_block > end) return i;
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
    return hi;
  }

  int threads_ = 0;
  // Per-thread scratch, kept across calls: O(threads), never O(N).
  mutable std::vector<moments> partials_;
  mutable std::vector<std::size_t> offsets_;
  mutable std::vector<std::uint64_t> histograms_;
  mutable std::vector<region> regions_;
  // Per range, what the last one-pass selection and exceedance pass kept.
  mutable std::vector<std::size_t> last_selected_, last_exceeding_;
};

}  // namespace sidco::backend
