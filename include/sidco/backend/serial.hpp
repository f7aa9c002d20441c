// The serial backend: plain loops, one element at a time. It is the oracle that every
// faster backend is tested against, so it stays simple. basic_serial works on any memory
// space the host can address (host memory, or a test's instrumented memory).
#pragma once

#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <vector>

#include "sidco/backend/host/coarse_histograms.hpp"
#include "sidco/backend/host/keep_top_k.hpp"
#include "sidco/backend/host/merge_runs.hpp"
#include "sidco/backend/host/scans.hpp"
#include "sidco/backend/host/scatter_add.hpp"
#include "sidco/backend/pass_statistics.hpp"
#include "sidco/core/magnitude_key.hpp"
#include "sidco/core/moments.hpp"
#include "sidco/core/radix_select.hpp"
#include "sidco/core/segment.hpp"
#include "sidco/core/sparse_vector.hpp"
#include "sidco/core/uniform_subset.hpp"
#include "sidco/memory/host.hpp"

namespace sidco::backend {

template <class Memory>
struct basic_serial {
  using memory = Memory;
  static constexpr const char* name = "serial";

  template <class Stats, class Source>
  void analyze(const Source& source, std::span<const segment> layout, std::span<const double> probes,
               std::span<moments> out) {
    const std::size_t per = probes.size() / layout.size();
    for (std::size_t s = 0; s < layout.size(); ++s) {
      const segment g = layout[s];
      moments* o = out.data() + s * (1 + per);
      if constexpr (Stats::sums) {
        o[0] = {};
        for (std::size_t i = g.offset; i < g.end(); ++i)
          o[0].template add<Stats::log>(std::fabs(double(source.value(i))));
      } else {
        o[0] = host::counts_in(source, g.offset, g.end());
      }
      for (std::size_t j = 0; j < per; ++j)
        o[1 + j] = tail_in<Stats::tail_log>(source, probes[s * per + j], g.offset, g.end());
    }
  }

  template <bool Log, class Source>
  moments tail(const Source& source, double t) {
    return tail_in<Log>(source, t, 0, source.size);
  }

  template <class Source>
  std::size_t count_above(const Source& source, double t) {
    std::size_t n = 0;
    for (std::size_t i = 0; i < source.size; ++i) n += std::fabs(double(source.value(i))) > t;
    return n;
  }

  template <class Source>
  void coarse_histograms(const Source& source, std::span<const segment> layout, std::span<moments> counts) {
    constexpr int shift = coarse_shift<magnitude_key_t<typename Source::value_type>>;
    histograms_.resize(layout.size(), 1);
    counting_.assign(coarse_bins, 0);
    for (std::size_t s = 0; s < layout.size(); ++s) {
      for (std::size_t i = layout[s].offset; i < layout[s].end(); ++i)
        ++counting_[magnitude_key(source.value(i)) >> shift];
      histograms_.keep(s, 0, counting_.data(), host::all_bins);  // the oracle keeps and walks every bin
      if (!counts.empty()) counts[s] = host::counts_in(source, layout[s].offset, layout[s].end());
    }
  }

  void kth_largest_bins(std::span<const std::size_t> targets, std::span<key_bin> out) const {
    histograms_.kth_largest_bins(targets, out);
  }

  template <class Source>
  nonfinite_value first_nonfinite(const Source& source) {
    return host::first_nonfinite(source);
  }

  template <bool Final, class Source, class T, class Index>
  void select_above(const Source& source, std::span<const segment> layout, std::span<const double> thresholds,
                    sparse_vector<T, Index, Memory>& out, std::size_t, std::span<std::size_t> kept) {
    for (std::size_t s = 0; s < layout.size(); ++s) {
      const std::size_t before = out.size();
      for (std::size_t i = layout[s].offset; i < layout[s].end(); ++i) {
        const T v = source.value(i);
        const bool keep = std::fabs(double(v)) > thresholds[s];
        if (keep) append(out, Index(source.base + i), v);
        if constexpr (Source::has_state) source.settle(i, v, Final && keep);
      }
      kept[s] = out.size() - before;
    }
  }

  template <class Source, class T, class Index>
  void select_band(const Source& source, double low, double high, sparse_vector<T, Index, Memory>& out) {
    for (std::size_t i = 0; i < source.size; ++i) {
      const T v = source.rescan_value(i);
      const double a = std::fabs(double(v));
      if (a > low && a <= high) append(out, Index(source.base + i), v);
    }
  }

  template <class Source, class T, class Index>
  void select_random(const Source& source, std::size_t k, std::uint64_t state, sparse_vector<T, Index, Memory>& out) {
    uniform_subset(source.size, k, state, chosen_);
    const std::span<const std::size_t> chosen(chosen_);
    std::size_t next = 0;
    for (std::size_t i = 0; i < source.size; ++i) {
      const T v = source.value(i);
      const bool keep = next < chosen.size() && chosen[next] == i;
      next += keep;
      if (keep) append(out, Index(source.base + i), v);
      if constexpr (Source::has_state) source.settle(i, v, keep);
    }
  }

  template <class Source>
  void sample_magnitudes(const Source& source, std::uint64_t state, std::span<double> out) {
    host::sample_magnitudes(source, state, out);
  }

  template <class T, class Index>
  void keep_top_k(sparse_vector<T, Index, Memory>& out, std::size_t begin, std::span<const std::size_t> run_sizes,
                  std::span<const std::size_t> keep) {
    host::keep_top_k(out, begin, run_sizes, keep);
  }

  template <class T, class Index>
  void merge_runs(sparse_vector<T, Index, Memory>& out, std::size_t begin,
                  std::span<const std::size_t> run_starts) {
    host::merge_runs(out, begin, run_starts);
  }

  template <class Source, class T, class Index>
  void mark_sent(const Source& source, const sparse_vector<T, Index, Memory>& out, std::size_t begin) {
    host::mark_sent(source, out, begin);
  }

  template <class T, class Index>
  void scatter_add(const sparse_vector<T, Index, Memory>& in, typename Memory::template view<T> dense, T scale) {
    host::scatter_add(in, dense, scale);
  }

 private:
  // A negative threshold is taken as 0 (the non-zero values, excesses |x|), as every backend
  // takes it: the contract's probes and tails are for thresholds >= 0.
  template <bool Log, class Source>
  static moments tail_in(const Source& source, double t, std::size_t lo, std::size_t hi) {
    if (t < 0) t = 0;
    moments m;
    for (std::size_t i = lo; i < hi; ++i) {
      const double a = std::fabs(double(source.value(i)));
      if (a > t && a < __builtin_huge_val()) m.template add<Log>(a - t);
    }
    return m;
  }

  template <class T, class Index>
  static void append(sparse_vector<T, Index, Memory>& out, Index index, T value) {
    const std::size_t at = out.size();
    out.resize(at + 1);
    Memory::address(out.index_data())[at] = index;
    Memory::address(out.value_data())[at] = value;
  }

  std::vector<std::size_t> chosen_;          // Random-k's draw, reused
  host::kept_histograms histograms_;         // coarse_histograms' per segment, for kth_largest_bins
  std::vector<std::uint64_t> counting_;      // the segment coarse_histograms counts
};

/// The serial oracle on host memory.
using serial = basic_serial<memory::host>;

}  // namespace sidco::backend
