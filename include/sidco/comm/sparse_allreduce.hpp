// Sparse all-reduce over MPI: every rank contributes a sparse vector; every rank gets the
// dense sum (or average) of all of them. Needs MPI (include <mpi.h> is done here).
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <exception>
#include <string>
#include <limits>
#include <span>
#include <type_traits>
#include <utility>
#include <vector>

#ifndef OMPI_SKIP_MPICXX
#define OMPI_SKIP_MPICXX 1  // the deprecated C++ bindings only add warnings
#endif
#include <mpi.h>

#include "sidco/backend/host/scatter_add.hpp"
#include "sidco/comm/header.hpp"
#include "sidco/comm/mpi_support.hpp"
#include "sidco/comm/report.hpp"
#include "sidco/core/error.hpp"
#include "sidco/core/sparse_vector.hpp"

namespace sidco::comm {

namespace detail {

template <class T>
MPI_Datatype mpi_type() {
  if constexpr (std::is_same_v<T, float>) return MPI_FLOAT;
  else if constexpr (std::is_same_v<T, double>) return MPI_DOUBLE;
  else if constexpr (std::is_same_v<T, std::uint32_t>) return MPI_UINT32_T;
  else if constexpr (std::is_same_v<T, std::uint64_t>) return MPI_UINT64_T;
  else static_assert(sizeof(T) == 0, "sparse_allreduce: no MPI type for this element type");
}

inline void check_mpi(int status, const char* what) { mpi::check(status, "sparse_allreduce", what); }

}  // namespace detail

/// One per tensor (or per communicator and tensor size): keeps the gather buffers, so that
/// steady training allocates only on its first steps. Not thread-safe; one call at a time.
///
/// Every rank calls with the same dense size and density; a rank whose arguments differ, or
/// whose compress threw and that calls allreduce_failed(), makes every rank throw the same
/// sidco::error naming the rank and the values or the reason (no hang, no crash). Counts may
/// differ: nothing is padded or dropped. The result is identical on every rank (entries are
/// added in rank order).
template <class T, class Index = std::uint32_t>
class sparse_allreducer {
 public:
  explicit sparse_allreducer(MPI_Comm comm) : comm_(comm) {
    detail::check_mpi(MPI_Comm_size(comm_, &ranks_), "MPI_Comm_size");
    detail::check_mpi(MPI_Comm_rank(comm_, &rank_), "MPI_Comm_rank");
  }

  sparse_allreducer(const sparse_allreducer&) = delete;
  sparse_allreducer& operator=(const sparse_allreducer&) = delete;
  sparse_allreducer& operator=(sparse_allreducer&&) = delete;
  /// The moved-from allreducer has nothing in flight (the buffers move with their addresses).
  sparse_allreducer(sparse_allreducer&& other) noexcept
      : comm_(other.comm_), ranks_(other.ranks_), rank_(other.rank_), in_flight_(std::exchange(other.in_flight_, false)),
        op_(other.op_), dense_(other.dense_), report_(other.report_),
        requests_{std::exchange(other.requests_[0], MPI_REQUEST_NULL), std::exchange(other.requests_[1], MPI_REQUEST_NULL)},
        headers_(std::move(other.headers_)), counts_(std::move(other.counts_)),
        displacements_(std::move(other.displacements_)), gathered_indices_(std::move(other.gathered_indices_)),
        gathered_values_(std::move(other.gathered_values_)) {}

  /// Completes the gathers still in flight (a throw between start() and wait()), so that MPI
  /// never writes into freed buffers; dense is left as MPI wrote it.
  ~sparse_allreducer() {
    if (in_flight_) mpi::complete(requests_, 2);
  }

  int ranks() const { return ranks_; }
  int rank() const { return rank_; }

  /// Blocking: dense (overwritten) = sum or average over ranks of their sparse vectors.
  allreduce_report allreduce(const sparse_vector<T, Index>& mine, double delta, std::span<T> dense,
                             reduction op = reduction::average) {
    start(mine, delta, dense, op);
    return wait();
  }

  /// Non-blocking: agrees on sizes (a small blocking exchange), then starts the gathers and
  /// returns; compress the next tensor meanwhile, then wait(). `mine` and `dense` must stay
  /// alive and untouched until wait() returns.
  void start(const sparse_vector<T, Index>& mine, double delta, std::span<T> dense,
             reduction op = reduction::average) {
    if (in_flight_) sidco::detail::fail("sparse_allreduce: start() called twice without wait()");
    // What can fail on this rank alone is checked before the headers and sent in them: a
    // throw after them would leave the other ranks waiting in the payload's collective.
    detail::rank_status state = detail::rank_status::ok;
    std::string reason;
    if (dense.size() != mine.dense_size()) {
      state = detail::rank_status::dense_mismatch;
    } else {
      try {
        backend::host::check_scatter("sparse_allreduce: this rank's sparse vector", mine.dense_size(),
                                     mine.indices().data(), mine.size(), dense.size());
      } catch (const sidco::error& e) {
        state = detail::rank_status::failed;
        reason = e.what();
      }
    }
    exchange_headers(mine.dense_size(), mine.size(), delta, op, state, reason.c_str());
    dense_ = dense;
    op_ = op;
    report_ = {};
    report_.ranks = ranks_;
    counts_.resize(std::size_t(ranks_));
    displacements_.resize(std::size_t(ranks_));
    std::size_t total = 0;
    for (int r = 0; r < ranks_; ++r) {
      const std::uint64_t count = headers_[std::size_t(r)].count;
      if (count > std::uint64_t(std::numeric_limits<int>::max()) ||
          total + count > std::size_t(std::numeric_limits<int>::max()))
        sidco::detail::fail("sparse_allreduce: ", total + count, " entries exceed MPI's int counts");
      counts_[std::size_t(r)] = int(count);
      displacements_[std::size_t(r)] = int(total);
      total += count;
    }
    report_.gathered = total;
    const std::size_t sparse_bytes = total * (sizeof(Index) + sizeof(T));
    const std::size_t dense_bytes = dense.size() * sizeof(T);
    if (sparse_bytes >= dense_bytes) {
      // Gathering would move more than the dense vector: reduce it densely instead.
      report_.taken = path::dense;
      report_.bytes = dense_bytes;
      std::fill(dense.begin(), dense.end(), T(0));
      backend::host::add_checked(mine.indices().data(), mine.values().data(), mine.size(), dense.data(), T(1));
      if (dense.size() > std::size_t(std::numeric_limits<int>::max()))
        sidco::detail::fail("sparse_allreduce: dense size ", dense.size(), " exceeds MPI's int counts");
      detail::check_mpi(MPI_Iallreduce(MPI_IN_PLACE, dense.data(), int(dense.size()), detail::mpi_type<T>(),
                                       MPI_SUM, comm_, &requests_[0]),
                        "MPI_Iallreduce");
      requests_[1] = MPI_REQUEST_NULL;
    } else {
      report_.taken = path::sparse;
      report_.bytes = sparse_bytes;
      gathered_indices_.resize(total);
      gathered_values_.resize(total);
      detail::check_mpi(MPI_Iallgatherv(mine.indices().data(), int(mine.size()), detail::mpi_type<Index>(),
                                        gathered_indices_.data(), counts_.data(), displacements_.data(),
                                        detail::mpi_type<Index>(), comm_, &requests_[0]),
                        "MPI_Iallgatherv of indices");
      detail::check_mpi(MPI_Iallgatherv(mine.values().data(), int(mine.size()), detail::mpi_type<T>(),
                                        gathered_values_.data(), counts_.data(), displacements_.data(),
                                        detail::mpi_type<T>(), comm_, &requests_[1]),
                        "MPI_Iallgatherv of values");
    }
    in_flight_ = true;
  }

  /// For a rank whose compress threw (say, on a NaN): joins the exchange the other ranks are
  /// in, so that none of them hangs, and throws, as every rank does, the sidco::error that
  /// names this rank and the reason. Call it where the others call allreduce or start (the
  /// exchanges' start_failed is its non-blocking twin).
  [[noreturn]] void allreduce_failed(const std::exception& reason, std::size_t dense_size, double delta) {
    if (in_flight_) sidco::detail::fail("sparse_allreduce: allreduce_failed() while an exchange is in flight");
    exchange_headers(dense_size, 0, delta, reduction::average, detail::rank_status::failed, reason.what());
    sidco::detail::fail("sparse_allreduce: rank ", rank_, " failed: ", reason.what());  // not reached
  }
  [[deprecated("renamed allreduce_failed")]] [[noreturn]] void abandon(const std::exception& reason,
                                                                        std::size_t dense_size, double delta) {
    allreduce_failed(reason, dense_size, delta);
  }

  /// Completes the last start(): dense holds the sum or average.
  allreduce_report wait() {
    if (!in_flight_) sidco::detail::fail("sparse_allreduce: wait() without start()");
    in_flight_ = false;
    detail::check_mpi(MPI_Waitall(2, requests_, MPI_STATUSES_IGNORE), "MPI_Waitall");
    if (report_.taken == path::sparse) {
      // Every rank's entries, in rank order: the same sums on every rank.
      backend::host::check_scatter("sparse_allreduce: the gathered entries", dense_.size(), gathered_indices_.data(),
                                   gathered_indices_.size(), dense_.size());
      std::fill(dense_.begin(), dense_.end(), T(0));
      backend::host::add_checked(gathered_indices_.data(), gathered_values_.data(), gathered_indices_.size(),
                                 dense_.data(), T(1));
    }
    if (op_ == reduction::average) {
      const T scale = T(1) / T(ranks_);
      for (auto& v : dense_) v *= scale;
    }
    return report_;
  }

 private:
  // Every rank's header, all-gathered first; the same error on every rank when one failed
  // or disagrees.
  void exchange_headers(std::size_t dense_size, std::size_t count, double delta, reduction op, detail::rank_status state,
                        const char* reason) {
    const detail::rank_header mine = detail::make_header(dense_size, count, delta, op, state, reason);
    headers_.resize(std::size_t(ranks_));
    detail::check_mpi(MPI_Allgather(&mine, int(sizeof mine), MPI_BYTE, headers_.data(), int(sizeof mine), MPI_BYTE, comm_),
                      "MPI_Allgather of sizes");
    detail::check_headers(headers_);
  }

  MPI_Comm comm_;
  int ranks_ = 1, rank_ = 0;
  bool in_flight_ = false;
  reduction op_ = reduction::average;
  std::span<T> dense_;
  allreduce_report report_;
  MPI_Request requests_[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};
  std::vector<detail::rank_header> headers_;
  std::vector<int> counts_, displacements_;
  std::vector<Index> gathered_indices_;
  std::vector<T> gathered_values_;
};

/// One-shot convenience: a fresh allreducer per call (allocates; keep a sparse_allreducer
/// for training loops).
template <class T, class Index>
allreduce_report sparse_allreduce(MPI_Comm comm, const sparse_vector<T, Index>& mine, double delta,
                                  std::span<T> dense, reduction op = reduction::average) {
  return sparse_allreducer<T, Index>(comm).allreduce(mine, delta, dense, op);
}

}  // namespace sidco::comm
