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
// comm::default_collective_timeout) aborts the communicator (ncclCommAbort) so that the
// other ranks' collectives fail instead of waiting, and throws sidco::runtime_error. Host
// waits poll the stream and ncclCommGetAsyncError (comm/collective_wait.hpp) before any
// copy to the host, and host copies go through page-locked memory: nothing blocks where a
// stuck collective would keep it (a copy into pageable memory waits for the whole stream).
// Note that ncclCommAbort on one rank does not fail its peers' collectives over NVLink or
// shared memory: a peer escapes through its own timeout. After an abort the communicator is gone
// (do not use or destroy it): every rank must create a new communicator and a new
// allreducer; this allreducer refuses further calls.
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
#include <cstring>
#include <exception>
#include <span>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "sidco/backend/cuda/check.cuh"
#include "sidco/backend/cuda/half.cuh"
#include "sidco/backend/cuda/scatter_add.cuh"
#include "sidco/backend/cuda/tuning.cuh"
#include "sidco/comm/collective_wait.hpp"
#include "sidco/comm/header.hpp"
#include "sidco/comm/report.hpp"
#include "sidco/core/error.hpp"
#include "sidco/core/sparse_vector.hpp"
#include "sidco/memory/device.cuh"

namespace sidco::comm {

namespace nccl_detail {

inline void check(ncclResult_t status, const char* call) {
  if (status != ncclSuccess)
    sidco::detail::fail_at_run_time("NCCL: ", call, " failed: ", ncclGetErrorString(status));
}

template <class T>
ncclDataType_t type() {
  if constexpr (std::is_same_v<T, float>) return ncclFloat32;
  else if constexpr (std::is_same_v<T, double>) return ncclFloat64;
  else if constexpr (std::is_same_v<T, __half>) return ncclFloat16;
  else if constexpr (std::is_same_v<T, __nv_bfloat16>) return ncclBfloat16;
  else if constexpr (std::is_same_v<T, std::uint32_t>) return ncclUint32;
  else if constexpr (std::is_same_v<T, std::uint64_t>) return ncclUint64;
  else static_assert(sizeof(T) == 0, "nccl_allreducer: no NCCL type for this element type");
}

// In T's accumulator (double for double, not float), as the MPI reducer scales in T.
template <class T>
__global__ void scale_values(T* values, std::size_t count, typename float_traits<T>::accumulator scale) {
  for (std::size_t i = std::size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += std::size_t(gridDim.x) * blockDim.x)
    values[i] = T(to_accumulator(values[i]) * scale);
}

}  // namespace nccl_detail

#define SIDCO_NCCL(call) ::sidco::comm::nccl_detail::check((call), #call)

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
      : comm_(comm), stream_(stream), timeout_(timeout) {
    for (auto* buffer : {&send_header_, &header_bytes_}) buffer->use_stream(stream_);
    send_indices_.use_stream(stream_), padded_indices_.use_stream(stream_);
    send_values_.use_stream(stream_), padded_values_.use_stream(stream_), largest_.use_stream(stream_);
    SIDCO_NCCL(ncclCommCount(comm_, &ranks_));
    SIDCO_NCCL(ncclCommUserRank(comm_, &rank_));
    SIDCO_CUDA(cudaEventCreateWithFlags(&written_, cudaEventDisableTiming));
  }
  nccl_allreducer(const nccl_allreducer&) = delete;
  nccl_allreducer& operator=(const nccl_allreducer&) = delete;
  ~nccl_allreducer() {
    cudaEventDestroy(written_);
    if (pinned_) cudaFreeHost(pinned_);
  }

  int ranks() const { return ranks_; }
  int rank() const { return rank_; }

  /// dense (device memory, overwritten) = sum or average over ranks of their sparse
  /// vectors. Returns once the result is complete on the stream.
  allreduce_report allreduce(const sparse_vector<T, Index, memory::device>& mine, double delta, memory::device::view<T> dense,
                             reduction op = reduction::average) {
    order_after_writer(mine);
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
  bool aborted() const { return aborted_; }

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
        group open_group;
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

  // ncclGroupStart until close(), or ncclGroupEnd on the way out of a throw: no group is
  // left open whatever fails inside it.
  class group {
   public:
    group() { SIDCO_NCCL(ncclGroupStart()); }
    group(const group&) = delete;
    group& operator=(const group&) = delete;
    ~group() {
      if (open_) ncclGroupEnd();
    }
    void close() {
      open_ = false;
      SIDCO_NCCL(ncclGroupEnd());
    }

   private:
    bool open_ = true;
  };

  // f(); a sidco::error (agreed by every rank, from the same data) passes through, any
  // other failure aborts the communicator so that no rank waits, then throws.
  template <class F>
  auto aborting_on_failure(F&& f) {
    try {
      return f();
    } catch (const sidco::error&) {
      throw;
    } catch (const std::exception& failure) {
      abort_communicator();
      sidco::detail::fail_at_run_time("sparse_allreduce: rank ", rank_, ": ", failure.what(),
                                      "; the NCCL communicator was aborted so that no rank waits: create a new "
                                      "communicator and allreducer on every rank");
    }
  }

  void abort_communicator() noexcept {
    if (aborted_) return;
    aborted_ = true;
    ncclCommAbort(comm_);
  }

  // Waits for the stream, polling NCCL's asynchronous error (a peer that died, a network
  // failure) and the timeout instead of blocking where neither would be seen.
  void wait() {
    detail::poll_until_finished(
        [this] {
          const cudaError_t state = cudaStreamQuery(stream_);
          if (state == cudaSuccess) return true;
          if (state != cudaErrorNotReady) SIDCO_CUDA(state);
          static_cast<void>(cudaGetLastError());  // not-ready is no error; clear it for later checks
          return false;
        },
        [this]() -> std::string {
          ncclResult_t async = ncclSuccess;
          SIDCO_NCCL(ncclCommGetAsyncError(comm_, &async));
          return async != ncclSuccess && async != ncclInProgress ? ncclGetErrorString(async) : "";
        },
        timeout_, "NCCL");
  }

  // The stream mine's buffers were last written on (a compressor's backend stream), if
  // another than ours: our next work waits for everything queued there so far.
  void order_after_writer(const sparse_vector<T, Index, memory::device>& mine) {
    cudaStream_t writer = stream_;
    mine.for_each_buffer([&](const auto& buffer) { writer = buffer.stream(); });  // both share it
    if (writer == stream_) return;
    SIDCO_CUDA(cudaEventRecord(written_, writer));
    SIDCO_CUDA(cudaStreamWaitEvent(stream_, written_, 0));
  }

  // Host copies through page-locked memory (a pageable one would block on the whole stream,
  // collectives included, before the polling wait could run).
  void* pinned(std::size_t bytes) {
    if (bytes > pinned_capacity_) {
      if (pinned_) cudaFreeHost(pinned_);
      pinned_ = nullptr;
      pinned_capacity_ = 0;
      SIDCO_CUDA(cudaMallocHost(&pinned_, bytes));
      pinned_capacity_ = bytes;
    }
    return pinned_;
  }
  void to_device(void* to, const void* from, std::size_t bytes) {
    pinned(bytes);
    std::memcpy(pinned_, from, bytes);
    SIDCO_CUDA(cudaMemcpyAsync(to, pinned_, bytes, cudaMemcpyHostToDevice, stream_));
    wait();  // the staging is reused by the next copy
  }
  void to_host(void* to, const void* from, std::size_t bytes) {
    wait();  // the collectives first, polled
    pinned(bytes);
    SIDCO_CUDA(cudaMemcpyAsync(pinned_, from, bytes, cudaMemcpyDeviceToHost, stream_));
    wait();
    std::memcpy(to, pinned_, bytes);
  }

  // Every rank's header, all-gathered first; the same error on every rank when one failed
  // or disagrees.
  void exchange_headers(std::size_t dense_size, std::size_t count, double delta, reduction op, detail::rank_status state,
                        const char* reason) {
    if (aborted_)
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

  ncclComm_t comm_;
  cudaStream_t stream_;
  std::chrono::milliseconds timeout_;
  bool aborted_ = false;
  int ranks_ = 1, rank_ = 0;
  std::vector<detail::rank_header> headers_;
  memory::device_buffer<unsigned char> send_header_, header_bytes_;
  memory::device_buffer<Index> send_indices_, padded_indices_;
  memory::device_buffer<T> send_values_, padded_values_;
  memory::device_buffer<unsigned long long> largest_;
  void* pinned_ = nullptr;  // page-locked staging for host copies
  std::size_t pinned_capacity_ = 0;
  cudaEvent_t written_ = nullptr;  // recorded on the stream mine was written on
};

}  // namespace sidco::comm
