// The all-gather exchange over MPI (comm/allgather/core.hpp): every rank packs its selection
// into a payload of fixed size, one MPI_Iallgather moves every payload, and wait() decodes the
// rank-order sum or average, or raises on every rank alike what went wrong on any rank.
// The PyTorch hook speaks the same format over torch.distributed. Needs MPI.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <limits>
#include <span>
#include <utility>
#include <vector>

#ifndef OMPI_SKIP_MPICXX
#define OMPI_SKIP_MPICXX 1  // the deprecated C++ bindings only add warnings
#endif
#include <mpi.h>

#include "sidco/comm/allgather/core.hpp"
#include "sidco/comm/mpi_support.hpp"
#include "sidco/comm/options.hpp"
#include "sidco/comm/residual_sink.hpp"
#include "sidco/comm/setup.hpp"
#include "sidco/core/error.hpp"
#include "sidco/core/segment.hpp"
#include "sidco/core/sparse_vector.hpp"

namespace sidco::comm {

/// One tensor's (or one buffer of tensors') exchange, reused every step: its capacity,
/// payload and receive buffers are allocated once.
///
///   sparse_exchange<float> exchange(MPI_COMM_WORLD, layout, delta);
///   try {
///     compressor.compress<float>(gradient, delta, sent, residual);
///     exchange.start(sent, residual.values(), step);     // trims, packs, MPI_Iallgather
///   } catch (const std::exception& e) {
///     exchange.start_failed(e, step);                     // the others are waiting for it
///   }
///   ... compress the next tensor meanwhile ...
///   exchange.wait(dense);   // the rank-order average, or the same error on every rank
///
/// Every rank must construct its exchanges, and call start (or start_failed) and wait, in the
/// same order; ranks whose layouts, densities or options differ are refused by every rank's
/// constructor, and a rank at another step or tag makes every rank's wait() throw naming
/// it. Not thread-safe: one exchange, one thread (two threads in one exchange race on its
/// buffers, and nothing detects it).
template <class T, class Index = std::uint32_t>
class sparse_exchange {
 public:
  /// Collective: every rank constructs its exchanges in the same order. The ranks agree here
  /// on everything that decides the payload's size (layout, density, options, types): a
  /// rank whose differ, or that cannot set up (an invalid argument, no memory), makes every
  /// rank's constructor throw the same sidco::runtime_error naming it.
  sparse_exchange(MPI_Comm comm, std::vector<segment> layout, double delta, exchange_options options = {})
      : comm_(comm), delta_(delta), options_(options) {
    check_mpi(MPI_Comm_size(comm_, &ranks_), "MPI_Comm_size");
    check_mpi(MPI_Comm_rank(comm_, &rank_), "MPI_Comm_rank");
    exchange_setup mine{};
    try {
      core_ = allgather_core<T, Index>(layout, delta, options.slack, options.coding, options.trim_limit);
      if (core_.format().bytes() > std::size_t(std::numeric_limits<int>::max()))
        sidco::detail::fail("sparse_exchange: a payload of ", core_.format().bytes(), " bytes exceeds MPI's int counts");
      if (options.exact_sizes && core_.format().bytes() * std::size_t(ranks_) > std::size_t(std::numeric_limits<int>::max()))
        sidco::detail::fail("sparse_exchange: ", ranks_, " payloads of ", core_.format().bytes(),
                            " bytes exceed MPI_Allgatherv's int displacements");
      payload_.resize(core_.format().bytes());
      inbox_.resize(core_.format().bytes() * std::size_t(ranks_));
      sizes_.resize(std::size_t(ranks_));
      mine = setup_of<T, Index>(layout, core_.format(), fields(0), options.slack);
      mine.exact_sizes = options.exact_sizes;
    } catch (const std::exception& e) {
      mine = failed_setup(e, options.tag);
    }
    mpi::agree_setup(comm_, ranks_, mine, "sparse_exchange");
  }

  sparse_exchange(const sparse_exchange&) = delete;
  sparse_exchange& operator=(const sparse_exchange&) = delete;
  /// The moved-from exchange has nothing in flight (the buffers move with their addresses).
  sparse_exchange(sparse_exchange&& other) noexcept
      : comm_(other.comm_), ranks_(other.ranks_), rank_(other.rank_), delta_(other.delta_), options_(other.options_),
        core_(std::move(other.core_)), payload_(std::move(other.payload_)), inbox_(std::move(other.inbox_)),
        sizes_(std::move(other.sizes_)), used_(other.used_), residual_(other.residual_),
        request_(std::exchange(other.request_, MPI_REQUEST_NULL)), in_flight_(std::exchange(other.in_flight_, false)) {}
  sparse_exchange& operator=(sparse_exchange&&) = delete;

  /// Completes an all-gather still in flight (a throw between start() and wait()), so that
  /// MPI never writes into freed buffers; the other ranks' wait() is not disturbed (with
  /// exact_sizes it joins their payloads' all-gather with a payload saying it was destroyed:
  /// their wait() raises that). What this rank sent is not returned to its residual (it may
  /// be gone by now): call wait() to keep it.
  ~sparse_exchange() {
    if (!in_flight_) return;
    mpi::complete(&request_, 1);
    if (!options_.exact_sizes) return;
    const std::uint64_t step = header_of(payload_).sequence;
    core_.encode_failure(sidco::runtime_error("sparse_exchange: destroyed between start() and wait() (a throw on "
                                              "that rank?)"), fields(step), std::span<std::byte>(payload_));
    // The size this rank announced is what its peers receive: the message cut to fit it.
    wire_header h = header_of(payload_);
    h.count = std::min<std::uint64_t>(h.count, used_ - sizeof(wire_header));
    std::memcpy(payload_.data(), &h, sizeof h);
    try {
      gather_payloads(used_);
    } catch (...) {  // a destructor does not throw; the peers raise what they received
    }
  }

  /// One tensor of size values.
  sparse_exchange(MPI_Comm comm, std::size_t size, double delta, exchange_options options = {})
      : sparse_exchange(comm, std::vector<segment>{{0, size}}, delta, options) {}

  int ranks() const { return ranks_; }
  int rank() const { return rank_; }
  const wire_format& format() const { return core_.format(); }
  const capacity_plan& capacities() const { return core_.capacities(); }

  /// Trims sent to each segment's capacity (what it removes goes back into residual, when
  /// given: nothing is lost), packs it and starts the all-gather. A problem with the
  /// arguments on this rank is sent instead, so that every rank's wait() throws it.
  /// sent (as trimmed), residual and dense must stay alive until wait() returns.
  void start(sparse_vector<T, Index>& sent, std::span<T> residual, std::uint64_t step) {
    begin();
    residual_ = {};
    if (!residual.empty() && residual.size() != core_.size()) {
      const sidco::error wrong(sidco::detail::message("sparse_exchange: residual: size ", residual.size(),
                                                      " is not the exchange's ", core_.size()));
      core_.encode_failure(wrong, fields(step), std::span<std::byte>(payload_));
      return send();
    }
    residual_ = residual;
    host_residual<T> sink{residual};
    core_.encode(sent, sink, fields(step), std::span<std::byte>(payload_));
    send();
  }

  /// For a rank whose compress threw: sends the reason instead of entries; every rank's
  /// wait() then throws it, naming this rank.
  void start_failed(const std::exception& reason, std::uint64_t step) {
    begin();
    residual_ = {};
    core_.encode_failure(reason, fields(step), std::span<std::byte>(payload_));
    send();
  }

  /// Completes the last start: dense (overwritten) = the rank-order sum or average of every
  /// rank's entries. On any rank's failure or disagreement it throws sidco::runtime_error,
  /// the same on every rank, having written nothing to dense and returned this rank's sent
  /// entries to its residual.
  exchange_report wait(std::span<T> dense) {
    if (!in_flight_) sidco::detail::fail("sparse_exchange: wait() without start()");
    in_flight_ = false;
    check_mpi(MPI_Wait(&request_, MPI_STATUS_IGNORE), "MPI_Wait");
    const std::size_t bytes = core_.format().bytes();
    if (options_.exact_sizes) {
      try {
        gather_payloads(used_);
      } catch (const runtime_error&) {
        host_residual<T> sink{residual_};
        core_.give_back_sent(sink);
        throw;
      }
    }
    std::vector<std::span<const std::byte>> views(static_cast<std::size_t>(ranks_));
    for (std::size_t r = 0; r < views.size(); ++r) views[r] = std::span<const std::byte>(inbox_).subspan(r * bytes, bytes);
    host_residual<T> sink{residual_};
    exchange_report report = core_.decode(views, dense, sink);
    if (options_.exact_sizes) report.bytes = std::size_t(used_);
    return report;
  }

 private:
  static void check_mpi(int status, const char* what) { mpi::check(status, "sparse_exchange", what); }

  void begin() {
    if (in_flight_) sidco::detail::fail("sparse_exchange: start() twice without wait()");
  }

  wire_fields fields(std::uint64_t step) const { return {options_.tag, step, delta_, options_.op}; }

  void send() {
    const int bytes = int(core_.format().bytes());
    used_ = core_.used_bytes();
    if (options_.exact_sizes) {  // the sizes now; the payloads in wait()
      if (options_.overlap)
        check_mpi(MPI_Iallgather(&used_, 1, MPI_UINT64_T, sizes_.data(), 1, MPI_UINT64_T, comm_, &request_),
                  "MPI_Iallgather");
      else
        check_mpi(MPI_Allgather(&used_, 1, MPI_UINT64_T, sizes_.data(), 1, MPI_UINT64_T, comm_), "MPI_Allgather");
      in_flight_ = true;
      return;
    }
    if (options_.overlap)
      check_mpi(MPI_Iallgather(payload_.data(), bytes, MPI_BYTE, inbox_.data(), bytes, MPI_BYTE, comm_, &request_),
                "MPI_Iallgather");
    else
      check_mpi(MPI_Allgather(payload_.data(), bytes, MPI_BYTE, inbox_.data(), bytes, MPI_BYTE, comm_), "MPI_Allgather");
    in_flight_ = true;
  }

  /// exact_sizes: every rank's payload at the size it said (sizes_), this rank's being mine
  /// bytes, into its slot of the inbox; the rest of each slot zeroed (what pack left zero).
  /// Every rank reads the same sizes, so all call the collective or none.
  void gather_payloads(std::uint64_t mine) {
    const std::size_t bytes = core_.format().bytes();
    std::vector<int> counts(sizes_.size()), offsets(sizes_.size());
    for (std::size_t r = 0; r < sizes_.size(); ++r) {
      if (sizes_[r] < sizeof(wire_header) || sizes_[r] > bytes)
        throw runtime_error(sidco::detail::message("sparse_exchange (tag ", options_.tag, "): rank ", r,
                                                   " announced a payload of ", sizes_[r], " bytes, outside [",
                                                   sizeof(wire_header), ", ", bytes, "] (mixed sidco versions?)"));
      counts[r] = int(sizes_[r]);
      offsets[r] = int(r * bytes);
    }
    check_mpi(MPI_Allgatherv(payload_.data(), int(mine), MPI_BYTE, inbox_.data(), counts.data(), offsets.data(),
                             MPI_BYTE, comm_),
              "MPI_Allgatherv");
    for (std::size_t r = 0; r < sizes_.size(); ++r)
      std::fill(inbox_.begin() + std::ptrdiff_t(r * bytes + sizes_[r]), inbox_.begin() + std::ptrdiff_t((r + 1) * bytes),
                std::byte{0});
  }

  MPI_Comm comm_;
  int ranks_ = 1, rank_ = 0;
  double delta_;
  exchange_options options_;
  allgather_core<T, Index> core_;
  std::vector<std::byte> payload_, inbox_;
  std::vector<std::uint64_t> sizes_;  // exact_sizes: every rank's payload size this step
  std::uint64_t used_ = 0;            // this rank's, this step
  std::span<T> residual_;
  MPI_Request request_ = MPI_REQUEST_NULL;
  bool in_flight_ = false;
};

}  // namespace sidco::comm
