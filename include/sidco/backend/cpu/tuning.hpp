// backend::cpu's tuning values, in one place, each with where it came from.
#pragma once

#include <cstddef>

namespace sidco::backend::cpu_detail {

struct tuning {
  // Below this many values per thread, starting threads costs more than they save: on the
  // 2-vCPU reference VM a pass over 2^15 floats takes ~10 us, about an OpenMP fork-join.
  static constexpr std::size_t min_per_thread = std::size_t(1) << 15;
  // Thread ranges end on multiples of this many values, so that no two threads write the
  // same cache line of a residual (64 values covers 64-byte lines for double too).
  static constexpr std::size_t range_alignment = 64;
  // Values per moments block: summed in T lanes while the block is in L1 (4 KB of floats),
  // then added in double. Longer blocks lose float precision (the oracle test's 2e-6
  // relative tolerance holds at 1024 with a margin); shorter ones spend more time in the
  // double gathering.
  static constexpr std::size_t moments_block = 1024;
  // Values per block of the portable selection loop: one max-reduction decides whether a
  // block holds anything to keep (at 0.1% density most blocks do not).
  static constexpr std::size_t select_block = 16;
  // One-pass compaction: each thread's region of the output is its share of the expected
  // count times this slack (first call: no history, so more), plus this many select blocks.
  // A region that fills costs a second, counted pass over the rest of its range; 25% covers
  // the call-to-call variation of counts measured on the bundled gradients with error
  // feedback (within +-15%).
  static constexpr double region_slack = 1.25;
  static constexpr double first_region_slack = 1.5;
  static constexpr std::size_t region_blocks = 4;
  // When the output already has room for this much more than the expected count, regions
  // share that room instead of growing it, so a count creeping up does not reallocate.
  static constexpr double region_room_enough = 1.1;
};

}  // namespace sidco::backend::cpu_detail
