// backend::cuda's launch shapes in one struct, so that a build for another architecture (or
// a tuned one) passes its own to basic_cuda instead of editing the kernels. Every kernel
// takes it as its first template parameter. Grids and tiles follow from it, the input's size
// and the GPU's multiprocessor count (the workspace reads it once).
#pragma once

#include <algorithm>
#include <cstddef>

namespace sidco::backend::cuda_detail {

/// The shapes the kernels were written for (sm_80 / sm_90 class GPUs). Measured on one H200
/// (docs/RESULTS.md, CUDA): 16 loads in flight a thread made SIDCo-E 11% and Top-k 4% faster at
/// 2^26 values than 4; fewer blocks a multiprocessor or a wider write step, slower; the
/// striped write, SIDCo-E 12% and Top-k 9% faster than the blocked one.
struct default_tuning {
  /// Threads per block of every kernel.
  static constexpr int block_threads = 256;
  /// A selection's write pass loads load_items coalesced rows a step and ranks the kept
  /// values by warp ballots (false: write_items consecutive values a thread a step, ranked
  /// by a block scan).
  static constexpr bool striped_write = true;
  /// Rows a striped write step loads where it settles error feedback (else load_items): on
  /// an H200, 4 ran as fast as the blocked write, 8 and 16 were 7% and 19% slower at 2^26.
  static constexpr int stateful_write_rows = 4;
  /// The radix walks' digit each round chosen by the whole block (a scan of the 256 bins)
  /// instead of one thread reading them one after another: compiled, not yet measured on a
  /// GPU, so off by default (the `@parallel-choice` benchmark rows).
  static constexpr bool parallel_digit_choice = false;
  /// The coarse histogram's lowest bin (exact zeros: 30-50% of some gradients) counted in a
  /// register a thread and added once, instead of an atomic on one shared counter a zero:
  /// compiled, not yet measured on a GPU, so off by default (the `@zero-bin` benchmark rows).
  static constexpr bool zero_bin_in_registers = false;
  /// select_above with a hint (every selection's but a band's) in one pass: each piece
  /// writes into its own region of a scratch sized from the hint and the regions are moved
  /// into place, instead of a count pass, a scan, then the write (one read of the values
  /// instead of two; the regions take 1.5 entries an expected one). Compiled, not yet run
  /// on a GPU, so off by default (the `@one-pass` benchmark rows).
  static constexpr bool one_pass_select = false;
  /// Blocks a multiprocessor the moments pass (analyze_pieces) must fit: its launch bounds'
  /// second argument, capping its registers (nvcc 13 for sm_90 gives it 44 a thread, 5
  /// blocks of 256 a multiprocessor, and 80 with a probe's tail, 3, where blocks_per_sm aims
  /// at 8; at 4 blocks, 64, the probe's variant spilling 48 bytes). 0: none, the compiler's choice
  /// (the same cubin as without the argument; 1 is not: ptxas then took 86 and 128); not yet
  /// measured on a GPU (the `@analyze-4-blocks` benchmark rows).
  static constexpr int analyze_min_blocks = 0;
  /// Values a thread handles per step of a blocked write pass (4 floats: 16 bytes, one
  /// cache line a warp) and the sizing of Top-k's histogram chunks.
  static constexpr int write_items = 4;
  /// Independent loads a thread has in flight in a streaming pass (moments, counts,
  /// histograms): each a warp-wide coalesced stripe, issued before any is used.
  static constexpr int load_items = 16;
  /// Resident blocks aimed at per multiprocessor: grid-stride kernels launch at most this
  /// many a multiprocessor, and a pass's pieces are sized so that about as many cover N.
  static constexpr int blocks_per_sm = 8;
  /// Smallest piece of the layout (a thread block's share of a pass): 8 values a thread.
  /// Pieces double from here until the layout needs at most blocks_per_sm a multiprocessor.
  static constexpr std::size_t min_tile = std::size_t(block_threads) * 8;
  /// Most blocks a grid-stride kernel launches, whatever the multiprocessor count.
  static constexpr std::size_t max_grid = 4096;
  /// Random-k draws k indices on the device from this k on (when by redraws): below, the
  /// host's draw and sort (tens of microseconds) cost less than the device's wait a round.
  static constexpr std::size_t device_draw_from = 4096;
};

/// Blocks for a grid-stride kernel over n items, per_block items a block per step, at most
/// cap (at least one).
inline unsigned grid_for(std::size_t n, std::size_t per_block, std::size_t cap) {
  const std::size_t blocks = (n + per_block - 1) / per_block;
  return unsigned(std::clamp<std::size_t>(blocks, 1, std::max<std::size_t>(cap, 1)));
}

/// Blocks for a grid-stride kernel over n items with no multiprocessor count at hand (one
/// item a thread per step by default), at most max_grid.
template <class Tuning>
unsigned grid(std::size_t n, std::size_t per_block = std::size_t(Tuning::block_threads)) {
  return grid_for(n, per_block, Tuning::max_grid);
}

/// The piece size for total values on multiprocessors: min_tile doubled until at most
/// blocks_per_sm pieces a multiprocessor cover total (and below 2^31, as piece sizes are
/// 32-bit). A power-of-two multiple, so that nearby totals share a plan.
template <class Tuning>
constexpr std::size_t tile_for(std::size_t total, std::size_t multiprocessors) {
  const std::size_t target = std::max<std::size_t>(multiprocessors, 1) * std::size_t(Tuning::blocks_per_sm);
  constexpr std::size_t largest = std::size_t(1) << 30;
  std::size_t tile = Tuning::min_tile;
  while (tile < largest && total / tile + (total % tile != 0) > target) tile *= 2;
  return tile;
}

}  // namespace sidco::backend::cuda_detail
