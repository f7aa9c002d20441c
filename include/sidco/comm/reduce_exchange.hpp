// The reduce-scatter exchange over MPI (comm/reduce/core.hpp): one MPI_Ialltoall of
// fixed-size blocks to the indices' owners (a hash of the index), each owner's selection, one
// MPI_Allgather of the owners' selections. Bytes per rank about 2 slack 8k per step whatever
// the number of ranks, where the all-gather (comm/exchange.hpp) moves (P - 1) slack 8k.
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
#include "sidco/comm/options.hpp"
#include "sidco/comm/reduce/core.hpp"
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
      : comm_(comm), overlap_(options.overlap) {
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

  /// Mid-step (a throw between start() and wait()): finishes round 1, sends every rank a
  /// failure in round 2, so that no peer waits forever and every peer's wait() raises it.
  ~sparse_reduce_exchange() {
    if (!in_flight_) return;
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized) return;
    MPI_Wait(&request_, MPI_STATUS_IGNORE);
    const sidco::runtime_error reason(sidco::detail::message(
        "sparse_reduce_exchange: rank ", rank_, "'s exchange was destroyed between start() and wait()"));
    try {
      core_.select(received_views(), std::span<std::byte>(selection_), &reason);
    } catch (...) {
    }
    const int bytes = int(core_.block_bytes());
    MPI_Allgather(selection_.data(), bytes, MPI_BYTE, selections_.data(), bytes, MPI_BYTE, comm_);
    core_.abandon();
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
    begin();
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
    begin();
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
    check_mpi(MPI_Wait(&request_, MPI_STATUS_IGNORE), "MPI_Wait (blocks)");
    const std::size_t size = core_.plan().size;
    const sidco::error wrong_dense(sidco::detail::message("sparse_reduce_exchange: rank ", rank_, "'s dense: size ",
                                                          dense.size(), " is not the exchange's ", size));
    core_.select(received_views(), std::span<std::byte>(selection_), dense.size() == size ? nullptr : &wrong_dense);
    const int bytes = int(core_.block_bytes());
    check_mpi(MPI_Allgather(selection_.data(), bytes, MPI_BYTE, selections_.data(), bytes, MPI_BYTE, comm_),
              "MPI_Allgather (selections)");
    std::vector<std::span<const std::byte>> views(static_cast<std::size_t>(ranks_));
    for (std::size_t r = 0; r < views.size(); ++r)
      views[r] = std::span<const std::byte>(selections_).subspan(r * std::size_t(bytes), std::size_t(bytes));
    host_residual<T> sink{residual_};
    const reduce_report& report = core_.apply(views, sink);
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

  void begin() {
    if (in_flight_) sidco::detail::fail("sparse_reduce_exchange: start() twice without wait()");
  }

  std::vector<std::span<const std::byte>> received_views() const {
    const std::size_t bytes = core_.block_bytes();
    std::vector<std::span<const std::byte>> views(static_cast<std::size_t>(ranks_));
    for (std::size_t r = 0; r < views.size(); ++r) views[r] = std::span<const std::byte>(received_).subspan(r * bytes, bytes);
    return views;
  }

  void send_blocks() {
    const int bytes = int(core_.block_bytes());
    if (overlap_)
      check_mpi(MPI_Ialltoall(blocks_.data(), bytes, MPI_BYTE, received_.data(), bytes, MPI_BYTE, comm_, &request_),
                "MPI_Ialltoall (blocks)");
    else
      check_mpi(MPI_Alltoall(blocks_.data(), bytes, MPI_BYTE, received_.data(), bytes, MPI_BYTE, comm_),
                "MPI_Alltoall (blocks)");
    in_flight_ = true;
  }

  MPI_Comm comm_;
  bool overlap_ = true;
  int ranks_ = 1, rank_ = 0;
  reduce_core<T, Index, Policy> core_;
  std::vector<std::byte> blocks_, received_, selection_, selections_;
  std::span<T> residual_;
  MPI_Request request_ = MPI_REQUEST_NULL;
  bool in_flight_ = false;
};

}  // namespace sidco::comm
