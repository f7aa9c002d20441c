// What the NCCL exchanges share: one communicator and stream, NCCL errors as
// sidco::runtime_error, groups closed on every path, polled host waits, host copies through
// page-locked memory, and the abort that keeps peers from waiting on a rank that failed.
//
// Host waits poll the stream and ncclCommGetAsyncError (comm/collective_wait.hpp) before any
// copy to the host, and host copies go through page-locked memory: nothing blocks where a
// stuck collective would keep it (a copy into pageable memory waits for the whole stream).
// A runtime failure (a CUDA or NCCL call, an asynchronous NCCL error such as a peer that
// died, no progress within the timeout) aborts the communicator (ncclCommAbort), so that the
// other ranks' collectives fail instead of waiting. ncclCommAbort on one rank does not fail
// its peers' collectives over NVLink or shared memory: a peer escapes through its own
// timeout. After an abort the communicator is gone: every rank must create a new one.
//
// Needs NCCL (in the CUDA toolkit: nccl.h, -lnccl).
#pragma once

#include <cuda_runtime.h>
#include <nccl.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <string>
#include <type_traits>

#include "sidco/backend/cuda/check.cuh"
#include "sidco/backend/cuda/half.cuh"
#include "sidco/comm/collective_wait.hpp"
#include "sidco/core/error.hpp"

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

}  // namespace nccl_detail

#define SIDCO_NCCL(call) ::sidco::comm::nccl_detail::check((call), #call)

namespace nccl_detail {

/// One communicator and stream as an exchange uses them. `who` starts its messages.
class link {
 public:
  link(ncclComm_t comm, cudaStream_t stream, std::chrono::milliseconds timeout, const char* who)
      : comm_(comm), stream_(stream), timeout_(timeout), who_(who) {
    SIDCO_NCCL(ncclCommCount(comm_, &ranks_));
    SIDCO_NCCL(ncclCommUserRank(comm_, &rank_));
    SIDCO_CUDA(cudaEventCreateWithFlags(&written_, cudaEventDisableTiming));
  }
  link(const link&) = delete;
  link& operator=(const link&) = delete;
  ~link() {
    cudaEventDestroy(written_);
    if (pinned_) cudaFreeHost(pinned_);
  }

  int ranks() const { return ranks_; }
  int rank() const { return rank_; }
  ncclComm_t comm() const { return comm_; }
  cudaStream_t stream() const { return stream_; }
  bool aborted() const { return aborted_; }

  /// ncclGroupStart until close(), or ncclGroupEnd on the way out of a throw: no group is
  /// left open whatever fails inside it.
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

  /// f(); a sidco::error (agreed by every rank, from the same data) passes through, any
  /// other failure aborts the communicator so that no rank waits, then throws.
  template <class F>
  auto aborting_on_failure(F&& f, const char* remedy) {
    try {
      return f();
    } catch (const sidco::error&) {
      throw;
    } catch (const std::exception& failure) {
      abort_communicator();
      sidco::detail::fail_at_run_time(who_, ": rank ", rank_, ": ", failure.what(),
                                      "; the NCCL communicator was aborted so that no rank waits: ", remedy);
    }
  }

  void abort_communicator() noexcept {
    if (aborted_) return;
    aborted_ = true;
    ncclCommAbort(comm_);
  }

  /// Waits for the stream, polling NCCL's asynchronous error (a peer that died, a network
  /// failure) and the timeout instead of blocking where neither would be seen.
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

  /// The stream a device vector's buffers were last written on (a compressor's backend
  /// stream), if another than ours: our next work waits for everything queued there so far.
  template <class Vector>
  void order_after_writer(const Vector& written) {
    cudaStream_t writer = stream_;
    written.for_each_buffer([&](const auto& buffer) { writer = buffer.stream(); });  // both share it
    if (writer == stream_) return;
    SIDCO_CUDA(cudaEventRecord(written_, writer));
    SIDCO_CUDA(cudaStreamWaitEvent(stream_, written_, 0));
  }

  /// Host copies through page-locked memory (a pageable one would block on the whole
  /// stream, collectives included, before the polling wait could run).
  void to_device(void* to, const void* from, std::size_t bytes) {
    if (bytes == 0) return;
    pinned(bytes);
    std::memcpy(pinned_, from, bytes);
    SIDCO_CUDA(cudaMemcpyAsync(to, pinned_, bytes, cudaMemcpyHostToDevice, stream_));
    wait();  // the staging is reused by the next copy
  }
  void to_host(void* to, const void* from, std::size_t bytes) {
    wait();  // the collectives first, polled
    if (bytes == 0) return;
    pinned(bytes);
    SIDCO_CUDA(cudaMemcpyAsync(pinned_, from, bytes, cudaMemcpyDeviceToHost, stream_));
    wait();
    std::memcpy(to, pinned_, bytes);
  }

 private:
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

  ncclComm_t comm_;
  cudaStream_t stream_;
  std::chrono::milliseconds timeout_;
  const char* who_;
  bool aborted_ = false;
  int ranks_ = 1, rank_ = 0;
  void* pinned_ = nullptr;  // page-locked staging for host copies
  std::size_t pinned_capacity_ = 0;
  cudaEvent_t written_ = nullptr;  // recorded on the stream a vector was written on
};

}  // namespace nccl_detail
}  // namespace sidco::comm
