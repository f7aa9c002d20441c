// The NCCL tests' ranks: one host thread per visible GPU, and failures counted, not thrown
// (a throw on one rank's thread would leave the others waiting in a collective).
#pragma once

#include <cuda_runtime.h>
#include <nccl.h>

#include <atomic>
#include <cstdio>
#include <functional>
#include <string>
#include <thread>
#include <vector>

namespace sidco::test {

inline std::atomic<int> failures = 0;  // expect() runs on every rank's thread

inline void expect(bool ok, const std::string& what) {
  if (!ok) {
    std::printf("FAIL %s\n", what.c_str());
    ++failures;
  }
}

/// Runs f(rank) on one host thread per rank (NCCL calls of one collective must overlap).
inline void on_every_rank(int ranks, const std::function<void(int)>& f) {
  std::vector<std::thread> threads;
  for (int r = 0; r < ranks; ++r) threads.emplace_back([&, r] {
    cudaSetDevice(r);
    f(r);
  });
  for (auto& t : threads) t.join();
}

/// One communicator per visible GPU, one rank each (empty, having said why, if NCCL fails).
inline std::vector<ncclComm_t> one_rank_per_gpu(int ranks) {
  std::vector<ncclComm_t> comms(static_cast<std::size_t>(ranks));
  std::vector<int> ids(static_cast<std::size_t>(ranks));
  for (int r = 0; r < ranks; ++r) ids[std::size_t(r)] = r;
  if (ncclCommInitAll(comms.data(), ranks, ids.data()) != ncclSuccess) {
    std::printf("FAIL ncclCommInitAll\n");
    comms.clear();
  }
  return comms;
}

}  // namespace sidco::test
