// backend::cpu's tuning values, in one place, each with where it came from.
#pragma once

#include <cstddef>

#include "sidco/backend/host/cache_line.hpp"

namespace sidco::backend::cpu_detail {

struct tuning {
  // Below this many values per thread, starting threads costs more than they save: on the
  // 2-vCPU reference VM a pass over 2^15 floats takes ~10 us, about an OpenMP fork-join.
  static constexpr std::size_t min_per_thread = std::size_t(1) << 15;
  // Thread ranges end on multiples of this many values, so that no two threads write the
  // same cache line of a residual (64 values covers 64-byte lines for double too).
  static constexpr std::size_t range_alignment = 64;
  // Values per moments block: summed in lanes while the block is in L1 (4 KB of floats),
  // then added into the unit's moments. The sums of ln|x| run in T's accumulator lanes:
  // longer blocks lose float precision there (the oracle test's 2e-6 relative tolerance
  // holds at 1024 with a margin); shorter ones spend more time gathering.
  static constexpr std::size_t moments_block = 1024;
  // A moments block does every vector's tail work when at least 1/scattered_tails of the
  // last block's vectors (and not all) held a value above a probe; below, it skips the
  // vectors above none. At 2^25 i.i.d. Laplace values and delta = 0.01 (38% of AVX-512
  // vectors above the probe) the skip's mispredicted branch took 1.7x the time of doing the
  // work; at 0.001 (6%), 1.05-1.09x. Where the values above cluster (layers of distinct
  // scales, hot rows) the skip is predicted, and doing every vector's work cost 2-8% more.
  static constexpr std::size_t scattered_tails = 32;
  // Values per moments unit: each unit of a segment is summed alone and the units folded in
  // order, so that sums do not depend on thread ranges. Large enough that a unit's partial
  // (64 bytes per statistic) is noise next to its data (256 KB of floats), small enough
  // that ranges of 2^15+ values split into units evenly.
  static constexpr std::size_t moments_unit = std::size_t(1) << 16;
  // Items a thread takes at a time when items are shared out as threads free up (one small
  // layer's estimate: about a microsecond): enough that taking them costs little next to
  // running them, few enough that the threads end together.
  static constexpr std::size_t items_per_grab = 8;
  // Values per block of the portable selection loop: one max-reduction decides whether a
  // block holds anything to keep (at 0.1% density most blocks do not). At 16, GCC unrolls
  // the block's loops whole and then vectorizes none of them: 5x slower at 2^23 floats
  // with feedback (-O3 native; 1.3x at -O2 x86-64); 32 beat 64 at densities of 1-10%.
  static constexpr std::size_t select_block = 32;
  // Values per block of keys in the coarse histogram: the keys (and 16-bit conversions)
  // of a block vectorize, the counting after them cannot. At 2^23 with feedback, one
  // thread: 1.6x faster than value by value for float, 7x for float16; 64 was up to 13%
  // slower.
  static constexpr std::size_t key_block = 128;
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
  // A region's write cursor sits on its own cache line: when two threads' cursors shared one,
  // per-layer selections, which write a few values every layer on both threads at once,
  // took 1.6x the time.
  static constexpr std::size_t own_line = host::own_cache_line;
};

}  // namespace sidco::backend::cpu_detail
