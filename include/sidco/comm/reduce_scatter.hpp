// The reduce-scatter exchange, whatever carries it: bytes per rank that do not grow with the
// number of ranks P. The index space is split into P regions, one owner each
// (comm/regions.hpp). Per step:
//
//   1. each rank splits its selection by region into P blocks of fixed capacity c (what
//      does not fit, the smallest, goes back into its residual) and an all-to-all moves
//      block j to owner j;
//   2. each owner adds the blocks it received in rank order and selects its region's share
//      of the global target (the average rank's count there) with an owner policy (SIDCo on
//      the reduced values, or exact Top-k), at most c entries; one all-gather moves every
//      owner's selection to every rank;
//   3. every rank applies the same update (each index is one owner's: the sum divided by P
//      for an average), and puts back into its residual each entry it sent whose index the
//      global selection left out.
//
// Per rank, bitwise: residual + applied contribution = gradient + old residual. Each payload
// (block or selection) is a wire payload (comm/wire.hpp) of c entries, so every rank sends
// about 2 (P - 1) c (8 bytes + a 64-byte header) a step, c = ceil(slack k / P): about
// 2 slack 8k, whatever P. A rank's failure travels in its blocks; an owner relays what its
// blocks' check found in its selection's payload, so every rank raises the same error after
// the all-gather, and every rank's sent entries go back into its residual.
#pragma once

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <memory>
#include <span>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "sidco/backend/host/keep_top_k.hpp"
#include "sidco/comm/capacity.hpp"
#include "sidco/comm/regions.hpp"
#include "sidco/comm/report.hpp"
#include "sidco/comm/wire.hpp"
#include "sidco/core/checks.hpp"
#include "sidco/core/error.hpp"
#include "sidco/core/float_traits.hpp"
#include "sidco/core/half.hpp"
#include "sidco/core/magnitude_key.hpp"
#include "sidco/core/sparse_vector.hpp"
#include "sidco/core/state_io.hpp"
#include "sidco/presets.hpp"
#include "sidco/select/exact_k.hpp"
#include "sidco/select/top_k.hpp"

namespace sidco::comm {

namespace detail {

/// The owners' radix workspace (backend::host::keep_top_k's survivors), one per key width,
/// kept from step to step.
class top_k_workspace {
 public:
  template <class T, class Index>
  std::size_t keep_top_k(Index* indices, T* values, std::size_t count, std::size_t k) {
    return backend::host::keep_top_k(indices, values, count, k, std::get<std::vector<magnitude_key_t<T>>>(keys_));
  }

 private:
  std::tuple<std::vector<std::uint16_t>, std::vector<std::uint32_t>, std::vector<std::uint64_t>> keys_;
};

}  // namespace detail

/// An owner's reduced entries (the union of the blocks it received, summed, indices
/// ascending), kept from step to step so that a steady owner allocates nothing. Grown
/// without zeroing: every slot in use is written first (a sparse_vector's resize zeroed the
/// received count of entries every step).
template <class T, class Index>
class owner_workspace {
 public:
  /// Room for count entries; the entries held are lost when it grows.
  void reserve(std::size_t count) {
    if (count <= capacity_) return;
    const std::size_t grown = std::max(count, 2 * capacity_);
    indices_ = std::make_unique_for_overwrite<Index[]>(grown);
    values_ = std::make_unique_for_overwrite<T[]>(grown);
    capacity_ = grown;
    size_ = 0;
  }
  /// The first count slots (at most the capacity) are the entries.
  void set_size(std::size_t count) {
    if (count > capacity_)
      sidco::detail::fail("owner_workspace: ", count, " entries exceed the capacity ", capacity_);
    size_ = count;
  }
  std::size_t size() const { return size_; }
  std::size_t capacity() const { return capacity_; }
  Index* indices() { return indices_.get(); }
  T* values() { return values_.get(); }
  std::span<const Index> indices() const { return {indices_.get(), size_}; }
  std::span<const T> values() const { return {values_.get(), size_}; }

 private:
  std::unique_ptr<Index[]> indices_;
  std::unique_ptr<T[]> values_;
  std::size_t capacity_ = 0, size_ = 0;
};

/// Owner policy: exact Top-k of the reduced values (ties to the lower index).
struct owner_top_k {
  static constexpr const char* name = "top-k";
  /// Keeps the k largest magnitudes of values[0, count) (indices ascending, kept so).
  template <class T, class Index>
  std::size_t select(Index* indices, T* values, std::size_t count, std::size_t k) {
    return workspace_.keep_top_k(indices, values, count, k);
  }

 private:
  detail::top_k_workspace workspace_;
};

/// Owner policy: a compressor (SIDCo by default: presets::sidco_e with exact_k on the cpu
/// backend, whose SIMD passes cost a few ns per reduced value where the serial backend's
/// cost 20) run on the reduced values at density k / count; its adaptive state carries from
/// step to step (save_state / load_state for checkpoints; the backend holds none).
///
/// When the compressor's result is the exact Top-k (select::exact_k, select::top_k) and k is
/// at least direct_share of the count, the owner runs the exact Top-k itself: the same
/// entries, in fewer passes than a fit, a threshold pass and a trim (the union is already
/// the ranks' tails, so a fit on it also misses often, and misses cost rescans).
template <class Compressor>
struct owner_compressor {
  static constexpr const char* name = "compressor";
  static constexpr bool selects_top_k = std::is_same_v<typename Compressor::selection_type, select::exact_k> ||
                                        std::is_same_v<typename Compressor::selection_type, select::top_k>;
  Compressor compressor{};
  double direct_share = 0.1;

  owner_compressor() = default;
  explicit owner_compressor(Compressor c) : compressor(std::move(c)) {}

  template <class T, class Index>
  std::size_t select(Index* indices, T* values, std::size_t count, std::size_t k) {
    if (count <= k) return count;
    if constexpr (selects_top_k)
      if (double(k) >= direct_share * double(count)) return top_k_.keep_top_k(indices, values, count, k);
    auto& picked = std::get<sparse_vector<T, std::uint32_t>>(picked_);
    compressor.compress(std::span<const T>(values, count), double(k) / double(count), picked);
    const auto at = picked.indices();
    for (std::size_t j = 0; j < at.size(); ++j) {  // positions ascend: compact in place
      indices[j] = indices[at[j]];
      values[j] = values[at[j]];
    }
    return at.size();
  }
  void save_state(state_writer& out) const { compressor.save_state(out); }
  void load_state(state_reader& in) { compressor.load_state(in); }

 private:
  // The selection's buffers, kept from step to step (one per element type the wire
  // carries), so that a steady owner allocates nothing.
  std::tuple<sparse_vector<float, std::uint32_t>, sparse_vector<double, std::uint32_t>,
             sparse_vector<float16, std::uint32_t>, sparse_vector<bfloat16, std::uint32_t>>
      picked_;
  detail::top_k_workspace top_k_;
};

/// The default owner policy: SIDCo-E's threshold on the reduced values, trimmed to exactly
/// the region's share (select::exact_k): the global selection holds what the ranks' own
/// compressors aimed at, on average, whatever the reduced values' distribution.
using owner_sidco_e = owner_compressor<presets::sidco_e_exact<backend::cpu>>;

/// Sizes of one tensor's reduce-scatter exchange among P ranks.
struct reduce_plan {
  std::size_t size = 0;         // N
  std::size_t ranks = 1;        // P
  std::size_t target = 0;       // k: the global selection's aim, sum of the layout's counts
  std::size_t capacity = 0;     // c: entries per block and per owner's selection
  wire_format format;           // of every block and selection
};

/// The plan for a layout at delta among ranks: k = sum of max(1, floor(delta n_s)) over the
/// layout (the count the local compressors aim at), c = ceil(slack k / P), at least 1.
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
  plan.capacity = std::max<std::size_t>(1, wanted >= double(size) ? size : std::size_t(wanted));
  plan.format = format_for<T, Index>(plan.capacity);
  return plan;
}

/// What one step of the exchange did, on this rank.
struct reduce_report {
  std::size_t sent = 0;        // entries this rank put in its blocks
  std::size_t trimmed = 0;     // over a block's capacity: back into this rank's residual
  std::size_t returned = 0;    // sent, left out of the global selection: back into the residual
  std::size_t received = 0;    // entries in the blocks this rank's region received
  std::size_t union_size = 0;  // distinct indices over every owner (sum of their unions)
  std::size_t selected = 0;    // the global selection's entries (every owner's)
  std::size_t bytes_sent = 0;  // payload bytes this rank put on the wire (P - 1 blocks and its selection P - 1 times)
  std::size_t bytes_received = 0;
  std::size_t target = 0;      // k
  int ranks = 0;
};

/// A step's argument checks, whatever buffers hold them: a residual of the exchange's size
/// (or none), and a sparse vector of its dense size.
inline void check_step_sizes(const reduce_plan& plan, std::size_t residual_size, std::size_t sent_dense_size) {
  if (residual_size != 0 && residual_size != plan.size)
    sidco::detail::fail("sparse_reduce_exchange: residual: size ", residual_size, " is not the exchange's ", plan.size);
  if (sent_dense_size != plan.size)
    sidco::detail::fail("sparse_reduce_exchange: the sparse vector's dense size ", sent_dense_size,
                        " is not the exchange's ", plan.size);
}

/// Round 1 on the sender: splits sent (ascending, dense size plan.size) by region into
/// plan.ranks blocks of plan.format, each trimmed to its largest plan.capacity entries
/// (what it removes goes into residual, when given; sent keeps what the blocks hold), and
/// packs block j into blocks[j * format.bytes(), ...). Returns how many entries it trimmed.
template <class T, class Index>
std::size_t pack_blocks(sparse_vector<T, Index>& sent, const regions& owners, const reduce_plan& plan,
                        const wire_fields& fields, std::span<T> residual, std::span<std::byte> blocks) {
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
      kept = backend::host::keep_top_k(index + write, value + write, n, plan.capacity, [&](Index i, T v) {
        if (!residual.empty()) residual[std::size_t(i)] = v;
      });
      trimmed += n - kept;
    }
    read += n;
    write += kept;
    runs[j + 1] = write;
  }
  sent.truncate(write);
  sparse_vector<T, Index> block(plan.size);
  for (std::size_t j = 0; j < plan.ranks; ++j) {
    block.clear(plan.size);
    for (std::size_t e = runs[j]; e < runs[j + 1]; ++e) block.push_back(index[e], value[e]);
    pack(block, trimmed, fields, plan.format, blocks.subspan(j * bytes, bytes));
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

/// Indices per window of the owner's reduction: its sums and bitmap stay in L1.
inline constexpr std::size_t reduce_window = 4096;

/// The ok blocks' entries (indices ascending, inside [begin, end), `received` in all) added
/// index by index in rank order, in the accumulator type from A(0) and rounded once to T
/// (a sum beyond T's range throws sidco::nonfinite_error),
/// written to reduced in ascending index order (its size is the union's). The region is walked in windows of
/// reduce_window indices: each rank's entries in the window (its cursor only moves forward)
/// are added into a window-sized array, a bitmap marks the indices seen, and the bitmap
/// walked in order emits them; O(received + P region / window), with windows no entry fell
/// in skipped.
template <class T, class Index>
void reduce_blocks(std::span<const std::span<const std::byte>> blocks, const wire_format& format, std::size_t begin,
                   std::size_t end, std::size_t received, owner_workspace<T, Index>& reduced) {
  using A = typename float_traits<T>::accumulator;
  constexpr std::size_t words = reduce_window / 64;
  // Written through pointers, room for every entry received (the union is at most that):
  // no capacity check per entry.
  reduced.reserve(received);
  Index* const out_index = reduced.indices();
  T* const out_value = reduced.values();
  std::size_t emitted = 0;
  struct cursor {
    const std::byte* indices;
    const std::byte* values;
    std::size_t count, at;
  };
  std::vector<cursor> cursors(blocks.size());
  for (std::size_t r = 0; r < blocks.size(); ++r)
    cursors[r] = {blocks[r].data() + format.indices_offset(), blocks[r].data() + format.values_offset(),
                  std::size_t(read_header(blocks[r]).count), 0};
  // Zero between uses (the emit loop below restores each sum it reads), so every entry adds
  // without asking whether its index was seen: A(0) + v first, as the rank order asks.
  std::array<A, reduce_window> sums{};
  std::array<std::uint64_t, words> seen{};
  static_assert(words <= 64, "one summary word marks the window's nonzero bitmap words");
  for (std::size_t window = begin; window < end; window += reduce_window) {
    const std::size_t window_end = std::min(end, window + reduce_window);
    std::uint64_t touched = 0;  // bit w: seen[w] has a bit set (most are empty at a few %)
    for (cursor& c : cursors) {
      // The cursor in locals: stores to seen (64-bit words) could otherwise alias it.
      const std::byte* const indices = c.indices;
      const std::byte* const values = c.values;
      const std::size_t count = c.count;
      std::size_t e = c.at;
      for (; e < count; ++e) {
        const std::uint64_t index = index_at<Index>(indices + e * sizeof(Index));
        if (index >= window_end) break;
        const std::size_t at = std::size_t(index) - window;
        T v;
        std::memcpy(&v, values + e * sizeof(T), sizeof v);
        sums[at] = A(sums[at] + A(v));
        seen[at / 64] |= std::uint64_t(1) << (at % 64);
        touched |= std::uint64_t(1) << (at / 64);
      }
      c.at = e;
    }
    for (; touched != 0; touched &= touched - 1) {
      const std::size_t w = std::size_t(std::countr_zero(touched));
      for (std::uint64_t bits = seen[w]; bits != 0; bits &= bits - 1) {
        const std::size_t at = w * 64 + std::size_t(std::countr_zero(bits));
        const T sum = T(sums[at]);
        sums[at] = A(0);
        // Finite values whose sum overflows T: the step fails as non-finite input does.
        if (!finite_at<T>(reinterpret_cast<const std::byte*>(&sum)))
          throw nonfinite_error(sidco::detail::message("reduce-scatter exchange: the ranks' values at index ",
                                                       window + at, " add up to ", double(sum), ", beyond the ",
                                                       "element type's range"));
        out_index[emitted] = Index(window + at);
        out_value[emitted] = sum;
        ++emitted;
      }
      seen[w] = 0;
    }
  }
  reduced.set_size(emitted);
}

}  // namespace detail

/// Round 2 on owner `me`: checks the blocks it received (one per rank, in rank order; every
/// check of agree() plus the region), adds them in rank order (in the accumulator type,
/// rounded once to T) and keeps the region's share of the global target, ceil(received /
/// P) entries (at most the capacity), chosen by policy, in its selection payload. A
/// problem in the blocks is relayed in the payload instead, for every rank to raise.
/// Returns (union size, received entries) through the report.
/// reduced is the owner's workspace (kept from step to step, so that a steady owner
/// allocates nothing); the overload below makes a fresh one.
template <class T, class Index, class Policy>
void select_region(std::span<const std::span<const std::byte>> blocks, const regions& owners, std::size_t me,
                   const reduce_plan& plan, const wire_fields& fields, Policy& policy, std::span<std::byte> selection,
                   reduce_report& report, owner_workspace<T, Index>& reduced) {
  try {
    if (blocks.size() != plan.ranks)
      sidco::detail::fail("reduce-scatter exchange: ", blocks.size(), " blocks received, ", plan.ranks, " ranks");
    agree<T, Index>(blocks, plan.format);
    for (std::size_t r = 0; r < blocks.size(); ++r)
      detail::check_region<Index>(blocks[r], plan.format, owners.begin(me), owners.end(me), "rank", r);
    std::size_t received = 0;
    for (const auto& block : blocks) received += std::size_t(detail::read_header(block).count);
    detail::reduce_blocks<T, Index>(blocks, plan.format, owners.begin(me), owners.end(me), received, reduced);
    const std::size_t union_size = reduced.size();
    const std::size_t share = std::min(plan.capacity, (received + plan.ranks - 1) / plan.ranks);
    std::size_t kept = union_size;
    if (union_size > share) kept = policy.template select<T, Index>(reduced.indices(), reduced.values(), union_size, share);
    if (kept > plan.capacity)
      kept = backend::host::keep_top_k(reduced.indices(), reduced.values(), kept, plan.capacity);
    reduced.set_size(kept);
    report.received = received;
    // The header's trimmed field carries what the owner left out of its union.
    pack<T, Index>(std::as_const(reduced).indices(), std::as_const(reduced).values(), plan.size,
                   union_size - kept, fields, plan.format, selection);
  } catch (const runtime_error& e) {
    pack_failure<T, Index>(e, plan.size, fields, plan.format, selection, wire_status::relayed);
  } catch (const std::exception& e) {
    pack_failure<T, Index>(e, plan.size, fields, plan.format, selection);
  }
}

template <class T, class Index, class Policy>
void select_region(std::span<const std::span<const std::byte>> blocks, const regions& owners, std::size_t me,
                   const reduce_plan& plan, const wire_fields& fields, Policy& policy, std::span<std::byte> selection,
                   reduce_report& report) {
  owner_workspace<T, Index> reduced;
  select_region<T, Index>(blocks, owners, me, plan, fields, policy, selection, report, reduced);
}

namespace detail {

/// Every owner's selection agrees (agree()) and holds indices of its own region only.
template <class T, class Index>
void check_selections(std::span<const std::span<const std::byte>> selections, const regions& owners,
                      const reduce_plan& plan) {
  if (selections.size() != plan.ranks)
    sidco::detail::fail("reduce-scatter exchange: ", selections.size(), " selections received, ", plan.ranks, " ranks");
  agree<T, Index>(selections, plan.format);
  for (std::size_t j = 0; j < selections.size(); ++j)
    detail::check_region<Index>(selections[j], plan.format, owners.begin(j), owners.end(j), "owner", j);
}

/// The global selection's indices, ascending (owners' regions ascend), into global.
template <class Index>
void collect_global(std::span<const std::span<const std::byte>> selections, const wire_format& format,
                    std::vector<Index>& global) {
  global.clear();
  for (const auto& s : selections) {
    const wire_header h = detail::read_header(s);
    for (std::size_t j = 0; j < h.count; ++j)
      global.push_back(Index(detail::index_at<Index>(s.data() + format.indices_offset() + j * sizeof(Index))));
  }
}

/// give_back(index, value) for each entry of sent whose index global (ascending) lacks;
/// returns how many. Also what pack_blocks trimmed, for a caller that cannot hand it the
/// residual (in device memory): sent as it was, global the indices pack_blocks kept.
template <class T, class Index, class GiveBack>
std::size_t return_unselected(const sparse_vector<T, Index>& sent, std::span<const Index> global, GiveBack&& give_back) {
  std::size_t g = 0, returned = 0;
  for (std::size_t j = 0; j < sent.size(); ++j) {
    const Index i = sent.indices()[j];
    while (g < global.size() && global[g] < i) ++g;
    if (g < global.size() && global[g] == i) continue;
    give_back(i, sent.values()[j]);
    ++returned;
  }
  return returned;
}

}  // namespace detail

/// Round 3 on every rank: dense (overwritten) = every owner's selection, divided by P for an
/// average (the same bits on every rank); each entry of sent (what this rank's blocks held)
/// left out of the global selection goes back into residual. On any problem it throws
/// sidco::runtime_error, the same on every rank, having written nothing to dense and put
/// every entry of sent back into residual. `global` receives the global selection's
/// indices (ascending), for the next step's regions.
template <class T, class Index>
void apply_selections(std::span<const std::span<const std::byte>> selections, const regions& owners,
                      const reduce_plan& plan, const sparse_vector<T, Index>& sent, std::span<T> residual,
                      std::span<T> dense, std::vector<Index>& global, reduce_report& report) {
  try {
    if (dense.size() != plan.size)
      sidco::detail::fail("reduce-scatter exchange: dense: size ", dense.size(), " is not ", plan.size);
    detail::check_selections<T, Index>(selections, owners, plan);
    const exchange_report decoded = decode<T, Index>(selections, plan.format, dense);
    report.selected = decoded.entries;
    report.union_size = decoded.entries + decoded.trimmed;
  } catch (...) {
    return_entries(sent, residual);
    report.returned = sent.size();
    throw;
  }
  detail::collect_global(selections, plan.format, global);
  // What this rank sent that no owner kept waits in its residual.
  report.returned = detail::return_unselected(sent, std::span<const Index>(global), [&](Index i, T v) {
    if (!residual.empty()) residual[std::size_t(i)] = v;
  });
}

/// Round 3 for a caller that writes the update itself (into device memory, say): global =
/// the global selection's indices (ascending) and applied = the values apply_selections
/// would write there (the same bits: each index is one owner's, so decode's rank-order sum
/// is that owner's value, from 0, divided by P for an average); give_back(index, value) for
/// each entry of sent the selection left out. On any problem it throws as apply_selections
/// does, having given back every entry of sent and filled neither vector.
template <class T, class Index, class GiveBack>
void selected_entries(std::span<const std::span<const std::byte>> selections, const regions& owners,
                      const reduce_plan& plan, const sparse_vector<T, Index>& sent, GiveBack&& give_back,
                      std::vector<Index>& global, std::vector<T>& applied, reduce_report& report) {
  global.clear();
  applied.clear();
  try {
    detail::check_selections<T, Index>(selections, owners, plan);
  } catch (...) {
    for (std::size_t j = 0; j < sent.size(); ++j) give_back(sent.indices()[j], sent.values()[j]);
    report.returned = sent.size();
    throw;
  }
  using A = typename float_traits<T>::accumulator;
  const bool average = detail::read_header(selections[0]).op == std::uint8_t(reduction::average);
  const A divisor = A(double(plan.ranks));
  report.selected = report.union_size = 0;
  for (const auto& s : selections) {
    const wire_header h = detail::read_header(s);
    report.selected += std::size_t(h.count);
    report.union_size += std::size_t(h.count + h.trimmed);
    for (std::size_t j = 0; j < h.count; ++j) {
      T v;
      std::memcpy(&v, s.data() + plan.format.values_offset() + j * sizeof(T), sizeof v);
      A sum = A(A(0) + A(v));
      if (average) sum = A(sum / divisor);  // finite: agree() checked v, and |v| / P <= |v|
      applied.push_back(T(sum));
    }
  }
  detail::collect_global(selections, plan.format, global);
  report.returned = detail::return_unselected(sent, std::span<const Index>(global), give_back);
}

/// What a reduce-scatter exchange checkpoints to resume bit for bit, whatever carries it:
/// its regions and the owner policy's state (the local compressor and residual are the
/// caller's).
template <class Policy>
void save_reduce_state(state_writer& out, const regions& owners, const Policy& policy) {
  out.name("sparse_reduce_exchange");
  out.word(owners.bounds().size());
  for (std::size_t b : owners.bounds()) out.word(b);
  if constexpr (requires { policy.save_state(out); }) policy.save_state(out);
}

/// Reads what save_reduce_state wrote; owners and policy change only when all of it reads.
template <class Policy>
void load_reduce_state(state_reader& in, const reduce_plan& plan, regions& owners, Policy& policy) {
  in.expect("sparse_reduce_exchange");
  const std::uint64_t count = in.word("sparse_reduce_exchange: bounds");
  if (count != std::uint64_t(plan.ranks) + 1)
    sidco::detail::fail("sparse_reduce_exchange: the state has ", count, " bounds, this exchange ", plan.ranks + 1);
  std::vector<std::size_t> bounds(count);
  for (auto& b : bounds) b = std::size_t(in.word("sparse_reduce_exchange: bound"));
  regions loaded = regions::from_bounds(std::move(bounds), plan.size);
  Policy loaded_policy = policy;
  if constexpr (requires { loaded_policy.load_state(in); }) loaded_policy.load_state(in);
  owners = std::move(loaded);
  policy = std::move(loaded_policy);
}

}  // namespace sidco::comm
