// The reduce-scatter exchange on one rank, whatever carries it: bytes per rank that do not
// grow with the number of ranks P. Each index has one owner, by a hash of the index
// (comm/ownership.hpp). A step is three calls around two collectives:
//
//   pack    this rank's selection split by owner into P blocks of capacity c = ceil(slack
//           k / P) (what does not fit goes back into its residual);
//           -- an all-to-all moves block j to owner j --
//   select  the indices this rank owns: the P blocks it received added in rank order, its
//           share of the global target kept by the owner policy, each kept index's update packed;
//           -- an all-gather moves every owner's selection to every rank --
//   apply   every owner's selection is the global selection and its update (the same bits
//           on every rank); what this rank sent that no owner kept goes back into its
//           residual. Per rank, bitwise: residual + applied contribution = gradient + old
//           residual.
//
// In the compact codings (compact, compact8) both rounds' values are narrowed: a rank's sent
// values (the rest into its residual) and an owner's updates (the rest into the owner's
// carry, comm/reduce/carry.hpp, added the next time it keeps the index).
//
// Every rank sends about 2 (P - 1) c (8 bytes) + 2 (P - 1) x 64-byte headers a step: about
// 2 slack 8k, whatever P. A step commits only when every rank has agreed it: a problem on any
// rank in either round (its compress, its arguments, a block an owner finds bad, a buffer
// this rank finds wrong after round 1, an update beyond the type's range) travels in the
// payloads, every rank's apply raises the same error, every rank gives back what it sent,
// and the exchange's state (its owner policy's and carry) stays as before the step: the next
// step works. Transports hold only their collectives: comm/reduce_exchange.hpp (MPI),
// comm/nccl_reduce.cuh (NCCL), the DDP hook's reduce codecs.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "sidco/comm/compact.hpp"
#include "sidco/comm/options.hpp"
#include "sidco/comm/owner.hpp"
#include "sidco/comm/reduce/carry.hpp"
#include "sidco/comm/reduce/plan.hpp"
#include "sidco/comm/reduce/state.hpp"
#include "sidco/comm/reduce/steps.hpp"
#include "sidco/comm/residual_sink.hpp"
#include "sidco/comm/wire.hpp"
#include "sidco/core/error.hpp"
#include "sidco/core/segment.hpp"
#include "sidco/core/sparse_vector.hpp"
#include "sidco/core/state_io.hpp"

namespace sidco::comm {

template <class T, class Index, class Policy>
class reduce_core {
  static_assert(owner_policy<Policy>,
                "reduce-scatter exchange: Policy must be an owner policy (comm/owner.hpp): a static name and "
                "select<A, Index>(indices, values, count, k)");

 public:
  using value_type = T;
  using index_type = Index;

  reduce_core() = default;
  /// The plan for layout at delta among ranks (comm/reduce/plan.hpp), this rank's number,
  /// and the options every rank shares (tag, reduction, capacity slack).
  reduce_core(std::span<const segment> layout, double delta, std::size_t ranks, std::size_t rank,
              exchange_options options = {}, Policy policy = {})
      : plan_(plan_reduce<T, Index>(layout, delta, options.slack, ranks)),
        rank_(rank),
        delta_(delta),
        options_(options),
        policy_(std::move(policy)) {
    check_trim_limit(options.trim_limit);
    if (options.coding != entry_coding::plain && !is_compact(options.coding))
      sidco::detail::fail("reduce-scatter exchange: options.coding = ", int(options.coding),
                          ", neither plain (0), compact (1) nor compact8 (2)");
    if (plan_.size > sparse_vector<T, Index>::max_dense_size)
      sidco::detail::fail("reduce-scatter exchange: ", plan_.size, " values exceed the ", 8 * sizeof(Index),
                          "-bit index range");
    if (rank >= ranks) sidco::detail::fail("reduce-scatter exchange: rank ", rank, " is outside [0, ", ranks, ")");
  }

  const reduce_plan& plan() const { return plan_; }
  /// compact: pack() rounds what a rank sends to compact_value_t<T> (the rest into its
  /// residual) and select() an owner's updates (the rest into its carry), so that transports
  /// that frame payloads (comm/reduce/frames.hpp) send the values narrowed; compact8 rounds
  /// both to byte codes (comm/byte_values.hpp: a rank's on the scale of its largest value, an
  /// owner's on its largest update's), which frames send a byte each. Payloads stay in the
  /// plain format, and the update is the same bits whatever carries them.
  entry_coding coding() const { return options_.coding; }
  std::size_t block_bytes() const { return plan_.format.bytes(); }
  /// The last global selection's indices and updates (ascending; the same on every rank).
  std::span<const Index> global_selection() const { return global_; }
  std::span<const T> updates() const { return updates_; }
  Policy& policy() { return policy_; }
  const Policy& policy() const { return policy_; }
  const reduce_report& report() const { return report_; }
  /// What narrowing left off this owner's updates, per index of the dense size, to be added
  /// the next time it keeps the index (comm/reduce/carry.hpp; empty: none yet).
  std::span<const T> carry() const { return carry_.values(); }
  /// The header fields of a step at the exchange's own tag, density and reduction (a caller
  /// may pass others: the hook names each bucket and step in its tag and density).
  wire_fields fields(std::uint64_t step) const { return {options_.tag, step, delta_, options_.op}; }

  /// Round 1: splits sent (ascending, the plan's dense size) by owner into blocks
  /// (plan().ranks x block_bytes()); sent keeps what they hold, what they cannot hold goes to
  /// sink. A problem with the arguments is packed instead (every rank raises it after round
  /// 2), and whatever sent held goes to sink. Returns whether it packed sent.
  template <class Sink>
  bool pack(sparse_vector<T, Index>& sent, Sink& sink, const wire_fields& fields, std::span<std::byte> blocks) {
    begin(fields);
    bool checked = false;
    try {
      if (sent.dense_size() != plan_.size)
        sidco::detail::fail("reduce-scatter exchange: the sparse vector's dense size ", sent.dense_size(),
                            " is not the exchange's ", plan_.size);
      if (compact()) unrounded_ = sent;
      checked = true;
      // What rounding leaves off each entry goes to sink in apply, once the owners have kept it.
      host_residual<T> later;
      const std::size_t rounded_off = compact() ? round_for_compact(sent, sink, later, options_.coding) : 0;
      report_.trimmed = returning(sink, [&](auto& back) { return pack_blocks(sent, plan_, fields_, back, blocks); });
      check_trimmed(report_.trimmed, sent.size() + report_.trimmed, options_.trim_limit, delta_);
      report_.trimmed += rounded_off;  // values below the narrow type's range: not a capacity's doing
      report_.sent = sent.size();
      packed_ = sent;
      report_.longest_block = longest_block(blocks);
      return true;
    } catch (const std::exception& e) {
      if (checked)
        returning(sink, [&](auto& back) { return give_back_all<T, Index>(sent.indices(), sent.values(), back); });
      packed_.clear(plan_.size);
      pack_failed_blocks<T, Index>(e, plan_, fields_, blocks);
      report_.longest_block = longest_block(blocks);
      return false;
    }
  }

  /// Round 1 for a rank whose compress threw: its reason in every block.
  void pack_failure(const std::exception& reason, const wire_fields& fields, std::span<std::byte> blocks) {
    begin(fields);
    pack_failed_blocks<T, Index>(reason, plan_, fields_, blocks);
    report_.longest_block = longest_block(blocks);
  }

  /// Round 2: the indices this rank owns, from the blocks it received (one per rank, rank order)
  /// into selection (block_bytes()). problem: what this rank found wrong since pack (its
  /// output buffer, say), sent instead of a selection so that every rank raises it.
  void select(payload_views received, std::span<std::byte> selection, const std::exception* problem = nullptr) {
    if (!in_step_) sidco::detail::fail("reduce-scatter exchange: select() without pack()");
    if (problem != nullptr) {
      comm::pack_failure<T, Index>(*problem, plan_.size, fields_, plan_.format, selection);
    } else {
      save_owner();
      select_owned<T, Index>(received, rank_, plan_, fields_, policy_, selection, report_, scratch_);
      carry_.apply(selection, plan_.format, plan_.size, options_.coding);
    }
    report_.selection_bytes = used_bytes(selection, plan_.format);
  }

  /// Round 3: every owner's selection (rank order). On agreement, global_selection() and
  /// updates() hold the update, what this rank sent that no owner kept goes to sink, and the
  /// step commits. Otherwise it throws
  /// sidco::runtime_error (nonfinite_exchange when every failure was non-finite input), the
  /// same on every rank, having given every entry this rank sent to sink and put the
  /// exchange's state back as it was before the step.
  template <class Sink>
  const reduce_report& apply(payload_views selections, Sink& sink) {
    if (!in_step_) sidco::detail::fail("reduce-scatter exchange: apply() without pack()");
    in_step_ = false;
    report_.ranks = int(plan_.ranks);
    report_.target = plan_.target;
    report_.bytes_sent = report_.bytes_received = 2 * (plan_.ranks - 1) * plan_.format.bytes();
    try {
      check_selections<T, Index>(selections, plan_);
    } catch (...) {
      report_.returned =
          returning(sink, [&](auto& back) { return give_back_all<T, Index>(packed_.indices(), packed_.values(), back); });
      restore_owner();
      carry_.restore();
      global_.clear();
      updates_.clear();
      throw;
    }
    read_selections<T, Index>(selections, plan_, global_, updates_, report_);
    if (compact()) {  // kept: what rounding left off; the rest whole (each index once a step)
      std::size_t g = 0;
      report_.returned = give_back_rounded(unrounded_, packed_, [&](Index i) {
        while (g < global_.size() && global_[g] < i) ++g;
        return g < global_.size() && global_[g] == i;
      }, sink);
    } else {
      report_.returned = give_back_unkept<T, Index>(packed_.indices(), packed_.values(), global_, sink);
    }
    owner_saved_ = false;
    carry_.commit();
    return report_;
  }

  /// Ends a step that will not be applied on this rank (its transport is being destroyed
  /// mid-step, after it sent every rank a failure in round 2): the state as before the step.
  /// What this rank sent is not given back (its residual may be gone).
  void abandon() {
    if (!in_step_) return;
    in_step_ = false;
    restore_owner();
    carry_.restore();
  }

  bool in_step() const { return in_step_; }

  /// The owner policy's state and the carry (comm/reduce/state.hpp). Not during a step.
  void save_state(state_writer& out) const {
    if (in_step_) sidco::detail::fail("reduce-scatter exchange: save_state() during a step (between pack and apply)");
    save_reduce_state(out, plan_, policy_, carry_);
  }
  void load_state(state_reader& in) {
    if (in_step_) sidco::detail::fail("reduce-scatter exchange: load_state() during a step (between pack and apply)");
    load_reduce_state(in, plan_, policy_, carry_);
  }

 private:
  void begin(const wire_fields& fields) {
    if (in_step_) sidco::detail::fail("reduce-scatter exchange: a new step before the last one was applied");
    in_step_ = true;
    fields_ = fields;
    report_ = {};
    owner_saved_ = false;
    packed_.clear(plan_.size);
  }

  bool compact() const { return is_compact(options_.coding); }

  // In the compact coding an entry given back whole (over a capacity, or the step failed)
  // gets its value from before the rounding (sink assigns), not what rounding kept of it, so
  // that nothing is lost; apply gives each kept entry what rounding left off instead.
  template <class Sink>
  struct unrounding_sink {
    Sink& sink;
    const sparse_vector<T, Index>& unrounded;
    void give_back(Index index, T) {
      const auto indices = unrounded.indices();
      const auto at = std::size_t(std::lower_bound(indices.begin(), indices.end(), index) - indices.begin());
      sink.give_back(index, unrounded.values()[at]);
    }
  };
  template <class Sink, class F>
  decltype(auto) returning(Sink& sink, F&& f) {
    if (!compact()) return f(sink);
    unrounding_sink<Sink> back{sink, unrounded_};
    return f(back);
  }

  // What a transport that sends only the used heads of the blocks needs (the longest one).
  std::size_t longest_block(std::span<const std::byte> blocks) const {
    const std::size_t bytes = plan_.format.bytes();
    std::size_t longest = 0;
    for (std::size_t r = 0; r < plan_.ranks; ++r)
      longest = std::max(longest, used_bytes(blocks.subspan(r * bytes, bytes), plan_.format));
    return longest;
  }

  // The owner policy's state before it selects, so that a step that fails can put it back.
  void save_owner() {
    if constexpr (stateful<Policy>) {
      owner_state_.clear();
      policy_.save_state(owner_state_);
      owner_saved_ = true;
    }
  }
  void restore_owner() {
    if constexpr (stateful<Policy>) {
      if (!owner_saved_) return;
      owner_saved_ = false;
      state_reader in(owner_state_.bytes());
      policy_.load_state(in);
    }
  }

  reduce_plan plan_;
  std::size_t rank_ = 0;
  double delta_ = 0;
  exchange_options options_;
  Policy policy_;
  owner_scratch<T, Index> scratch_;
  owner_carry<T, Index> carry_;
  sparse_vector<T, Index> packed_;     // what this rank's blocks hold, this step
  sparse_vector<T, Index> unrounded_;  // compact: what this rank sent, before rounding
  std::vector<Index> global_;
  std::vector<T> updates_;
  state_writer owner_state_;
  bool owner_saved_ = false, in_step_ = false;
  wire_fields fields_;  // this step's
  reduce_report report_;
};

}  // namespace sidco::comm
