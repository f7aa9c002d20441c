// Radix select on magnitude keys: the digit walk that every backend's exact Top-k and the
// coarse radix threshold share, on the host and (SIDCO_HOST_DEVICE) in CUDA kernels. The
// backends only differ in how they count a histogram and split the walk over threads.
#pragma once

#include <cstddef>

#include "sidco/core/config.hpp"

namespace sidco {

/// From the highest bin down: the highest bin at which the counts of it and every bin above
/// it reach needed (bin 0 when none does). needed becomes how many of that bin's entries
/// complete the count.
template <class Count>
SIDCO_HOST_DEVICE constexpr std::size_t highest_bin_reaching(const Count* counts, std::size_t bins,
                                                             std::size_t& needed) {
  std::size_t bin = bins - 1;
  for (; bin > 0 && counts[bin] < needed; --bin) needed -= counts[bin];
  return bin;
}

/// highest_bin_reaching split over the positions of the bins counted from the top (position
/// p: bin bins - 1 - p), as a block's threads see them after an inclusive scan:
/// at_or_above, the counts of the p + 1 highest bins; before, those of the p highest (0 at
/// p = 0). True for exactly one position, the answer's, where needed_now becomes what
/// highest_bin_reaching leaves in needed: needed - before.
template <class Count>
SIDCO_HOST_DEVICE constexpr bool bin_reaching_at(std::size_t p, std::size_t bins, Count at_or_above, Count before,
                                                 std::size_t needed, std::size_t& needed_now) {
  const bool reached_here = std::size_t(at_or_above) >= needed || p + 1 == bins;  // bin 0 takes the rest
  if (!reached_here || (p > 0 && std::size_t(before) >= needed)) return false;
  needed_now = needed - std::size_t(before);
  return true;
}

/// The coarse pass of radix selection looks at the top 12 bits of a magnitude key (whose
/// top bit is clear): 4,096 bins, key >> coarse_shift<Key>.
inline constexpr int coarse_key_bits = 12;
inline constexpr std::size_t coarse_bins = std::size_t(1) << coarse_key_bits;
template <class Key>
inline constexpr int coarse_shift = int(8 * sizeof(Key)) - 1 - coarse_key_bits;

/// A bin of a histogram and how many entries lie in it or above it.
struct key_bin {
  std::size_t bin = 0;
  std::size_t at_or_above = 0;
};

/// The highest bin at which k or more entries lie in it or above it (bin 0, holding
/// everything, when fewer than k do).
template <class Count>
SIDCO_HOST_DEVICE constexpr key_bin kth_largest_bin(const Count* counts, std::size_t bins, std::size_t k) {
  std::size_t needed = k;
  const std::size_t bin = highest_bin_reaching(counts, bins, needed);
  return {bin, std::size_t(k - needed + std::size_t(counts[bin]))};
}

/// kth_largest_bin split over shares of the bins taken from the top (a thread block's
/// threads): this share holds bins [low, high), above entries lie in the bins over high,
/// first: it holds the top bin, last: it holds bin 0. True, with out set, for exactly one
/// share: the one holding the answer.
template <class Count>
SIDCO_HOST_DEVICE constexpr bool kth_largest_bin_in_share(const Count* counts, std::size_t low, std::size_t high,
                                                           std::size_t above, std::size_t k, bool first, bool last,
                                                           key_bin& out) {
  if (!first && above >= k) return false;  // a share above already reached k
  std::size_t at_or_above = above;
  for (std::size_t bin = high; bin-- > low;) {
    at_or_above += std::size_t(counts[bin]);
    if (at_or_above >= k) {
      out = {bin, at_or_above};
      return true;
    }
  }
  if (!last) return false;
  out = {0, at_or_above};  // fewer than k in all: bin 0 holds everything
  return true;
}

/// The exact k-th largest key, eight bits a round from the top. Each round counts the digit
/// of the keys still in the running (digit() >= 0) and calls choose(); after the last round
/// prefix is the k-th largest key and an entry belongs to the top k when rank() > 0, or
/// rank() == 0 and fewer than `needed` ties come before it (ties go to the lower index).
template <class Key>
struct radix_select {
  static constexpr std::size_t bins = 256;
  static constexpr int rounds = int(sizeof(Key));

  Key prefix = 0, mask = 0;
  std::size_t needed;  // of the keys equal to prefix, how many complete the top k

  SIDCO_HOST_DEVICE explicit constexpr radix_select(std::size_t k) : needed(k) {}

  SIDCO_HOST_DEVICE static constexpr int shift_of(int round) { return 8 * (rounds - 1 - round); }

  /// The key's digit in this round, or -1 when an earlier round ruled the key out.
  SIDCO_HOST_DEVICE constexpr int digit(Key key, int round) const {
    return (key & mask) == prefix ? int((key >> shift_of(round)) & 0xff) : -1;
  }

  /// Fixes this round's digit from the histogram (bins counts) of digit() over the entries.
  template <class Count>
  SIDCO_HOST_DEVICE constexpr void choose(const Count* counts, int round) {
    std::size_t now = needed;
    const std::size_t d = highest_bin_reaching(counts, bins, now);
    take(d, now, round);
  }

  /// Fixes this round's digit to d, of whose entries needed_now complete the top k (what
  /// choose() finds, when found another way: bin_reaching_at).
  SIDCO_HOST_DEVICE constexpr void take(std::size_t d, std::size_t needed_now, int round) {
    needed = needed_now;
    prefix = Key(prefix | Key(Key(d) << shift_of(round)));
    mask = Key(mask | Key(Key(0xff) << shift_of(round)));
  }

  /// After the last round: 1 above the k-th largest key, 0 tied with it, -1 below.
  SIDCO_HOST_DEVICE constexpr int rank(Key key) const { return key > prefix ? 1 : (key == prefix ? 0 : -1); }
};

}  // namespace sidco
