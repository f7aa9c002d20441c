// The reduce-scatter exchange's steps as functions over host bytes, whatever carries them
// (no MPI, NCCL or torch here; reduce/core.hpp strings them together):
//
//   1. pack_blocks (each sender): its selection split by region into P blocks of capacity c
//      (what does not fit, the smallest, goes back into its residual);
//   2. select_region (each owner): the P blocks it received added in rank order and its
//      region's share of the global target kept by the owner policy; the selection payload
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
#include <exception>
#include <span>
#include <utility>
#include <vector>

#include "sidco/backend/host/keep_top_k.hpp"
#include "sidco/comm/agree.hpp"
#include "sidco/comm/owner.hpp"
#include "sidco/comm/reduce/plan.hpp"
#include "sidco/comm/regions.hpp"
#include "sidco/comm/residual_sink.hpp"
#include "sidco/comm/sum.hpp"
#include "sidco/comm/wire.hpp"
#include "sidco/core/error.hpp"
#include "sidco/core/float_traits.hpp"
#include "sidco/core/sparse_vector.hpp"

namespace sidco::comm {

/// Round 1 on the sender: splits sent (ascending, dense size plan.size) by region into
/// plan.ranks blocks of plan.format, each trimmed to its largest plan.capacity entries
/// (what it removes goes to sink; sent keeps what the blocks hold), and packs block j into
/// blocks[j * format.bytes(), ...). Returns how many entries it trimmed.
template <class T, class Index, class Sink>
std::size_t pack_blocks(sparse_vector<T, Index>& sent, const regions& owners, const reduce_plan& plan,
                        const wire_fields& fields, Sink& sink, std::span<std::byte> blocks) {
  const std::size_t bytes = plan.format.bytes();
  if (blocks.size() != bytes * plan.ranks)
    sidco::detail::fail("reduce-scatter exchange: blocks: ", blocks.size(), " bytes, the plan takes ", bytes * plan.ranks);
  if (owners.owners() != plan.ranks || owners.size() != plan.size)
    sidco::detail::fail("reduce-scatter exchange: ", owners.owners(), " regions over ", owners.size(), " values, the plan has ",
                        plan.ranks, " ranks and ", plan.size, " values");
  if (sent.dense_size() != plan.size)
    sidco::detail::fail("reduce-scatter exchange: the sparse vector's dense size ", sent.dense_size(), " is not ", plan.size);
  // Region by region (regions may be empty): each run of sent trimmed to the capacity in
  // place, then packed as that owner's block.
  Index* index = sent.index_data();
  T* value = sent.value_data();
  const std::size_t count = sent.size();
  std::vector<std::size_t> runs(plan.ranks + 1, 0);  // block j: [runs[j], runs[j + 1]) after compaction
  std::size_t read = 0, write = 0, trimmed = 0;
  for (std::size_t j = 0; j < plan.ranks; ++j) {
    std::size_t n = 0;
    while (read + n < count && std::size_t(index[read + n]) < owners.end(j)) ++n;
    if (write != read) {
      std::move(index + read, index + read + n, index + write);
      std::move(value + read, value + read + n, value + write);
    }
    std::size_t kept = n;
    if (n > plan.capacity) {
      kept = backend::host::keep_top_k(index + write, value + write, n, plan.capacity,
                                       [&](Index i, T v) { sink.give_back(i, v); });
      trimmed += n - kept;
    }
    read += n;
    write += kept;
    runs[j + 1] = write;
  }
  sent.truncate(write);
  for (std::size_t j = 0; j < plan.ranks; ++j)
    pack<T, Index>(std::span<const Index>(index + runs[j], runs[j + 1] - runs[j]),
                   std::span<const T>(value + runs[j], runs[j + 1] - runs[j]), plan.size, trimmed, fields, plan.format,
                   blocks.subspan(j * bytes, bytes));
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

/// Throws unless every index of an ok payload lies in [begin, end).
template <class Index>
void check_region(std::span<const std::byte> payload, const wire_format& format, std::size_t begin, std::size_t end,
                  const char* whose, std::size_t rank) {
  const wire_header h = read_header(payload);
  if (h.status != std::uint8_t(wire_status::ok) || h.count == 0) return;
  // Ascending indices (agree checked): the first and the last bound the rest.
  const std::byte* indices = payload.data() + format.indices_offset();
  const std::uint64_t first = index_at<Index>(indices), last = index_at<Index>(indices + (h.count - 1) * sizeof(Index));
  if (first < begin || last >= end)
    disagree(h, whose, " ", rank, " sent index ", first < begin ? first : last, ", outside its region [", begin, ", ",
             end, ")");
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
/// check of agree() plus the region), adds them in rank order (comm/sum.hpp) and keeps the
/// region's share of the global target, ceil(received / P) entries (at most the capacity),
/// chosen by policy on the sums, and packs each kept index's update (the one rule: the
/// average, or the sum, rounded once to T) into its selection payload. A problem in the
/// blocks is relayed in the payload instead, for every rank to raise.
template <class T, class Index, class Policy>
void select_region(payload_views blocks, const regions& owners, std::size_t me, const reduce_plan& plan,
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
      detail::check_region<Index>(blocks[r], plan.format, owners.begin(me), owners.end(me), "rank", r);
      runs[r] = {blocks[r].data() + plan.format.indices_offset(), blocks[r].data() + plan.format.values_offset(),
                 std::size_t(detail::read_header(blocks[r]).count)};
      received += runs[r].count;
    }
    const sum_rule rule{reduction(fields.op), plan.ranks};
    auto& reduced = scratch.reduced;
    reduced.reserve(received);  // the union is at most what was received
    scratch.overflowed.clear();
    // Each index's sum into the workspace; a sum that overflows is handled out of line.
    struct into_workspace {
      Index* index_out;
      A* sum_out;
      std::size_t count;
      void operator()(std::uint64_t index, A sum) {
        index_out[count] = Index(index);
        sum_out[count] = sum;
        ++count;
      }
    };
    const auto written = sum_runs<T, Index>(runs, owners.begin(me), owners.end(me),
                                            into_workspace{reduced.indices(), reduced.values(), 0});
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
    const std::size_t share = std::min(plan.capacity, (received + plan.ranks - 1) / plan.ranks);
    std::size_t kept = union_size;
    if (union_size > share) kept = policy.template select<A, Index>(reduced.indices(), reduced.values(), union_size, share);
    if (kept > plan.capacity) kept = backend::host::keep_top_k(reduced.indices(), reduced.values(), kept, plan.capacity);
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

/// Every owner's selection agrees (agree()) and holds indices of its own region only.
/// Throws the same sidco::runtime_error on every rank otherwise.
template <class T, class Index>
void check_selections(payload_views selections, const regions& owners, const reduce_plan& plan) {
  if (selections.size() != plan.ranks)
    sidco::detail::fail("reduce-scatter exchange: ", selections.size(), " selections received, ", plan.ranks, " ranks");
  agree<T, Index>(selections, plan.format);
  for (std::size_t j = 0; j < selections.size(); ++j)
    detail::check_region<Index>(selections[j], plan.format, owners.begin(j), owners.end(j), "owner", j);
}

/// Round 3 on every rank, after check_selections: global = the global selection's indices
/// (ascending: owners' regions ascend) and updates = each one's update, as the owners sent
/// them (the same bits on every rank); the report's selected and union counts.
template <class T, class Index>
void read_selections(payload_views selections, const wire_format& format, std::vector<Index>& global,
                     std::vector<T>& updates, reduce_report& report) {
  global.clear();
  updates.clear();
  report.selected = report.union_size = 0;
  for (const auto& s : selections) {
    const wire_header h = detail::read_header(s);
    const std::size_t count = std::size_t(h.count);
    report.selected += count;
    report.union_size += count + std::size_t(h.trimmed);
    const std::size_t at = global.size();
    global.resize(at + count);
    updates.resize(at + count);
    if (count == 0) continue;
    std::memcpy(global.data() + at, s.data() + format.indices_offset(), count * sizeof(Index));
    std::memcpy(updates.data() + at, s.data() + format.values_offset(), count * sizeof(T));
  }
}

}  // namespace sidco::comm
