// backend::cuda's launch shapes in one struct, so that a build for another architecture (or
// a tuned one) passes its own to basic_cuda instead of editing the kernels. Every kernel
// takes it as its first template parameter.
#pragma once

#include <algorithm>
#include <cstddef>

namespace sidco::backend::cuda_detail {

/// The shapes the kernels were written for (sm_80 / sm_90 class GPUs; not yet tuned on one:
/// no GPU has been available).
struct default_tuning {
  /// Threads per block of every kernel.
  static constexpr int block_threads = 256;
  /// Values a thread handles per step of a selection's write pass (4 floats: 16 bytes, one
  /// cache line a warp).
  static constexpr int write_items = 4;
  /// Values per piece of the layout, a thread block's share of a pass: 64 a thread.
  static constexpr std::size_t tile = std::size_t(block_threads) * 64;
  /// Most blocks a grid-stride kernel launches.
  static constexpr std::size_t max_grid = 4096;
  /// Random-k draws k indices on the device from this k on (when by redraws): below, the
  /// host's draw and sort (tens of microseconds) cost less than the device's wait a round.
  static constexpr std::size_t device_draw_from = 4096;
};

/// Blocks for a grid-stride kernel over n items, per_block items a block per step (default:
/// one a thread), at most max_grid.
template <class Tuning>
unsigned grid(std::size_t n, std::size_t per_block = std::size_t(Tuning::block_threads)) {
  const std::size_t blocks = (n + per_block - 1) / per_block;
  return unsigned(std::clamp<std::size_t>(blocks, 1, Tuning::max_grid));
}

}  // namespace sidco::backend::cuda_detail
