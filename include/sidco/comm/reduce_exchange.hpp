// The reduce-scatter exchange over MPI (comm/reduce/core.hpp): the blocks to the indices'
// owners (a hash of the index) by one MPI_Ialltoall, each owner's selection, the selections
// by one MPI_Allgather: about 2 slack 8k bytes per rank a step whatever the number of ranks
// P, plus a 64-byte header a peer each way (and at least 320 bytes a block), where the
// all-gather (comm/exchange.hpp) moves (P - 1) slack 8k. With exchange_options::exact_sizes,
// both travel at the head the longest one uses (a prefix of the fixed-size payload:
// comm/wire.hpp), agreed by a one-integer MPI_Allreduce before the blocks (the selections
// take the blocks' head, and a second all-gather in the rare step where one is longer): fewer
// bytes where blocks are mostly slack or padding (many ranks), a latency more a step.
// With exchange_options::schedule = two_hop, both rounds go through an intermediate of a
// sqrt(P) grid (comm/mpi_two_hop.hpp): O(sqrt P) messages a rank instead of P - 1, every
// payload at its own size behind a 4-byte header, indices gap-coded (comm/reduce/frames.hpp),
// what passes through an intermediate sent twice.
// Needs MPI. The default owner policy (owner_sidco_e) is in <sidco/owners.hpp>, which
// <sidco/sidco.hpp> includes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <exception>
#include <limits>
#include <span>
#include <utility>
#include <vector>

#ifndef OMPI_SKIP_MPICXX
#define OMPI_SKIP_MPICXX 1  // the deprecated C++ bindings only add warnings
#endif
#include <mpi.h>

#include "sidco/comm/mpi_support.hpp"
#include "sidco/comm/mpi_two_hop.hpp"
#include "sidco/comm/options.hpp"
#include "sidco/comm/reduce/core.hpp"
#include "sidco/comm/reduce/frames.hpp"
#include "sidco/comm/residual_sink.hpp"
#include "sidco/comm/setup.hpp"
#include "sidco/core/error.hpp"
#include "sidco/core/state_io.hpp"

namespace sidco::comm {

/// One tensor's (or one buffer of tensors') reduce-scatter exchange, reused every step.
///
///   sparse_reduce_exchange<float> exchange(MPI_COMM_WORLD, layout, delta);   // collective
///   try {
///     compressor.compress(gradient, delta, sent, residual);
///     exchange.start(sent, residual.values(), step);      // splits, packs, MPI_Ialltoall
///   } catch (const std::exception& e) {
///     exchange.start_failed(e, step);
///   }
///   exchange.wait(dense);  // owners select, MPI_Allgather: the same update on every rank
///
/// Construction is collective and agrees on the payload's size; every rank calls start (or
/// start_failed) and wait in the same order. A failure on any rank, in either round (its
/// compress, its arguments to start or to wait), is the same sidco::runtime_error on every
/// rank's wait(), with every rank's sent entries back in its residual and the exchange as
/// before the step: the next step works. sent (as trimmed) and residual must stay alive
/// until wait() returns. Destroying an exchange between start() and wait() (a throw) ends
/// the step on every rank: its peers' wait() raises. Not thread-safe: one exchange, one
/// thread.
template <class T, class Index = std::uint32_t, class Policy = owner_sidco_e>
class sparse_reduce_exchange {
  static_assert(requires { sizeof(Policy); },
                "sparse_reduce_exchange: the default owner policy, owner_sidco_e, is defined in <sidco/owners.hpp> "
                "(or <sidco/sidco.hpp>): include it, or name an owner policy of comm/owner.hpp");

 public:
  sparse_reduce_exchange(MPI_Comm comm, std::vector<segment> layout, double delta, exchange_options options = {},
                         Policy policy = {})
      : comm_(comm), overlap_(options.overlap), exact_sizes_(options.exact_sizes),
        two_hop_(options.schedule == reduce_schedule::two_hop) {
    check_mpi(MPI_Comm_size(comm_, &ranks_), "MPI_Comm_size");
    check_mpi(MPI_Comm_rank(comm_, &rank_), "MPI_Comm_rank");
    exchange_setup mine{};
    try {
      core_ = reduce_core<T, Index, Policy>(layout, delta, std::size_t(ranks_), std::size_t(rank_), options,
                                            std::move(policy));
      if (core_.block_bytes() * std::size_t(ranks_) > std::size_t(std::numeric_limits<int>::max()))
        sidco::detail::fail("sparse_reduce_exchange: ", ranks_, " blocks of ", core_.block_bytes(),
                            " bytes exceed MPI's int counts");
      blocks_.resize(core_.block_bytes() * std::size_t(ranks_));
      received_.resize(blocks_.size());
      selection_.resize(core_.block_bytes());
      selections_.resize(blocks_.size());
      mine = setup_of<T, Index>(layout, core_.plan().format, core_.fields(0), options.slack);
      mine.exact_sizes = options.exact_sizes;
      mine.coding = std::uint8_t(options.coding);
      mine.schedule = std::uint32_t(options.schedule);
      if (options.schedule != reduce_schedule::flat && options.schedule != reduce_schedule::two_hop)
        sidco::detail::fail("sparse_reduce_exchange: options.schedule = ", int(options.schedule),
                            ", neither flat (0) nor two_hop (1)");
    } catch (const std::exception& e) {
      mine = failed_setup(e, options.tag);
    }
    mpi::agree_setup(comm_, ranks_, mine, "sparse_reduce_exchange");
    if (two_hop_) {  // agreed by every rank, so every rank duplicates
      check_mpi(MPI_Comm_dup(comm_, &own_comm_), "MPI_Comm_dup");
      schedule_ = mpi::two_hop(own_comm_, max_frame_bytes(core_.plan().format));
    }
  }

  /// One tensor of size values.
  sparse_reduce_exchange(MPI_Comm comm, std::size_t size, double delta, exchange_options options = {},
                         Policy policy = {})
      : sparse_reduce_exchange(comm, std::vector<segment>{{0, size}}, delta, options, std::move(policy)) {}

  sparse_reduce_exchange(const sparse_reduce_exchange&) = delete;
  sparse_reduce_exchange& operator=(const sparse_reduce_exchange&) = delete;

  /// Mid-step (a throw between start() and wait()): finishes round 1, sends every rank a
  /// failure in round 2, so that no peer waits forever and every peer's wait() raises it.
  ~sparse_reduce_exchange() {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized) return;
    if (in_flight_) {
      if (!two_hop_) MPI_Wait(&request_, MPI_STATUS_IGNORE);
      const sidco::runtime_error reason(sidco::detail::message(
          "sparse_reduce_exchange: rank ", rank_, "'s exchange was destroyed between start() and wait()"));
      try {
        receive_blocks();
        core_.select(received_views(), std::span<std::byte>(selection_), &reason);
        gather_selections();
      } catch (...) {  // a destructor does not throw; the peers raise what they received
        schedule_.abandon();
      }
      core_.abandon();
    }
    if (own_comm_ != MPI_COMM_NULL) MPI_Comm_free(&own_comm_);
  }

  int ranks() const { return ranks_; }
  int rank() const { return rank_; }
  const reduce_plan& plan() const { return core_.plan(); }
  /// The last global selection's indices, ascending (the same on every rank).
  std::span<const Index> global_selection() const { return core_.global_selection(); }
  Policy& policy() { return core_.policy(); }

  /// Splits sent by owner into blocks of the plan's capacity (what does not fit goes back
  /// into residual, when given) and starts the all-to-all. A problem with the arguments on
  /// this rank is sent instead, for every rank's wait() to raise.
  void start(sparse_vector<T, Index>& sent, std::span<T> residual, std::uint64_t step) {
    begin(step);
    residual_ = {};
    host_residual<T> sink{residual};
    try {
      if (!residual.empty() && residual.size() != core_.plan().size)
        sidco::detail::fail("sparse_reduce_exchange: residual: size ", residual.size(), " is not the exchange's ",
                            core_.plan().size);
      residual_ = residual;
    } catch (const std::exception& e) {
      core_.pack_failure(e, core_.fields(step), std::span<std::byte>(blocks_));
      return send_blocks();
    }
    core_.pack(sent, sink, core_.fields(step), std::span<std::byte>(blocks_));
    send_blocks();
  }

  /// For a rank whose compress threw: sends the reason in every block; every rank's wait()
  /// raises it, naming this rank.
  void start_failed(const std::exception& reason, std::uint64_t step) {
    begin(step);
    residual_ = {};
    core_.pack_failure(reason, core_.fields(step), std::span<std::byte>(blocks_));
    send_blocks();
  }

  /// Completes the step: the indices this rank owns selected from the blocks it received, every
  /// owner's selection all-gathered, dense (overwritten) = the global selection's updates,
  /// the same bits on every rank. On any rank's failure (a dense of the wrong size on this
  /// one included) it throws sidco::runtime_error, the same on every rank, having written
  /// nothing to dense, returned every entry this rank sent to its residual and left the
  /// exchange as before the step.
  reduce_report wait(std::span<T> dense) {
    if (!in_flight_) sidco::detail::fail("sparse_reduce_exchange: wait() without start()");
    in_flight_ = false;
    if (!two_hop_) check_mpi(MPI_Wait(&request_, MPI_STATUS_IGNORE), "MPI_Wait (blocks)");
    const std::size_t size = core_.plan().size, bytes = core_.block_bytes();
    const sidco::error wrong_dense(sidco::detail::message("sparse_reduce_exchange: rank ", rank_, "'s dense: size ",
                                                          dense.size(), " is not the exchange's ", size));
    receive_blocks();
    core_.select(received_views(), std::span<std::byte>(selection_), dense.size() == size ? nullptr : &wrong_dense);
    gather_selections();
    std::vector<std::span<const std::byte>> views(static_cast<std::size_t>(ranks_));
    for (std::size_t r = 0; r < views.size(); ++r)
      views[r] = std::span<const std::byte>(selections_).subspan(r * bytes, bytes);
    host_residual<T> sink{residual_};
    reduce_report report = core_.apply(views, sink);
    // What this rank handed its collectives for the other ranks: a block to each and its
    // selection to each, at the agreed heads (the heads' all-reduces add 8 bytes or so).
    report.bytes_sent = report.bytes_received = (block_head_ + selection_head_) * std::size_t(ranks_ - 1);
    if (two_hop_) {  // what the messages of both rounds held
      report.bytes_sent = blocks_sent_ + schedule_.bytes_sent();
      report.bytes_received = blocks_received_ + schedule_.bytes_received();
    }
    std::fill(dense.begin(), dense.end(), T(0));
    const auto global = core_.global_selection();
    const auto updates = core_.updates();
    for (std::size_t j = 0; j < global.size(); ++j) dense[std::size_t(global[j])] = updates[j];
    return report;
  }

  /// What a checkpoint needs to resume bit for bit: the owner policy's
  /// state (comm/reduce/state.hpp; the local compressor and residual are the caller's).
  void save_state(state_writer& out) const { core_.save_state(out); }
  void load_state(state_reader& in) { core_.load_state(in); }

 private:
  static void check_mpi(int status, const char* what) { mpi::check(status, "sparse_reduce_exchange", what); }

  void begin(std::uint64_t step) {
    if (in_flight_) sidco::detail::fail("sparse_reduce_exchange: start() twice without wait()");
    step_fields_ = core_.fields(step);
  }

  std::vector<std::span<const std::byte>> received_views() const {
    const std::size_t bytes = core_.block_bytes();
    std::vector<std::span<const std::byte>> views(static_cast<std::size_t>(ranks_));
    for (std::size_t r = 0; r < views.size(); ++r) views[r] = std::span<const std::byte>(received_).subspan(r * bytes, bytes);
    return views;
  }

  // exact_sizes: the longest block any rank has (mine: this rank's longest), by one
  // MPI_Allreduce; every rank then sends that head of each block (zeros past what it uses),
  // so the collective keeps a fixed size and the algorithms MPI chooses for it (Bruck: log P
  // rounds, where MPI_Alltoallv's pairwise schedule took 5.4x the time at 256 ranks under
  // SMPI). The same head on every rank. Otherwise: the whole block, no extra round.
  std::size_t agreed_head(std::size_t mine) {
    const std::size_t bytes = core_.block_bytes();
    if (!exact_sizes_) return bytes;
    const int longest = int(std::min(mine, bytes));
    int head = 0;
    check_mpi(MPI_Allreduce(&longest, &head, 1, MPI_INT, MPI_MAX, comm_), "MPI_Allreduce (payload heads)");
    return std::clamp<std::size_t>(std::size_t(std::max(head, 0)), sizeof(wire_header), bytes);
  }

  // payloads' heads (P slots of block_bytes()), packed one after another into packed.
  void pack_heads(std::span<const std::byte> payloads, std::size_t head, std::vector<std::byte>& packed) const {
    const std::size_t bytes = core_.block_bytes(), ranks = std::size_t(ranks_);
    packed.resize(head * ranks);
    for (std::size_t r = 0; r < ranks; ++r) std::copy_n(payloads.data() + r * bytes, head, packed.data() + r * head);
  }

  // The heads received back into their slots, the rest of each slot zero (what pack left).
  void unpack_heads(const std::vector<std::byte>& packed, std::size_t head, std::span<std::byte> payloads) const {
    const std::size_t bytes = core_.block_bytes();
    for (std::size_t r = 0; r < std::size_t(ranks_); ++r) {
      std::byte* slot = payloads.data() + r * bytes;
      std::copy_n(packed.data() + r * head, head, slot);
      std::fill(slot + head, slot + bytes, std::byte{0});
    }
  }

  // Round 1: the blocks' agreed head, then the blocks at that size to their owners.
  void send_blocks() {
    if (two_hop_) return send_frames();
    block_head_ = agreed_head(core_.report().longest_block);
    const int head = int(block_head_);
    const bool whole = block_head_ == core_.block_bytes();  // nothing to pack
    if (!whole) {
      pack_heads(std::span<const std::byte>(blocks_), block_head_, blocks_packed_);
      received_packed_.resize(block_head_ * std::size_t(ranks_));
    }
    const std::byte* from = whole ? blocks_.data() : blocks_packed_.data();
    std::byte* into = whole ? received_.data() : received_packed_.data();
    if (overlap_)
      check_mpi(MPI_Ialltoall(from, head, MPI_BYTE, into, head, MPI_BYTE, comm_, &request_), "MPI_Ialltoall (blocks)");
    else
      check_mpi(MPI_Alltoall(from, head, MPI_BYTE, into, head, MPI_BYTE, comm_), "MPI_Alltoall (blocks)");
    in_flight_ = true;
  }

  void receive_blocks() {
    if (two_hop_) return receive_frames(false, std::span<std::byte>(received_));
    if (block_head_ != core_.block_bytes()) unpack_heads(received_packed_, block_head_, std::span<std::byte>(received_));
  }

  // two_hop: each block as a frame, to every rank through its intermediate.
  void send_frames() {
    append_frames<T, Index>(std::span<const std::byte>(blocks_), std::size_t(ranks_), core_.plan().format, kind_of(false),
                            frame_bytes_, frames_);
    block_head_ = selection_head_ = 0;
    schedule_.start(frames_, true, digest(), 101);
    in_flight_ = true;  // phase 1 travels while the caller works, whatever overlap says
  }

  // two_hop: every rank's frame for this rank, as payloads into slots (P of block_bytes()).
  void receive_frames(bool selections, std::span<std::byte> slots) {
    const std::size_t bytes = core_.block_bytes();
    const reduce_plan& plan = core_.plan();
    const auto frames = schedule_.finish(
        plan.format, kind_of(selections),
        message_failure<T, Index>(std::size_t(rank_), plan.size, step_fields_, plan.format, failure_scratch_));
    read_frames<T, Index>(frames, detail::header_for<T, Index>(step_fields_, plan.size, plan.format), plan.format,
                          kind_of(selections), [&](std::size_t s) { return slots.subspan(s * bytes, bytes); });
    if (!selections) {
      blocks_sent_ = schedule_.bytes_sent();
      blocks_received_ = schedule_.bytes_received();
    }
  }

  frame_kind kind_of(bool selections) const { return frame_kind_for(selections, core_.coding()); }

  std::uint64_t digest() const {
    return fields_digest<T, Index>(step_fields_, core_.plan().size, core_.plan().format);
  }

  // Round 2: every owner's selection. At exact sizes, first at the blocks' head (an owner
  // keeps at most its share, received / P rounded: never more than the longest block), then,
  // when some selection is longer (a failure's message: its header says so, the same on
  // every rank), again at that one's size; selection_head_ adds up what each rank sent.
  void gather_selections() {
    const std::size_t bytes = core_.block_bytes();
    if (two_hop_) {
      append_frames<T, Index>(std::span<const std::byte>(selection_), 1, core_.plan().format, kind_of(true), frame_bytes_,
                              frames_);
      // Round 1 compared every rank's digest: a rank out of step is a failure in some
      // owner's selection, which every rank reads alike (its own digest would differ from
      // everyone's here: not compared).
      schedule_.start(frames_, false, digest(), 103, false);
      return receive_frames(true, std::span<std::byte>(selections_));
    }
    std::size_t head = exact_sizes_ ? block_head_ : bytes;
    allgather_heads(head);
    selection_head_ = head;
    if (!exact_sizes_) return;
    std::size_t longest = sizeof(wire_header);
    for (std::size_t r = 0; r < std::size_t(ranks_); ++r)
      longest = std::max(longest, used_bytes(std::span<const std::byte>(selections_).subspan(r * bytes, bytes),
                                             core_.plan().format));
    if (longest <= head) return;
    allgather_heads(longest);
    selection_head_ += longest;
  }

  void allgather_heads(std::size_t head) {
    const bool whole = head == core_.block_bytes();
    if (!whole) selections_packed_.resize(head * std::size_t(ranks_));
    check_mpi(MPI_Allgather(selection_.data(), int(head), MPI_BYTE, whole ? selections_.data() : selections_packed_.data(),
                            int(head), MPI_BYTE, comm_),
              "MPI_Allgather (selections)");
    if (!whole) unpack_heads(selections_packed_, head, std::span<std::byte>(selections_));
  }

  MPI_Comm comm_;
  bool overlap_ = true, exact_sizes_ = false, two_hop_ = false;
  // two_hop: the schedule on a communicator of its own, this step's frames and fields.
  MPI_Comm own_comm_ = MPI_COMM_NULL;
  mpi::two_hop schedule_;
  std::vector<std::byte> frame_bytes_, failure_scratch_;
  std::vector<std::span<const std::byte>> frames_;
  wire_fields step_fields_;
  std::size_t blocks_sent_ = 0, blocks_received_ = 0;
  int ranks_ = 1, rank_ = 0;
  reduce_core<T, Index, Policy> core_;
  std::vector<std::byte> blocks_, received_, selection_, selections_;
  std::vector<std::byte> blocks_packed_, received_packed_, selections_packed_;  // heads, one after another
  std::size_t block_head_ = 0, selection_head_ = 0;                          // this step's
  std::span<T> residual_;
  MPI_Request request_ = MPI_REQUEST_NULL;
  bool in_flight_ = false;
};

}  // namespace sidco::comm
