// A fixed capacity per tensor for one-round exchanges: every rank sends the same number of
// bytes, whatever it selected, so that one all-gather of equal sizes carries everything.
// A selection over its capacity is trimmed to its largest entries, and what is trimmed goes
// back into the error-feedback residual.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <span>
#include <vector>

#include "sidco/backend/host/keep_top_k.hpp"
#include "sidco/core/checks.hpp"
#include "sidco/core/error.hpp"
#include "sidco/core/segment.hpp"
#include "sidco/core/sparse_vector.hpp"

namespace sidco::comm {

/// The most entries each segment may send, and their sum.
struct capacity_plan {
  std::vector<std::size_t> per_segment;
  std::size_t total = 0;
};

/// slack must lie in [1, 1000]: the capacity is never below the count a method aims at.
inline void check_slack(double slack) {
  if (!(slack >= 1 && slack <= 1000)) sidco::detail::fail("capacity slack = ", slack, " is outside [1, 1000]");
}

inline void check_trim_limit(double limit) {
  if (!(limit >= 0 && limit <= 1)) sidco::detail::fail("exchange_options::trim_limit = ", limit, " is outside [0, 1]");
}

/// exchange_options::trim_limit: fails (sidco::error, which the exchange sends every rank)
/// when this rank trimmed more than limit of the entries it handed the exchange for want of
/// capacity, so that a rank compressing far above the agreed density is told, not cut
/// silently. A limit of 1 never fails.
inline void check_trimmed(std::size_t trimmed, std::size_t handed, double limit, double delta) {
  if (limit >= 1 || double(trimmed) <= limit * double(handed)) return;
  sidco::detail::fail("exchange: ", trimmed, " of the ", handed, " entries this rank sent (",
                      std::round(1000.0 * double(trimmed) / double(handed)) / 10.0,
                      "%) exceed the capacity, over exchange_options::trim_limit ", limit,
                      ": compress at the exchange's density ", delta, ", or raise exchange_options::slack");
}

/// Segment s may send ceil(slack k_s) entries, k_s = max(1, floor(delta n_s)) (the count its
/// estimate aims at), and never more than its n_s values. Per segment rather than per
/// buffer, so that a tensor's capacity and trimming do not depend on which tensors share
/// its buffer.
inline capacity_plan plan_capacity(std::span<const segment> layout, double delta, double slack) {
  check::density(delta);
  check_slack(slack);
  check::layout(layout);
  capacity_plan plan;
  plan.per_segment.reserve(layout.size());
  for (const segment& s : layout) {
    const double wanted = std::ceil(slack * double(target_count(delta, s.size)));
    const std::size_t cap = wanted >= double(s.size) ? s.size : std::size_t(wanted);
    plan.per_segment.push_back(cap);
    plan.total += cap;
  }
  return plan;
}

/// How many of out's entries (ascending indices, base + local position) fall in each
/// segment of layout.
template <class T, class Index>
void count_per_segment(const sparse_vector<T, Index>& out, std::span<const segment> layout, std::size_t base,
                       std::span<std::size_t> counts) {
  const auto indices = out.indices();
  auto from = indices.begin();
  for (std::size_t s = 0; s < layout.size(); ++s) {
    const std::size_t end = base + layout[s].end();
    const auto to = std::lower_bound(from, indices.end(), end, [](Index i, std::size_t e) { return std::size_t(i) < e; });
    counts[s] = std::size_t(to - from);
    from = to;
  }
}

/// Trims each segment's entries in out to at most plan.per_segment[s]: its largest
/// magnitudes, ties to the lower index, in index order. Each entry it removes goes to
/// sink.give_back(index, value) (comm/residual_sink.hpp: the compressor left +0 there when
/// it sent it), so nothing is lost. Returns how many it removed. out's indices must be
/// ascending and inside the layout.
template <class T, class Index, class Sink>
std::size_t trim_to_capacity(sparse_vector<T, Index>& out, std::span<const segment> layout,
                             const capacity_plan& plan, Sink& sink) {
  if (out.size() <= plan.total && layout.size() == 1) return 0;  // the common case: nothing to trim
  std::vector<std::size_t> counts(layout.size());
  count_per_segment(out, layout, 0, counts);
  Index* indices = out.index_data();
  T* values = out.value_data();
  std::size_t read = 0, write = 0, removed = 0;
  for (std::size_t s = 0; s < layout.size(); ++s) {
    const std::size_t n = counts[s];
    if (write != read) {
      std::move(indices + read, indices + read + n, indices + write);
      std::move(values + read, values + read + n, values + write);
    }
    std::size_t kept = n;
    if (n > plan.per_segment[s]) {
      kept = backend::host::keep_top_k(indices + write, values + write, n, plan.per_segment[s],
                                       [&](Index i, T v) { sink.give_back(i, v); });
      removed += n - kept;
    }
    read += n;
    write += kept;
  }
  out.truncate(write);
  return removed;
}

}  // namespace sidco::comm
