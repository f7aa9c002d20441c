// Sparse all-reduce of device buffers over NCCL: every rank contributes a sparse vector in
// device memory; every rank gets the dense sum (or average) of all of them, with the same
// bits on every rank.
//
// Counts are exchanged first (one small all-gather, carrying each rank's dense size,
// density and an error flag), then the payload by one padded ncclAllGather of indices and
// one of values, each rank's block as long as the largest count. Padded all-gather rather
// than grouped ncclSend/ncclRecv: it is a single collective NCCL runs on its ring or tree
// algorithms, where P^2 point-to-point messages are not, and SIDCo's counts differ between
// ranks by a few percent, so the padding costs little. The blocks are then scatter-added in
// rank order (no atomics: indices within one vector are distinct), so every rank adds the
// same numbers in the same order. When the gathered entries would outweigh the dense
// vector (delta P >~ 1) it reduces densely with ncclAllReduce instead.
//
// Failures: what one rank can get wrong (sizes, densities, reduction, a compress that
// threw) travels in the header exchange, so every rank throws the same sidco::error. A
// runtime failure after it (a CUDA or NCCL call, buffer growth, an asynchronous NCCL error
// such as a peer that died, or no progress within the timeout: 10 minutes unless given,
// comm::default_collective_timeout) aborts the communicator (comm/nccl_link.cuh) so that
// the other ranks' collectives fail instead of waiting, and throws sidco::runtime_error.
// After an abort the communicator is gone (do not use or destroy it): every rank must
// create a new communicator and a new allreducer; this allreducer refuses further calls.
//
// Streams: the allreducer's work runs on its stream. The sparse vector given to it may have
// been written on another (a compressor's backend stream): its buffers name that stream,
// and the allreducer waits for it through an event, so compress on one stream and
// allreduce on another need nothing from the caller. The dense result is complete when
// allreduce returns.
//
// Needs NCCL (in the CUDA toolkit: nccl.h, -lnccl) and the CUDA backend's memory.
#pragma once

#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <exception>
#include <vector>

#include "sidco/backend/cuda/check.cuh"
#include "sidco/backend/cuda/scatter_add.cuh"
#include "sidco/backend/cuda/tuning.cuh"
#include "sidco/comm/collective_wait.hpp"
#include "sidco/comm/header.hpp"
#include "sidco/comm/nccl_link.cuh"
#include "sidco/comm/report.hpp"
#include "sidco/core/error.hpp"
#include "sidco/core/sparse_vector.hpp"
#include "sidco/memory/device.cuh"

namespace sidco::comm {

namespace nccl_detail {

// In T's accumulator (double for double, not float), as the MPI reducer scales in T.
template <class T>
__global__ void scale_values(T* values, std::size_t count, typename float_traits<T>::accumulator scale) {
  for (std::size_t i = std::size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += std::size_t(gridDim.x) * blockDim.x)
    values[i] = T(to_accumulator(values[i]) * scale);
}

}  // namespace nccl_detail

/// One per tensor and communicator: keeps its device buffers, so steady training allocates
/// only on its first steps. Every rank calls allreduce (or, when its compress threw,
/// allreduce_failed) the same number of times; ranks whose dense sizes or densities differ,
/// or that fail, make every rank throw the same sidco::error naming the rank, and none hangs; a
/// runtime failure aborts the communicator (see the top of this file).
template <class T, class Index = std::uint32_t>
class nccl_allreducer {
 public:
  /// timeout: how long a host wait may see no completion before the communicator is
  /// aborted (zero: no limit; asynchronous NCCL errors abort it either way).
  nccl_allreducer(ncclComm_t comm, cudaStream_t stream = nullptr,
                  std::chrono::milliseconds timeout = default_collective_timeout)
      : link_(comm, stream, timeout, "sparse_allreduce"),
        comm_(link_.comm()),
        stream_(link_.stream()),
        ranks_(link_.ranks()),
        rank_(link_.rank()) {
    for (auto* buffer : {&send_header_, &header_bytes_}) buffer->use_stream(stream_);
    send_indices_.use_stream(stream_), padded_indices_.use_stream(stream_);
    send_values_.use_stream(stream_), padded_values_.use_stream(stream_), largest_.use_stream(stream_);
  }
  nccl_allreducer(const nccl_allreducer&) = delete;
  nccl_allreducer& operator=(const nccl_allreducer&) = delete;

  int ranks() const { return ranks_; }
  int rank() const { return rank_; }

  /// dense (device memory, overwritten) = sum or average over ranks of their sparse
  /// vectors. Returns once the result is complete on the stream.
  allreduce_report allreduce(const sparse_vector<T, Index, memory::device>& mine, double delta, memory::device::view<T> dense,
                             reduction op = reduction::average) {
    link_.order_after_writer(mine);
    exchange_headers(mine.dense_size(), mine.size(), delta, op,
                     dense.size() == mine.dense_size() ? detail::rank_status::ok : detail::rank_status::dense_mismatch, "");
    return aborting_on_failure([&] { return reduce(mine, dense, op); });
  }

  /// For a rank whose compress threw: joins the exchange the others are in, so that none
  /// hangs, and throws (as every rank does) the error naming this rank and reason.
  [[noreturn]] void allreduce_failed(const std::exception& reason, std::size_t dense_size, double delta) {
    exchange_headers(dense_size, 0, delta, reduction::average, detail::rank_status::failed, reason.what());
    sidco::detail::fail("sparse_allreduce: rank ", rank_, " failed: ", reason.what());  // not reached
  }
  [[deprecated("renamed allreduce_failed")]] [[noreturn]] void abandon(const std::exception& reason,
                                                                        std::size_t dense_size, double delta) {
    allreduce_failed(reason, dense_size, delta);
  }

  /// Whether a runtime failure aborted the communicator (see the top of this file).
  bool aborted() const { return link_.aborted(); }

 private:
  using launch = backend::cuda_detail::default_tuning;
  static unsigned grid(std::size_t n) { return backend::cuda_detail::grid<launch>(n); }

  // After the header exchange: every rank knows every count and agreed on the rest.
  allreduce_report reduce(const sparse_vector<T, Index, memory::device>& mine, memory::device::view<T> dense,
                          reduction op) {
    allreduce_report report;
    report.ranks = ranks_;
    std::size_t total = 0, largest = 0;
    for (int r = 0; r < ranks_; ++r) {
      total += headers_[std::size_t(r)].count;
      largest = std::max<std::size_t>(largest, headers_[std::size_t(r)].count);
    }
    report.gathered = total;
    const std::size_t sparse_bytes = largest * std::size_t(ranks_) * (sizeof(Index) + sizeof(T));
    const std::size_t dense_bytes = dense.size() * sizeof(T);
    if (sparse_bytes >= dense_bytes) {
      report.taken = path::dense;
      report.bytes = dense_bytes;
      SIDCO_CUDA(cudaMemsetAsync(dense.data(), 0, dense_bytes, stream_));
      add(mine.indices().data(), mine.values().data(), mine.size(), dense);
      SIDCO_NCCL(ncclAllReduce(dense.data(), dense.data(), dense.size(), nccl_detail::type<T>(), ncclSum, comm_, stream_));
    } else {
      report.taken = path::sparse;
      report.bytes = sparse_bytes;
      // Each rank's block padded to the largest count.
      padded_indices_.resize(largest * std::size_t(ranks_));
      padded_values_.resize(largest * std::size_t(ranks_));
      send_indices_.resize(std::max<std::size_t>(largest, 1));
      send_values_.resize(std::max<std::size_t>(largest, 1));
      if (!mine.empty()) {
        SIDCO_CUDA(cudaMemcpyAsync(send_indices_.data(), mine.indices().data(), mine.size() * sizeof(Index),
                                   cudaMemcpyDeviceToDevice, stream_));
        SIDCO_CUDA(cudaMemcpyAsync(send_values_.data(), mine.values().data(), mine.size() * sizeof(T),
                                   cudaMemcpyDeviceToDevice, stream_));
      }
      if (largest > 0) {
        nccl_detail::link::group open_group;
        SIDCO_NCCL(ncclAllGather(send_indices_.data(), padded_indices_.data(), largest, nccl_detail::type<Index>(), comm_, stream_));
        SIDCO_NCCL(ncclAllGather(send_values_.data(), padded_values_.data(), largest, nccl_detail::type<T>(), comm_, stream_));
        open_group.close();
      }
      // Checked before the caller's output is touched: a bad index leaves it as it was.
      check_indices(largest, dense.size());
      SIDCO_CUDA(cudaMemsetAsync(dense.data(), 0, dense_bytes, stream_));
      for (int r = 0; r < ranks_; ++r)
        add(padded_indices_.data() + std::size_t(r) * largest, padded_values_.data() + std::size_t(r) * largest,
            headers_[std::size_t(r)].count, dense);
    }
    if (op == reduction::average && ranks_ > 1) {
      nccl_detail::scale_values<<<grid(dense.size()), launch::block_threads, 0, stream_>>>(
          dense.data(), dense.size(), typename float_traits<T>::accumulator(1) / typename float_traits<T>::accumulator(ranks_));
      SIDCO_CUDA(cudaGetLastError());
    }
    wait();
    return report;
  }

  template <class F>
  auto aborting_on_failure(F&& f) {
    return link_.aborting_on_failure(f, "create a new communicator and allreducer on every rank");
  }
  void wait() { link_.wait(); }
  void to_device(void* to, const void* from, std::size_t bytes) { link_.to_device(to, from, bytes); }
  void to_host(void* to, const void* from, std::size_t bytes) { link_.to_host(to, from, bytes); }

  // Every rank's header, all-gathered first; the same error on every rank when one failed
  // or disagrees.
  void exchange_headers(std::size_t dense_size, std::size_t count, double delta, reduction op, detail::rank_status state,
                        const char* reason) {
    if (link_.aborted())
      sidco::detail::fail_at_run_time("sparse_allreduce: the NCCL communicator was aborted by an earlier failure; "
                                      "create a new communicator and allreducer");
    aborting_on_failure([&] { gather_headers(dense_size, count, delta, op, state, reason); });
    detail::check_headers(headers_);
  }

  void gather_headers(std::size_t dense_size, std::size_t count, double delta, reduction op, detail::rank_status state,
                      const char* reason) {
    const detail::rank_header mine = detail::make_header(dense_size, count, delta, op, state, reason);
    send_header_.resize(sizeof mine);
    header_bytes_.resize(sizeof mine * std::size_t(ranks_));
    to_device(send_header_.data(), &mine, sizeof mine);
    SIDCO_NCCL(ncclAllGather(send_header_.data(), header_bytes_.data(), sizeof mine, ncclUint8, comm_, stream_));
    headers_.resize(std::size_t(ranks_));
    to_host(headers_.data(), header_bytes_.data(), sizeof mine * std::size_t(ranks_));
  }

  // Every gathered index below the dense size, checked before anything is added (every
  // rank sees the same entries, so every rank throws the same error).
  void check_indices(std::size_t largest, std::size_t dense_size) {
    largest_.resize(1);
    SIDCO_CUDA(cudaMemsetAsync(largest_.data(), 0, sizeof(unsigned long long), stream_));
    for (int r = 0; r < ranks_; ++r) {
      const std::size_t count = headers_[std::size_t(r)].count;
      if (count == 0) continue;
      backend::cuda_detail::largest_index<launch><<<grid(count), launch::block_threads, 0, stream_>>>(
          padded_indices_.data() + std::size_t(r) * largest, count, largest_.data());
    }
    SIDCO_CUDA(cudaGetLastError());
    unsigned long long top = 0;
    to_host(&top, largest_.data(), sizeof top);
    if (top >= dense_size)
      sidco::detail::fail("sparse_allreduce: a rank sent index ", top, " beyond dense size ", dense_size);
  }

  void add(const Index* indices, const T* values, std::size_t count, memory::device::view<T> dense) {
    if (count == 0) return;
    backend::cuda_detail::add_entries<launch><<<grid(count), launch::block_threads, 0, stream_>>>(
        indices, values, count, dense.data(), T(1));
    SIDCO_CUDA(cudaGetLastError());
  }

  nccl_detail::link link_;
  ncclComm_t comm_;
  cudaStream_t stream_;
  int ranks_ = 1, rank_ = 0;
  std::vector<detail::rank_header> headers_;
  memory::device_buffer<unsigned char> send_header_, header_bytes_;
  memory::device_buffer<Index> send_indices_, padded_indices_;
  memory::device_buffer<T> send_values_, padded_values_;
  memory::device_buffer<unsigned long long> largest_;
};

}  // namespace sidco::comm
