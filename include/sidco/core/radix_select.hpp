// Radix select on magnitude keys: the digit walk that every backend's exact Top-k and the
// coarse radix threshold share, on the host and (SIDCO_HOST_DEVICE) in CUDA kernels. The
// backends only differ in how they count a round's histogram.
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
    const std::size_t d = highest_bin_reaching(counts, bins, needed);
    prefix = Key(prefix | Key(Key(d) << shift_of(round)));
    mask = Key(mask | Key(Key(0xff) << shift_of(round)));
  }

  /// After the last round: 1 above the k-th largest key, 0 tied with it, -1 below.
  SIDCO_HOST_DEVICE constexpr int rank(Key key) const { return key > prefix ? 1 : (key == prefix ? 0 : -1); }
};

}  // namespace sidco
