// Every segment's coarse histogram of magnitude keys, kept by a host backend from its
// coarse_histograms pass for kth_largest_bins: the serial oracle and backend::cpu share it.
// Kept packed: a segment's counts come from a writer's full 4,096-bin scratch, but only the
// bins it touched stay (a 32 KiB histogram per small layer would outweigh the layer).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "sidco/backend/host/cache_line.hpp"
#include "sidco/core/float_traits.hpp"
#include "sidco/core/magnitude_key.hpp"
#include "sidco/core/radix_select.hpp"

namespace sidco::backend::host {

/// The bins a count added to, bin 0 aside (exact zeros and what is too small to tell from
/// them): [low, high], none when low > high.
struct touched_bins {
  std::uint32_t low = std::uint32_t(coarse_bins), high = 0;

  void merge(touched_bins other) {
    low = std::min(low, other.low);
    high = std::max(high, other.high);
  }
};

/// Every bin of a histogram.
inline constexpr touched_bins all_bins{0, std::uint32_t(coarse_bins - 1)};

/// Adds from's bin 0 and its touched bins (all of its counts) into `into` and zeros them in
/// from, which is then ready for the next count without clearing all 4,096 bins.
inline void move_touched_bins(std::uint64_t* into, std::uint64_t* from, touched_bins bins) {
  into[0] += std::exchange(from[0], 0);
  for (std::uint32_t bin = std::max<std::uint32_t>(bins.low, 1); bin <= bins.high; ++bin)
    into[bin] += std::exchange(from[bin], 0);
}

/// The segments' histograms, each bin 0 and its touched bins, in one arena per writer.
class kept_histograms {
 public:
  /// Makes room for segments' histograms, kept by up to `writers` threads at once (writer w
  /// stores into its own arena), each segment empty until kept.
  void resize(std::size_t segments, std::size_t writers) {
    kept_.assign(segments, kept{});
    if (arenas_.size() < writers) arenas_.resize(writers);
    for (arena& a : arenas_) a.counts.clear();
  }

  /// Keeps histogram (coarse_bins counts, every bin outside bin 0 and bins zero) as
  /// segment's, in writer's arena: bin 0 and the touched bins only, so that a small layer
  /// costs the range its magnitudes span, not 4,096 bins. Zeros those bins of histogram, so
  /// that it is ready for the next count. Writers may keep different segments at once.
  void keep(std::size_t segment, std::size_t writer, std::uint64_t* histogram, touched_bins bins) {
    std::vector<std::uint64_t>& counts = arenas_[writer].counts;
    kept& k = kept_[segment];
    k = kept{histogram[0], std::uint32_t(writer), counts.size(), std::max<std::uint32_t>(bins.low, 1), bins.high};
    histogram[0] = 0;
    if (k.low > k.high) return;
    counts.insert(counts.end(), histogram + k.low, histogram + k.high + 1);
    std::fill(histogram + k.low, histogram + k.high + 1, std::uint64_t(0));
  }

  /// The count of segment's bins from `first` up.
  std::uint64_t count_from(std::size_t segment, std::size_t first) const {
    const kept& k = kept_[segment];
    std::uint64_t n = first == 0 ? k.zero_bin : 0;
    for (std::size_t b = std::max<std::size_t>(first, k.low); b <= k.high; ++b) n += bin(k, b);
    return n;
  }

  /// out[s] = kth_largest_bin of segment s's histogram for targets[s].
  void kth_largest_bins(std::span<const std::size_t> targets, std::span<key_bin> out) const {
    for (std::size_t s = 0; s < targets.size(); ++s) out[s] = kth_largest_bin(kept_[s], targets[s]);
  }

  std::size_t bytes() const {
    std::size_t n = kept_.capacity() * sizeof(kept) + arenas_.capacity() * sizeof(arena);
    for (const arena& a : arenas_) n += a.counts.capacity() * sizeof(std::uint64_t);
    return n;
  }

 private:
  // A kept histogram: bin 0's count, and bins [low, high] (none when low > high) at
  // arenas_[writer][offset, ...).
  struct kept {
    std::uint64_t zero_bin = 0;
    std::uint32_t writer = 0;
    std::size_t offset = 0;
    std::uint32_t low = std::uint32_t(coarse_bins), high = 0;
  };

  // A writer's kept bins, on its own cache line: writers grow theirs at once.
  struct alignas(own_cache_line) arena {
    std::vector<std::uint64_t> counts;
  };

  std::uint64_t bin(const kept& k, std::size_t b) const { return arenas_[k.writer].counts[k.offset + (b - k.low)]; }

  // kth_largest_bin walked over the touched bins only: those above them and those between
  // bin 0 and them are zero, so any target > 0 is reached within them or, when they fall
  // short, at bin 0; target 0 is reached at the top bin.
  key_bin kth_largest_bin(const kept& k, std::size_t target) const {
    constexpr std::size_t top = coarse_bins - 1;
    if (target == 0) return {top, std::size_t(k.low <= top && top <= k.high ? bin(k, top) : 0)};
    std::size_t needed = target;
    if (k.low <= k.high) {
      const std::uint64_t* touched = arenas_[k.writer].counts.data() + k.offset;
      const std::size_t i = highest_bin_reaching(touched, std::size_t(k.high - k.low) + 1, needed);
      if (touched[i] >= needed) return {k.low + i, std::size_t(target - needed + touched[i])};
      needed -= std::size_t(touched[i]);
    }
    return {0, std::size_t(target - needed + k.zero_bin)};
  }

  std::vector<kept> kept_;
  std::vector<arena> arenas_;
};

/// The non-finite values segment's kept histogram of T's keys counts: its bins from
/// infinity's up, exactly, since infinity's key has no bits below the coarse bin.
template <class T>
std::uint64_t nonfinite_in_histogram(const kept_histograms& kept, std::size_t segment) {
  using Key = magnitude_key_t<T>;
  constexpr Key infinity = float_traits<T>::infinity;
  constexpr std::size_t first = std::size_t(infinity >> coarse_shift<Key>);
  static_assert((Key(first) << coarse_shift<Key>) == infinity, "infinity's key must start a coarse bin");
  return kept.count_from(segment, first);
}

}  // namespace sidco::backend::host
