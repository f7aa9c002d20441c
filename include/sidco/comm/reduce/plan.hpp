// The reduce-scatter exchange's sizes, agreed at setup (every rank computes the same plan
// from the same layout, density, slack and rank count), and what one step did.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <span>

#include "sidco/comm/capacity.hpp"
#include "sidco/comm/wire.hpp"
#include "sidco/core/checks.hpp"
#include "sidco/core/error.hpp"
#include "sidco/core/segment.hpp"

namespace sidco::comm {

/// Sizes of one tensor's (or one buffer's) reduce-scatter exchange among P ranks.
struct reduce_plan {
  std::size_t size = 0;      // N
  std::size_t ranks = 1;     // P
  std::size_t target = 0;    // k: the global selection's aim, sum of the layout's counts
  std::size_t capacity = 0;  // c: entries per block and per owner's selection
  wire_format format;        // of every block and selection
};

/// The plan for a layout at delta among ranks: k = sum of max(1, floor(delta n_s)) over the
/// layout (the count the local compressors aim at), c = ceil(slack k / P), at least 1, and
/// at least as many entries as a block's room for an error message holds anyway (a block is
/// never smaller than that): at many ranks, where k / P is a few entries, blocks then take
/// what a rank's selection happens to put there instead of trimming it (0.90 of k applied at
/// 1,024 ranks with c = 4), for no byte more. Never more than the dense size.
template <class T, class Index>
reduce_plan plan_reduce(std::span<const segment> layout, double delta, double slack, std::size_t ranks) {
  check::density(delta);
  check_slack(slack);
  const std::size_t size = check::layout(layout);
  if (ranks == 0) sidco::detail::fail("reduce-scatter exchange: ranks = 0");
  reduce_plan plan;
  plan.size = size;
  plan.ranks = ranks;
  for (const segment& s : layout) plan.target += target_count(delta, s.size);
  const double wanted = std::ceil(slack * double(plan.target) / double(ranks));
  std::size_t capacity = std::max<std::size_t>(1, wanted >= double(size) ? size : std::size_t(wanted));
  const std::size_t smallest = format_for<T, Index>(1).bytes();
  while (capacity < size && format_for<T, Index>(capacity + 1).bytes() <= smallest) ++capacity;
  plan.capacity = capacity;
  plan.format = format_for<T, Index>(plan.capacity);
  return plan;
}

/// What one step of the exchange did, on this rank.
struct reduce_report {
  std::size_t sent = 0;        // entries this rank put in its blocks
  std::size_t trimmed = 0;     // over a block's capacity: back into this rank's residual
  std::size_t returned = 0;    // sent, left out of the global selection (or the step failed): back into the residual
  std::size_t received = 0;    // entries in the blocks this rank's region received
  std::size_t union_size = 0;  // distinct indices over every owner (sum of their unions)
  std::size_t selected = 0;    // the global selection's entries (every owner's)
  std::size_t longest_block = 0;    // bytes the longest of this rank's blocks uses (comm/wire.hpp's used_bytes)
  std::size_t selection_bytes = 0;  // bytes this owner's selection uses
  std::size_t bytes_sent = 0;  // payload bytes this rank put on the wire (P - 1 blocks and its selection P - 1 times)
  std::size_t bytes_received = 0;
  std::size_t target = 0;      // k
  int ranks = 0;
};

}  // namespace sidco::comm
