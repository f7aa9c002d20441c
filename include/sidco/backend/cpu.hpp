// The CPU backend: threads (OpenMP) over contiguous ranges, and SIMD inner loops: Highway's
// (cpu/highway.hpp) when SIDCO_HIGHWAY=1, else loops written so that the compiler
// vectorizes them (branch-free blocks, independent lane accumulators). Compile with -O3
// -fopenmp, and -march=native for the widest vectors; without OpenMP it runs on one thread
// and gives the same results. Results do not depend on the thread count (tested with 1, 2, 3).
//
// Each algorithm has a file of its own under cpu/: ranges (threads and layout pieces),
// moments (the statistics pass), selection (counting and writing kept values), compaction
// (the order-preserving parallel output), lanes and highway (the SIMD loops), tuning (every
// tuning value, with where it came from).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <span>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "sidco/backend/cpu/compaction.hpp"
#include "sidco/backend/cpu/highway.hpp"
#include "sidco/backend/cpu/lanes.hpp"
#include "sidco/backend/cpu/moments.hpp"
#include "sidco/backend/cpu/ranges.hpp"
#include "sidco/backend/cpu/selection.hpp"
#include "sidco/backend/pass_statistics.hpp"
#include "sidco/backend/host/coarse_histograms.hpp"
#include "sidco/backend/host/keep_top_k.hpp"
#include "sidco/backend/host/merge_runs.hpp"
#include "sidco/backend/host/scans.hpp"
#include "sidco/backend/host/scatter_add.hpp"
#include "sidco/backend/source.hpp"
#include "sidco/core/half.hpp"
#include "sidco/core/magnitude_key.hpp"
#include "sidco/core/moments.hpp"
#include "sidco/core/radix_select.hpp"
#include "sidco/core/segment.hpp"
#include "sidco/core/sparse_vector.hpp"
#include "sidco/core/uniform_subset.hpp"
#include "sidco/memory/host.hpp"

namespace sidco::backend {

class cpu {
 public:
  using memory = memory::host;
  static constexpr const char* name = "cpu";
  /// Which inner loops run on this CPU: a Highway target (chosen at run time when the
  /// kernels were built for several), or "portable".
  static const char* kernels() { return simd::target_name(); }

  /// OpenMP's default thread count (OMP_NUM_THREADS or the core count).
  cpu() = default;
  /// A fixed thread count (0: OpenMP's default).
  explicit cpu(int threads) : threads_(threads) {}

  int threads() const { return threads_.threads(); }

  /// Each segment is gathered in units of tuning::moments_unit values from its start, each
  /// unit alone, and the units folded in order: a segment's moments depend on its values
  /// only, not on the thread count or where the segment lies in the buffer.
  template <class Stats, class Source>
  void analyze(const Source& source, std::span<const segment> layout, std::span<const double> probes,
               std::span<moments> out) {
    using T = typename Source::value_type;
    constexpr std::size_t unit = cpu_detail::tuning::moments_unit;
    const std::size_t segments = layout.size(), per = probes.size() / segments, width = 1 + per;
    auto& converted = probe_storage<T>();
    converted.resize(probes.size());
    for (std::size_t p = 0; p < probes.size(); ++p) converted[p] = cpu_detail::make_probe<T>(probes[p]);
    const cpu_detail::probe_at<T>* keys = converted.data();
    // first_unit_[s]: segment s's first unit; units are numbered across the layout.
    first_unit_.resize(segments + 1);
    first_unit_[0] = 0;
    for (std::size_t s = 0; s < segments; ++s)
      first_unit_[s + 1] = first_unit_[s] + (layout[s].size + unit - 1) / unit;
    const std::size_t units = first_unit_[segments];
    partials_.assign(units * width, moments{});
    threads_.for_each(source.size, [&](int, std::size_t lo, std::size_t hi) {
      // The units that start in [lo, hi), whole (a unit belongs to the range it starts in).
      if (lo >= hi) return;
      std::size_t s = cpu_detail::segment_at(layout, lo);
      std::size_t at = layout[s].offset + (lo - layout[s].offset + unit - 1) / unit * unit;
      while (s < segments && at < hi) {
        if (at >= layout[s].end()) {
          if (++s < segments) at = layout[s].offset;
          continue;
        }
        const std::size_t u = first_unit_[s] + (at - layout[s].offset) / unit;
        const std::size_t end = std::min(at + unit, layout[s].end());
        piece<Stats>(source, at, end, keys + s * per, per, partials_.data() + u * width);
        at = end;
      }
    });
    for (std::size_t s = 0; s < segments; ++s)
      for (std::size_t w = 0; w < width; ++w) {
        moments folded;
        for (std::size_t u = first_unit_[s]; u < first_unit_[s + 1]; ++u) folded.merge(partials_[u * width + w]);
        out[s * width + w] = folded;
      }
  }

  template <bool Log, class Source>
  moments tail(const Source& source, double t) {
    const segment whole{0, source.size};
    moments out[2];
    analyze<pass_statistics<true, false, Log>>(source, std::span<const segment>(&whole, 1),
                                               std::span<const double>(&t, 1), out);
    return out[1];
  }

  template <class Source>
  std::size_t count_above(const Source& source, double t) {
    const auto above = threshold_key<typename Source::value_type>(t);
    return threads_.count_each(source.size, [&](std::size_t lo, std::size_t hi) {
      return cpu_detail::count_above_in(source, lo, hi, above);
    }, offsets_);
  }

  /// f(s, backend) for every segment s of layout, f making segment s's own passes (an
  /// estimator's) on the backend it is given and touching nothing of other segments; self
  /// is this backend as the caller holds it. Segments too short to split over threads are
  /// shared out among the threads, each passing a one-thread backend of its own; longer ones
  /// follow on self, one at a time with every thread. Results do not depend on the thread
  /// count, so neither on which backend served. A class derived from cpu gets self for every
  /// segment, so that its own passes are the ones called. When f throws, the lowest
  /// segment's exception is rethrown after the rest have run.
  template <class Self, class F>
  void for_each_segment(Self& self, std::span<const segment> layout, F&& f) {
    static_assert(std::is_base_of_v<cpu, Self>, "cpu::for_each_segment: self is this backend");
    short_segments_.clear();
    if constexpr (std::is_same_v<Self, cpu>)
      for (std::size_t s = 0; s < layout.size(); ++s)
        if (threads_.count(layout[s].size) == 1) short_segments_.push_back(s);
    const int threads = threads_.available();
    if (threads == 1 || short_segments_.size() < 2) {
      for (std::size_t s = 0; s < layout.size(); ++s) f(s, self);
      return;
    }
    if (workers_.size() < std::size_t(threads)) workers_.resize(std::size_t(threads), cpu(1));
    std::exception_ptr failed;
    std::size_t failed_at = layout.size();
    threads_.for_each_item(short_segments_.size(), [&](int thread, std::size_t i) {
      const std::size_t s = short_segments_[i];
      try {
        f(s, workers_[std::size_t(thread)]);
      } catch (...) {
#if defined(_OPENMP)
#pragma omp critical(sidco_cpu_for_each_segment)
#endif
        if (s < failed_at) {
          failed_at = s;
          failed = std::current_exception();
        }
      }
    });
    for (std::size_t s = 0; s < layout.size() && s < failed_at; ++s)
      if (threads_.count(layout[s].size) > 1) f(s, self);  // a throw here is from a lower segment than any recorded
    if (failed) std::rethrow_exception(failed);
  }

  /// One pass over the whole buffer, the threads splitting it, not the layers (a layer
  /// costs no hand-off of its own): a segment that a thread's range holds whole is counted
  /// by that thread into its scratch histogram and kept from there (its touched bins only),
  /// one that it shares with another range (at most its first and its last) into the
  /// range's own, added and kept after. The non-finite values are the histogram's top bins.
  template <class Source>
  void coarse_histograms(const Source& source, std::span<const segment> layout, std::span<moments> counts) {
    using T = typename Source::value_type;
    const std::size_t segments = layout.size(), ranges = std::size_t(threads_.count(source.size));
    kept_.resize(segments, ranges + 1);  // writer r: range r's; writer ranges: the shared segments'
    segment_zeros_.assign(segments, 0);
    shared_.assign(2 * ranges, shared_piece{});
    failed_.assign(ranges, nullptr);
    // Per range: two slots for the pieces it shares, its scratch and its spare, all zero
    // between calls unless one failed (keep zeros what it took, move_touched_bins what it
    // moved).
    const std::size_t histogram_counts = 4 * ranges * coarse_bins;
    if (!histograms_zero_ || histograms_.size() != histogram_counts) histograms_.assign(histogram_counts, 0);
    histograms_zero_ = false;
    threads_.for_each(source.size, [&](int r, std::size_t lo, std::size_t hi) {
      std::uint64_t* scratch = histograms_.data() + (2 * ranges + std::size_t(r)) * coarse_bins;
      std::uint64_t* spare = histograms_.data() + (3 * ranges + std::size_t(r)) * coarse_bins;
      try {
        cpu_detail::for_each_piece(layout, lo, hi, [&](std::size_t s, std::size_t a, std::size_t b) {
          if (a == layout[s].offset && b == layout[s].end()) {
            const key_counts counted = count_keys(source, a, b, scratch, spare);
            segment_zeros_[s] = counted.zeros;
            kept_.keep(s, std::size_t(r), scratch, counted.bins);  // may grow the arena: may throw
          } else {  // the range's first piece (slot 0) or its last (slot 1)
            const std::size_t slot = 2 * std::size_t(r) + (a == lo ? 0 : 1);
            std::uint64_t* part = histograms_.data() + slot * coarse_bins;
            shared_[slot] = {s, count_keys(source, a, b, part, spare), true};
          }
          return true;
        });
      } catch (...) {  // no exception may leave an OpenMP region
        failed_[std::size_t(r)] = std::current_exception();
      }
    });
    for (const std::exception_ptr& failed : failed_)
      if (failed) std::rethrow_exception(failed);
    // A shared segment's pieces sit in consecutive slots: each is added to its first's.
    for (std::size_t slot = 0; slot < shared_.size();) {
      if (!shared_[slot].used) {
        ++slot;
        continue;
      }
      const std::size_t s = shared_[slot].segment;
      std::uint64_t* histogram = histograms_.data() + slot * coarse_bins;
      host::touched_bins bins = shared_[slot].counted.bins;
      segment_zeros_[s] = shared_[slot].counted.zeros;
      for (++slot; slot < shared_.size() && (!shared_[slot].used || shared_[slot].segment == s); ++slot) {
        const shared_piece& piece = shared_[slot];
        if (!piece.used) continue;
        host::move_touched_bins(histogram, histograms_.data() + slot * coarse_bins, piece.counted.bins);
        bins.merge(piece.counted.bins);
        segment_zeros_[s] += piece.counted.zeros;
      }
      kept_.keep(s, ranges, histogram, bins);  // may throw, leaving later slots counted
    }
    histograms_zero_ = true;
    for (std::size_t s = 0; s < counts.size(); ++s) {
      moments& m = counts[s] = moments{};
      m.count = layout[s].size;
      m.zeros = segment_zeros_[s];
      m.nonfinite = host::nonfinite_in_histogram<T>(kept_, s);
    }
  }

  void kth_largest_bins(std::span<const std::size_t> targets, std::span<key_bin> out) const {
    kept_.kth_largest_bins(targets, out);
  }

  /// The error path only: the single-threaded scan is enough.
  template <class Source>
  nonfinite_value first_nonfinite(const Source& source) {
    return host::first_nonfinite(source);
  }

  /// With a hint of the expected count, one pass (see cpu_detail::compaction); without, two.
  template <bool Final, class Source, class T, class Index>
  void select_above(const Source& source, std::span<const segment> layout, std::span<const double> thresholds,
                    sparse_vector<T, Index>& out, std::size_t hint, std::span<std::size_t> kept) {
    using S = signed_key_t<T>;
    keys_.resize(layout.size());
    for (std::size_t s = 0; s < layout.size(); ++s) keys_[s] = threshold_key<T>(thresholds[s]);
    const auto key = [&](std::size_t s) { return S(keys_[s]); };
    const std::size_t start = out.size();
    const std::size_t total = selection_.run(
        threads_, source.size, hint, out.capacity() - start,
        [&](std::size_t lo, std::size_t hi) {
          std::size_t n = 0;
          cpu_detail::for_each_piece(layout, lo, hi, [&](std::size_t s, std::size_t a, std::size_t b) {
            n += cpu_detail::count_above_in(source, a, b, key(s));
            return true;
          });
          return n;
        },
        [&]<bool Bounded>(std::bool_constant<Bounded>, int, std::size_t lo, std::size_t hi, std::size_t& at,
                          std::size_t end) {
          Index* indices = out.index_data() + start;
          T* values = out.value_data() + start;
          std::size_t stop = hi;
          cpu_detail::for_each_piece(layout, lo, hi, [&](std::size_t s, std::size_t a, std::size_t b) {
            stop = cpu_detail::write_above<Final, Bounded>(source, a, b, key(s), indices, values, at, end);
            return stop == b;
          });
          return stop;
        },
        [&](std::size_t slots) { out.resize(start + slots); },
        [&](std::size_t to, std::size_t from, std::size_t count) {
          std::memmove(out.index_data() + start + to, out.index_data() + start + from, count * sizeof(Index));
          std::memmove(out.value_data() + start + to, out.value_data() + start + from, count * sizeof(T));
        });
    out.truncate(start + total);
    count_per_segment(source, layout, out, start, kept);
  }

  template <class Source, class T, class Index>
  void select_band(const Source& source, double low, double high, sparse_vector<T, Index>& out) {
    const auto above = threshold_key<T>(low), upto = threshold_key<T>(high);
    auto in_band = [&](std::size_t i) {
      const auto key = signed_key(source.rescan_value(i));
      return exceeds<T>(key, above) & (key <= upto);
    };
    const std::size_t start = out.size();
    const std::size_t total = threads_.count_each(source.size, [&](std::size_t lo, std::size_t hi) {
      std::size_t n = 0;
      for (std::size_t i = lo; i < hi; ++i) n += in_band(i);
      return n;
    }, offsets_);
    out.resize(start + total);
    Index* const indices = out.index_data() + start;
    T* const values = out.value_data() + start;
    threads_.for_each(source.size, [&](int r, std::size_t lo, std::size_t hi) {
      std::size_t at = offsets_[std::size_t(r)];
      for (std::size_t i = lo; i < hi; ++i)
        if (in_band(i)) {
          indices[at] = Index(source.base + i);
          values[at] = source.rescan_value(i);
          ++at;
        }
    });
  }

  /// Reads only the chosen values; with state, one pass settles every value as unsent (a
  /// loop that vectorizes), then the chosen ones are marked sent, as the oracle's one
  /// pass leaves them.
  template <class Source, class T, class Index>
  void select_random(const Source& source, std::size_t k, std::uint64_t state, sparse_vector<T, Index>& out) {
    uniform_subset(source.size, k, state, chosen_);
    const std::span<const std::size_t> chosen(chosen_);
    const std::size_t start = out.size();
    out.resize(start + chosen.size());
    Index* const indices = out.index_data() + start;
    T* const values = out.value_data() + start;
    threads_.for_each(chosen.size(), [&](int, std::size_t lo, std::size_t hi) {
      for (std::size_t j = lo; j < hi; ++j) {
        indices[j] = Index(source.base + chosen[j]);
        values[j] = source.value(chosen[j]);
      }
    });
    if constexpr (Source::has_state) {
      threads_.for_each(source.size, [&](int, std::size_t lo, std::size_t hi) {
        for (std::size_t i = lo; i < hi; ++i) source.settle(i, source.value(i), false);
      });
      for (std::size_t j : chosen) source.mark_sent(j);
    }
  }

  /// The sample's ranges drawn by the threads: each draw is a cache miss on a large buffer,
  /// and each thread keeps its own draws in flight.
  template <class Source>
  void sample_magnitudes(const Source& source, std::uint64_t state, std::span<double> out) {
    threads_.for_each(out.size(), [&](int, std::size_t lo, std::size_t hi) {
      host::sample_magnitudes(source, state, out.subspan(lo, hi - lo), lo);
    });
  }

  template <class T, class Index>
  void keep_top_k(sparse_vector<T, Index>& out, std::size_t begin, std::span<const std::size_t> run_sizes,
                  std::span<const std::size_t> keep) {
    host::keep_top_k(out, begin, run_sizes, keep);
  }

  template <class T, class Index>
  void merge_runs(sparse_vector<T, Index>& out, std::size_t begin, std::span<const std::size_t> run_starts) {
    host::merge_runs(out, begin, run_starts);
  }

  template <class Source, class T, class Index>
  void mark_sent(const Source& source, const sparse_vector<T, Index>& out, std::size_t begin) {
    host::mark_sent(source, out, begin);
  }

  template <class T, class Index>
  void scatter_add(const sparse_vector<T, Index>& in, std::span<T> dense, T scale) {
    host::scatter_add(in, dense, scale);
  }

  /// Bytes of scratch kept between calls: O(threads + segments + N / moments_unit) (a
  /// thread's coarse histograms are 96 KiB; a segment's keeps 8 bytes a bin its magnitudes
  /// span, at most 32 KiB), plus Random-k's k drawn indices.
  std::size_t workspace_bytes() const {
    const std::size_t probes =
        std::apply([](const auto&... v) { return (std::size_t(0) + ... + (v.capacity() * sizeof(v[0]))); }, probes_);
    return partials_.capacity() * sizeof(moments) + probes +
           (first_unit_.capacity() + offsets_.capacity() + chosen_.capacity()) * sizeof(std::size_t) +
           (histograms_.capacity() + segment_zeros_.capacity()) * sizeof(std::uint64_t) + kept_.bytes() +
           shared_.capacity() * sizeof(shared_piece) + failed_.capacity() * sizeof(std::exception_ptr) +
           keys_.capacity() * sizeof(std::int64_t) +
           selection_.workspace_bytes() + short_segments_.capacity() * sizeof(std::size_t) + workers_bytes();
  }

 private:
  std::size_t workers_bytes() const {
    std::size_t bytes = workers_.capacity() * sizeof(cpu);
    for (const cpu& worker : workers_) bytes += worker.workspace_bytes();
    return bytes;
  }

  // What count_keys counted besides the bins: the exact zeros, the bins it added to.
  struct key_counts {
    std::uint64_t zeros = 0;
    host::touched_bins bins;
  };

  // A segment piece that a range shares with another: its segment and what it counted.
  struct shared_piece {
    std::size_t segment = 0;
    key_counts counted;
    bool used = false;
  };

  // Adds the coarse bins of [lo, hi)'s magnitude keys to histogram. The keys are computed a
  // block at a time (a loop that vectorizes, the touched range's min and max with it), then
  // counted alternately into histogram and spare (zero on entry and on return): gradient
  // magnitudes crowd a few bins, and back-to-back increments of one bin wait on each other's
  // stores. With two, sidco-bench's Top-k rows took 0.74-0.85 of their time with one (2^25
  // values and per layer; 2 threads, native build); four counted no faster than two.
  template <class Source>
  static key_counts count_keys(const Source& source, std::size_t lo, std::size_t hi, std::uint64_t* histogram,
                               std::uint64_t* spare) {
    constexpr int shift = coarse_shift<magnitude_key_t<typename Source::value_type>>;
    constexpr std::size_t block = cpu_detail::tuning::key_block;
    static_assert(block % 2 == 0, "a block's keys alternate between two histograms");
    std::uint32_t bins[block];
    std::uint64_t zeros = 0;
    // The lowest bin less one, unsigned: bin 0 wraps to the top, so it is never the low.
    std::uint32_t below_low = ~std::uint32_t(0), high = 0;
    std::size_t i = lo;
    for (; i + block <= hi; i += block) {
      for (std::size_t j = 0; j < block; ++j) {
        const auto key = magnitude_key(source.value(i + j));
        bins[j] = std::uint32_t(key >> shift);
        zeros += key == 0;
        below_low = std::min(below_low, bins[j] - 1u);
        high = std::max(high, bins[j]);
      }
      for (std::size_t j = 0; j < block; j += 2) {
        ++histogram[bins[j]];
        ++spare[bins[j + 1]];
      }
    }
    for (; i < hi; ++i) {
      const auto key = magnitude_key(source.value(i));
      const auto bin = std::uint32_t(key >> shift);
      ++histogram[bin];
      zeros += key == 0;
      below_low = std::min(below_low, bin - 1u);
      high = std::max(high, bin);
    }
    // below_low still all ones: bin 0 alone was counted.
    const host::touched_bins touched = below_low == ~std::uint32_t(0) ? host::touched_bins{}
                                                                      : host::touched_bins{below_low + 1u, high};
    host::move_touched_bins(histogram, spare, touched);
    return {zeros, touched};
  }

  // One piece's statistics, merged into out (this range's slots). Accumulated on the stack
  // and written once: the ranges' slots sit side by side, and writing them block after
  // block would bounce their cache lines between threads.
  template <class Stats, class Source, class P>
  static void piece(const Source& source, std::size_t lo, std::size_t hi, const P* probes, std::size_t per,
                    moments* out) {
    if constexpr (!Stats::sums) {
      out[0].merge(host::counts_in(source, lo, hi));
    } else {
      moments local[3];
      if (per == 0)
        cpu_detail::piece_statistics<Stats::log, Stats::tail_log, 0>(source, lo, hi, probes, local);
      else if (per == 1)
        cpu_detail::piece_statistics<Stats::log, Stats::tail_log, 1>(source, lo, hi, probes, local);
      else {
        // The kernels take probes ascending: the lower one gates the tails' work.
        const bool swapped = probes[1].key < probes[0].key;
        const P ascending[2] = {probes[swapped ? 1 : 0], probes[swapped ? 0 : 1]};
        cpu_detail::piece_statistics<Stats::log, Stats::tail_log, 2>(source, lo, hi, ascending, local);
        if (swapped) std::swap(local[1], local[2]);
      }
      for (std::size_t w = 0; w <= per; ++w) out[w].merge(local[w]);
    }
  }

  // kept[s]: how many of out's entries from start on lie in segment s (kept has one slot
  // per segment of layout).
  template <class Source, class T, class Index>
  static void count_per_segment(const Source& source, std::span<const segment> layout,
                                const sparse_vector<T, Index>& out, std::size_t start, std::span<std::size_t> kept) {
    const auto indices = out.indices();
    auto from = indices.begin() + std::ptrdiff_t(start);
    const std::size_t last = kept.size() - 1;
    for (std::size_t s = 0; s < last; ++s) {
      // Below the last segment's end, which fits the index type, every end does too.
      const auto to = std::lower_bound(from, indices.end(), Index(source.base + layout[s].end()));
      kept[s] = std::size_t(to - from);
      from = to;
    }
    kept[last] = std::size_t(indices.end() - from);
  }

  template <class T>
  std::vector<cpu_detail::probe_at<T>>& probe_storage() {
    return std::get<std::vector<cpu_detail::probe_at<T>>>(probes_);
  }

  cpu_detail::thread_ranges threads_;
  cpu_detail::compaction selection_;
  // Scratch for one call: O(threads + segments + units).
  std::vector<moments> partials_;
  // One probe list per element type, so a backend serves every type without reallocating.
  std::tuple<std::vector<cpu_detail::probe_at<float>>, std::vector<cpu_detail::probe_at<double>>,
             std::vector<cpu_detail::probe_at<float16>>, std::vector<cpu_detail::probe_at<bfloat16>>>
      probes_;
  std::vector<std::size_t> first_unit_, offsets_;
  // coarse_histograms': each segment's histogram (kept for kth_largest_bins) and zeros;
  // four histograms a range (the two pieces it shares, its scratch, its spare), whether they
  // are all zero, and each range's failure.
  host::kept_histograms kept_;
  std::vector<std::uint64_t> segment_zeros_, histograms_;
  std::vector<shared_piece> shared_;
  bool histograms_zero_ = false;
  std::vector<std::exception_ptr> failed_;
  std::vector<std::int64_t> keys_;
  std::vector<std::size_t> chosen_;  // Random-k's draw
  // for_each_segment's: the segments it shares out, and a one-thread backend a thread.
  std::vector<std::size_t> short_segments_;
  std::vector<cpu> workers_;
};

}  // namespace sidco::backend
