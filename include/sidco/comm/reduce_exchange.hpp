// The reduce-scatter exchange over MPI (comm/reduce_scatter.hpp): one MPI_Ialltoall of
// fixed-size blocks to the regions' owners, each owner's selection of its region's reduced
// values, one MPI_Iallgather of the owners' selections. Bytes per rank about 2 slack 8k per
// step whatever the number of ranks, where the one-round exchange (comm/exchange.hpp) moves
// (P - 1) slack 8k. Needs MPI.
#pragma once

#include <cstddef>
#include <cstdint>
#include <exception>
#include <limits>
#include <span>
#include <string>
#include <utility>
#include <vector>

#ifndef OMPI_SKIP_MPICXX
#define OMPI_SKIP_MPICXX 1  // the deprecated C++ bindings only add warnings
#endif
#include <mpi.h>

#include "sidco/comm/exchange.hpp"
#include "sidco/comm/reduce_scatter.hpp"
#include "sidco/comm/regions.hpp"
#include "sidco/comm/mpi_support.hpp"
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
///   exchange.wait(dense);  // owners select, MPI_Iallgather: the same update on every rank
///
/// As sparse_exchange: construction is collective and agrees on the payload's size; every
/// rank calls start (or start_failed) and wait in the same order; a failure on any rank, in
/// either round, is the same sidco::runtime_error on every rank, with every rank's sent
/// entries back in its residual. sent (as trimmed), residual and dense must stay alive until
/// wait() returns. Not thread-safe: one exchange, one thread.
template <class T, class Index = std::uint32_t, class Policy = owner_sidco_e>
class sparse_reduce_exchange {
 public:
  sparse_reduce_exchange(MPI_Comm comm, std::vector<segment> layout, double delta, exchange_options options = {},
                         Policy policy = {})
      : comm_(comm), delta_(delta), options_(options), policy_(std::move(policy)) {
    check_mpi(MPI_Comm_size(comm_, &ranks_), "MPI_Comm_size");
    check_mpi(MPI_Comm_rank(comm_, &rank_), "MPI_Comm_rank");
    exchange_setup mine{};
    try {
      plan_ = plan_reduce<T, Index>(layout, delta, options.slack, std::size_t(ranks_));
      if (plan_.size > sparse_vector<T, Index>::max_dense_size)
        sidco::detail::fail("sparse_reduce_exchange: ", plan_.size, " values exceed the ", 8 * sizeof(Index),
                            "-bit index range");
      if (plan_.format.bytes() * std::size_t(ranks_) > std::size_t(std::numeric_limits<int>::max()))
        sidco::detail::fail("sparse_reduce_exchange: ", ranks_, " blocks of ", plan_.format.bytes(),
                            " bytes exceed MPI's int counts");
      regions_ = regions::even(plan_.size, std::size_t(ranks_));
      blocks_.resize(plan_.format.bytes() * std::size_t(ranks_));
      received_.resize(blocks_.size());
      selection_.resize(plan_.format.bytes());
      selections_.resize(blocks_.size());
      mine = setup_of<T, Index>(layout, plan_.format, fields(0), options.slack);
    } catch (const std::exception& e) {
      mine = failed_setup(e, options.tag);
    }
    mpi::agree_setup(comm_, ranks_, mine, "sparse_reduce_exchange");
  }

  /// One tensor of size values.
  sparse_reduce_exchange(MPI_Comm comm, std::size_t size, double delta, exchange_options options = {},
                         Policy policy = {})
      : sparse_reduce_exchange(comm, std::vector<segment>{{0, size}}, delta, options, std::move(policy)) {}

  sparse_reduce_exchange(const sparse_reduce_exchange&) = delete;
  sparse_reduce_exchange& operator=(const sparse_reduce_exchange&) = delete;

  /// Completes a round still in flight (a throw between start() and wait()), so that MPI
  /// never writes into freed buffers. The all-gather of round 2 only runs inside wait().
  ~sparse_reduce_exchange() {
    if (in_flight_) mpi::complete(&request_, 1);
  }

  int ranks() const { return ranks_; }
  int rank() const { return rank_; }
  const reduce_plan& plan() const { return plan_; }
  /// The regions the next start() splits by (balanced from the last global selection).
  const regions& current_regions() const { return regions_; }
  /// The last global selection's indices, ascending (the same on every rank).
  std::span<const Index> global_selection() const { return global_; }
  Policy& policy() { return policy_; }

  /// Splits sent by region into blocks of the plan's capacity (what does not fit goes back
  /// into residual, when given) and starts the all-to-all. A problem with the arguments on
  /// this rank is sent instead, for every rank's wait() to raise.
  void start(sparse_vector<T, Index>& sent, std::span<T> residual, std::uint64_t step) {
    begin(step);
    sent_ = &sent;
    residual_ = residual;
    bool checked = false;
    try {
      check_step_sizes(plan_, residual.size(), sent.dense_size());
      checked = true;
      report_.trimmed = pack_blocks(sent, regions_, plan_, fields(step), residual, std::span<std::byte>(blocks_));
      report_.sent = sent.size();
    } catch (const std::exception& e) {
      if (checked) return_entries(sent, residual);
      sent_ = nullptr;
      pack_failed_blocks<T, Index>(e, plan_, fields(step), std::span<std::byte>(blocks_));
    }
    send_blocks();
  }

  /// For a rank whose compress threw: sends the reason in every block; every rank's wait()
  /// raises it, naming this rank.
  void start_failed(const std::exception& reason, std::uint64_t step) {
    begin(step);
    sent_ = nullptr;
    residual_ = {};
    pack_failed_blocks<T, Index>(reason, plan_, fields(step), std::span<std::byte>(blocks_));
    send_blocks();
  }

  /// Completes the step: this rank's region selected from the blocks it received, every
  /// owner's selection all-gathered, dense (overwritten) = the global selection's sums (or
  /// averages), the same bits on every rank. On any rank's failure it throws
  /// sidco::runtime_error, the same on every rank, having written nothing to dense and
  /// returned every entry this rank sent to its residual.
  reduce_report wait(std::span<T> dense) {
    if (!in_flight_) sidco::detail::fail("sparse_reduce_exchange: wait() without start()");
    in_flight_ = false;
    check_mpi(MPI_Wait(&request_, MPI_STATUS_IGNORE), "MPI_Wait (blocks)");
    const std::size_t bytes = plan_.format.bytes();
    std::vector<std::span<const std::byte>> views(static_cast<std::size_t>(ranks_));
    for (std::size_t r = 0; r < views.size(); ++r) views[r] = std::span<const std::byte>(received_).subspan(r * bytes, bytes);
    select_region<T, Index>(views, regions_, std::size_t(rank_), plan_, fields(step_), policy_,
                            std::span<std::byte>(selection_), report_, reduced_);
    check_mpi(MPI_Allgather(selection_.data(), int(bytes), MPI_BYTE, selections_.data(), int(bytes), MPI_BYTE, comm_),
              "MPI_Allgather (selections)");
    for (std::size_t r = 0; r < views.size(); ++r)
      views[r] = std::span<const std::byte>(selections_).subspan(r * bytes, bytes);
    report_.ranks = ranks_;
    report_.target = plan_.target;
    report_.bytes_sent = report_.bytes_received = 2 * (std::size_t(ranks_) - 1) * bytes;
    static const sparse_vector<T, Index> nothing;
    apply_selections<T, Index>(views, regions_, plan_, sent_ ? *sent_ : nothing, residual_, dense, global_, report_);
    regions_ = regions::balanced<Index>(global_, plan_.size, std::size_t(ranks_));
    return report_;
  }

  /// What a checkpoint needs to resume bit for bit: the regions and the owner policy's
  /// state (the local compressor and residual are the caller's).
  void save_state(state_writer& out) const { save_reduce_state(out, regions_, policy_); }
  void load_state(state_reader& in) { load_reduce_state(in, plan_, regions_, policy_); }

 private:
  static void check_mpi(int status, const char* what) { mpi::check(status, "sparse_reduce_exchange", what); }

  void begin(std::uint64_t step) {
    if (in_flight_) sidco::detail::fail("sparse_reduce_exchange: start() twice without wait()");
    step_ = step;
    report_ = {};
  }

  wire_fields fields(std::uint64_t step) const { return {options_.tag, step, delta_, options_.op}; }

  void send_blocks() {
    const int bytes = int(plan_.format.bytes());
    check_mpi(MPI_Ialltoall(blocks_.data(), bytes, MPI_BYTE, received_.data(), bytes, MPI_BYTE, comm_, &request_),
              "MPI_Ialltoall (blocks)");
    in_flight_ = true;
  }

  MPI_Comm comm_;
  int ranks_ = 1, rank_ = 0;
  double delta_;
  exchange_options options_;
  Policy policy_;
  reduce_plan plan_;
  regions regions_;
  std::vector<std::byte> blocks_, received_, selection_, selections_;
  std::vector<Index> global_;
  owner_workspace<T, Index> reduced_;  // the owner's workspace, kept from step to step
  sparse_vector<T, Index>* sent_ = nullptr;
  std::span<T> residual_;
  std::uint64_t step_ = 0;
  reduce_report report_;
  MPI_Request request_ = MPI_REQUEST_NULL;
  bool in_flight_ = false;
};

}  // namespace sidco::comm
