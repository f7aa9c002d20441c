// The reduce-scatter exchange's steps as functions over host bytes, whatever carries them
// (no MPI, NCCL or torch here; reduce/core.hpp strings them together):
//
//   1. pack_blocks (each sender): its selection split by owner (comm/ownership.hpp) into P
//      blocks of capacity c (what does not fit, the smallest, goes back into its residual);
//   2. select_owned (each owner): the P blocks it received added in rank order and its
//      share of the global target kept by the owner policy; the selection payload
//      holds each kept index's update (comm/sum.hpp's rule: the average, or the sum);
//   3. read_selections (every rank): every owner's selection is the global selection and
//      its update; what a rank sent that no owner kept goes back into its residual.
//
// A problem travels instead of entries: a rank's failure in its blocks, an owner's finding
// (or a rank's own failure after round 1) in its selection, so that every rank raises the
// same error after round 2.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <span>
#include <utility>
#include <vector>

#include "sidco/backend/host/keep_top_k.hpp"
#include "sidco/comm/agree.hpp"
#include "sidco/comm/owner.hpp"
#include "sidco/comm/ownership.hpp"
#include "sidco/comm/reduce/plan.hpp"
#include "sidco/comm/residual_sink.hpp"
#include "sidco/comm/sum.hpp"
#include "sidco/comm/wire.hpp"
#include "sidco/core/error.hpp"
#include "sidco/core/float_traits.hpp"
#include "sidco/core/sparse_vector.hpp"

namespace sidco::comm {

/// Round 1 on the sender: splits sent (ascending, dense size plan.size) by owner (owner_of)
/// into plan.ranks blocks of plan.format, each trimmed to its largest plan.capacity entries
/// (what it removes goes to sink; sent keeps what the blocks hold, ascending), and packs
/// block j into blocks[j * format.bytes(), ...). Returns how many entries it trimmed.
template <class T, class Index, class Sink>
std::size_t pack_blocks(sparse_vector<T, Index>& sent, const reduce_plan& plan, const wire_fields& fields, Sink& sink,
                        std::span<std::byte> blocks) {
  const std::size_t bytes = plan.format.bytes();
  if (blocks.size() != bytes * plan.ranks)
    sidco::detail::fail("reduce-scatter exchange: blocks: ", blocks.size(), " bytes, the plan takes ", bytes * plan.ranks);
  if (sent.dense_size() != plan.size)
    sidco::detail::fail("reduce-scatter exchange: the sparse vector's dense size ", sent.dense_size(), " is not ", plan.size);
  const Index* index = sent.index_data();
  const T* value = sent.value_data();
  const std::size_t count = sent.size();
  // A stable counting sort by owner: each block's entries stay ascending.
  std::vector<std::uint32_t> owner(count);
  std::vector<std::size_t> runs(plan.ranks + 1, 0);  // block j: [runs[j], runs[j + 1])
  for (std::size_t e = 0; e < count; ++e) {
    owner[e] = std::uint32_t(owner_of(std::uint64_t(index[e]), plan.ranks));
    ++runs[owner[e] + 1];
  }
  for (std::size_t j = 0; j < plan.ranks; ++j) runs[j + 1] += runs[j];
  std::vector<Index> by_owner(count);
  std::vector<T> values(count);
  {
    std::vector<std::size_t> at(runs.begin(), runs.end() - 1);
    for (std::size_t e = 0; e < count; ++e) {
      const std::size_t to = at[owner[e]]++;
      by_owner[to] = index[e];
      values[to] = value[e];
    }
  }
  std::size_t trimmed = 0;
  std::vector<Index> removed;  // ascending once sorted: what sent no longer holds
  std::vector<std::size_t> kept(plan.ranks);
  for (std::size_t j = 0; j < plan.ranks; ++j) {
    const std::size_t n = runs[j + 1] - runs[j];
    kept[j] = n;
    if (n <= plan.capacity) continue;
    kept[j] = backend::host::keep_top_k(by_owner.data() + runs[j], values.data() + runs[j], n, plan.capacity,
                                        [&](Index i, T v) {
                                          sink.give_back(i, v);
                                          removed.push_back(i);
                                        });
    trimmed += n - kept[j];
  }
  for (std::size_t j = 0; j < plan.ranks; ++j)
    pack<T, Index>(std::span<const Index>(by_owner.data() + runs[j], kept[j]),
                   std::span<const T>(values.data() + runs[j], kept[j]), plan.size, trimmed, fields, plan.format,
                   blocks.subspan(j * bytes, bytes));
  if (!removed.empty()) {
    std::sort(removed.begin(), removed.end());
    Index* keep_index = sent.index_data();
    T* keep_value = sent.value_data();
    std::size_t write = 0;
    auto next_removed = removed.begin();
    for (std::size_t e = 0; e < count; ++e) {
      if (next_removed != removed.end() && *next_removed == keep_index[e]) {
        ++next_removed;
        continue;
      }
      keep_index[write] = keep_index[e];
      keep_value[write] = keep_value[e];
      ++write;
    }
    sent.truncate(write);
  }
  return trimmed;
}

/// A failure on this rank, in every block (every owner relays it, so every rank raises it).
template <class T, class Index>
void pack_failed_blocks(const std::exception& reason, const reduce_plan& plan, const wire_fields& fields,
                        std::span<std::byte> blocks) {
  const std::size_t bytes = plan.format.bytes();
  for (std::size_t j = 0; j < plan.ranks; ++j)
    pack_failure<T, Index>(reason, plan.size, fields, plan.format, blocks.subspan(j * bytes, bytes));
}

namespace detail {

/// What sum_runs and merge_disjoint_runs emit, written to two arrays in order (held by value
/// in the walk, so that its pointers and count stay in registers).
template <class Index, class V>
struct entry_writer {
  Index* index_out;
  V* value_out;
  std::size_t count;
  void operator()(std::uint64_t index, V value) {
    index_out[count] = Index(index);
    value_out[count] = value;
    ++count;
  }
};

/// Throws unless every index of an ok payload is owned by `owner` among ranks.
template <class Index>
void check_owned(std::span<const std::byte> payload, const wire_format& format, std::size_t owner, std::size_t ranks,
                 const char* whose, std::size_t rank) {
  const wire_header h = read_header(payload);
  if (h.status != std::uint8_t(wire_status::ok)) return;
  const std::byte* indices = payload.data() + format.indices_offset();
  for (std::size_t e = 0; e < std::size_t(h.count); ++e) {
    const std::uint64_t index = index_at<Index>(indices + e * sizeof(Index));
    if (owner_of(index, ranks) != owner)
      disagree(h, whose, " ", rank, " sent index ", index, ", owned by rank ", owner_of(index, ranks), ", not ", owner);
  }
}

}  // namespace detail

/// An owner's buffers, kept from step to step so that a steady owner allocates nothing: its
/// reduced sums, the indices whose sum overflowed (their entry holds the average with each
/// value divided first), the kept entries' updates.
template <class T, class Index>
struct owner_scratch {
  owner_workspace<typename float_traits<T>::accumulator, Index> reduced;
  std::vector<Index> overflowed;
  std::vector<T> updates;
};

/// Round 2 on owner `me`: checks the blocks it received (one per rank, in rank order; every
/// check of agree() plus ownership), adds them in rank order (comm/sum.hpp) and keeps its
/// share of the global target, received / P entries (rounded by a threshold that differs
/// between owners and steps, so that the shares add up; at most the capacity), chosen by
/// policy on the sums (what a policy keeps beyond the share, the smallest, is left out), and
/// packs each kept index's update (the one rule: the average, or the sum, rounded once to T)
/// into its selection payload. A problem in the blocks is relayed in the payload instead,
/// for every rank to raise.
template <class T, class Index, class Policy>
void select_owned(payload_views blocks, std::size_t me, const reduce_plan& plan,
                   const wire_fields& fields, Policy& policy, std::span<std::byte> selection, reduce_report& report,
                   owner_scratch<T, Index>& scratch) {
  using A = typename float_traits<T>::accumulator;
  try {
    if (blocks.size() != plan.ranks)
      sidco::detail::fail("reduce-scatter exchange: ", blocks.size(), " blocks received, ", plan.ranks, " ranks");
    agree<T, Index>(blocks, plan.format);
    std::vector<entry_run<T, Index>> runs(blocks.size());
    std::size_t received = 0;
    for (std::size_t r = 0; r < blocks.size(); ++r) {
      detail::check_owned<Index>(blocks[r], plan.format, me, plan.ranks, "rank", r);
      const std::size_t count = std::size_t(detail::read_header(blocks[r]).count);
      runs[r] = {blocks[r].data() + plan.format.indices_offset(), blocks[r].data() + plan.format.values_offset(count),
                 count};
      received += runs[r].count;
    }
    const sum_rule rule{reduction(fields.op), plan.ranks};
    auto& reduced = scratch.reduced;
    reduced.reserve(received);  // the union is at most what was received
    scratch.overflowed.clear();
    // Each index's sum into the workspace; a sum that overflows is handled out of line.
    const auto written =
        sum_runs<T, Index>(runs, 0, plan.size, detail::entry_writer<Index, A>{reduced.indices(), reduced.values(), 0});
    const std::size_t emitted = written.count;
    // Finite values whose sum overflows: an average divides each first; a sum cannot be sent.
    A* const sums = reduced.values();
    if (!all_finite(sums, emitted))
      for (std::size_t j = 0; j < emitted; ++j) {
        A& sum = sums[j];
        if (std::isfinite(double(sum))) continue;
        const std::uint64_t index = reduced.indices()[j];
        if (rule.op != reduction::average) combine<T>(sum, rule, index, [] { return A(0); });  // throws
        sum = sum_divided_first<T, Index>(runs, index, plan.ranks);
        scratch.overflowed.push_back(Index(index));
      }
    reduced.set_size(emitted);
    const std::size_t union_size = emitted;
    // received / P, rounded up or down by a threshold that differs between owners and moves
    // with the step, so that the owners' shares add up to about the ranks' average count
    // (rounding up overshot k by 17% at 1,024 ranks, where a share is 2 or 3 entries).
    const double exact = double(received) / double(plan.ranks);
    const double threshold =
        std::fmod((double(me) + 0.5) / double(plan.ranks) + 0.6180339887498949 * double(fields.sequence % 1000003), 1.0);
    const std::size_t share =
        std::min(plan.capacity, std::size_t(exact) + (exact - std::floor(exact) > threshold ? 1 : 0));
    std::size_t kept = union_size;
    if (share == 0) kept = 0;
    else if (union_size > share) kept = policy.template select<A, Index>(reduced.indices(), reduced.values(), union_size, share);
    // At most the share, whatever the policy: a selection then never holds more entries than
    // the longest block any rank sent (share <= received / P rounded), which transports that
    // send heads rely on.
    if (kept > share) kept = backend::host::keep_top_k(reduced.indices(), reduced.values(), kept, share);
    reduced.set_size(kept);
    // Each kept index's update (comm/sum.hpp's rule); an overflowed one's entry holds its
    // divided-first average already: that value rounded is its update.
    scratch.updates.resize(kept);
    combine_finite<T, Index>(reduced.values(), reduced.indices(), kept, rule, scratch.updates.data());
    for (const Index index : scratch.overflowed) {
      const Index* at = std::lower_bound(reduced.indices(), reduced.indices() + kept, index);
      if (at == reduced.indices() + kept || *at != index) continue;  // not kept
      const std::size_t j = std::size_t(at - reduced.indices());
      scratch.updates[j] = combine<T>(reduced.values()[j], sum_rule{reduction::sum, 1}, index, [] { return A(0); });
    }
    report.received = received;
    // The header's trimmed field carries what the owner left out of its union.
    pack<T, Index>(std::as_const(reduced).indices(), std::span<const T>(scratch.updates), plan.size, union_size - kept,
                   fields, plan.format, selection);
  } catch (const runtime_error& e) {
    pack_failure<T, Index>(e, plan.size, fields, plan.format, selection, wire_status::relayed);
  } catch (const std::exception& e) {
    pack_failure<T, Index>(e, plan.size, fields, plan.format, selection);
  }
}

/// Every owner's selection agrees (agree()) and holds indices it owns only. Throws the same
/// sidco::runtime_error on every rank otherwise.
template <class T, class Index>
void check_selections(payload_views selections, const reduce_plan& plan) {
  if (selections.size() != plan.ranks)
    sidco::detail::fail("reduce-scatter exchange: ", selections.size(), " selections received, ", plan.ranks, " ranks");
  agree<T, Index>(selections, plan.format);
  for (std::size_t j = 0; j < selections.size(); ++j)
    detail::check_owned<Index>(selections[j], plan.format, j, plan.ranks, "owner", j);
}

/// Round 3 on every rank, after check_selections: global = the global selection's indices,
/// ascending (every owner's, merged: owners hold disjoint sets), and updates = each one's
/// update as its owner sent it (the same bits on every rank); the report's selected and
/// union counts.
template <class T, class Index>
void read_selections(payload_views selections, const reduce_plan& plan, std::vector<Index>& global,
                     std::vector<T>& updates, reduce_report& report) {
  report.selected = report.union_size = 0;
  std::vector<entry_run<T, Index>> runs;
  runs.reserve(selections.size());
  for (const auto& s : selections) {
    const wire_header h = detail::read_header(s);
    const std::size_t count = std::size_t(h.count);
    report.selected += count;
    report.union_size += count + std::size_t(h.trimmed);
    runs.push_back({s.data() + plan.format.indices_offset(), s.data() + plan.format.values_offset(count), count});
  }
  global.resize(report.selected);
  updates.resize(report.selected);
  merge_disjoint_runs<T, Index>(std::span<const entry_run<T, Index>>(runs), 0, plan.size,
                                detail::entry_writer<Index, T>{global.data(), updates.data(), 0});
}

}  // namespace sidco::comm
