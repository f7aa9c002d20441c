// How a host waits for collectives queued on a device stream: it polls, never blocks, so
// that a peer's failure the library reports asynchronously (NCCL's ncclCommGetAsyncError)
// or a deadline is seen while the stream is stuck. Blocking calls hide both: a
// cudaStreamSynchronize, or a device-to-host copy into pageable memory, returns only once
// everything before it on the stream is done, so a peer that died leaves the caller there
// forever. Host code, no CUDA header: the logic is tested without a GPU
// (tests/collective_wait_test.cpp); comm/nccl.cuh gives it the stream and NCCL probes.
#pragma once

#include <chrono>
#include <string>
#include <thread>

#include "sidco/core/error.hpp"

namespace sidco::comm {

/// How long a host wait for a collective may see no completion before the communicator is
/// aborted, unless the caller gives another (zero: no limit). torch's default for NCCL.
inline constexpr std::chrono::milliseconds default_collective_timeout = std::chrono::minutes(10);

namespace detail {

/// Polls finished() until it returns true. Throws sidco::runtime_error naming `what` when
/// failure() returns a non-empty reason, or when timeout (if non-zero) passes first.
template <class Finished, class Failure>
void poll_until_finished(Finished&& finished, Failure&& failure, std::chrono::milliseconds timeout, const char* what) {
  const auto start = std::chrono::steady_clock::now();
  for (;;) {
    if (finished()) return;
    if (const std::string reason = failure(); !reason.empty())
      sidco::detail::fail_at_run_time(what, ": asynchronous error: ", reason);
    if (timeout.count() > 0 && std::chrono::steady_clock::now() - start > timeout)
      sidco::detail::fail_at_run_time(what, ": no progress in ", timeout.count(), " ms");
    std::this_thread::yield();
  }
}

}  // namespace detail
}  // namespace sidco::comm
