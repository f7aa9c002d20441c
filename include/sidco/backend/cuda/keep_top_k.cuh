// backend::cuda's exact Top-k over a sparse vector's entries: the radix walk of
// core/radix_select.hpp, one digit histogram per 8-bit round (one host wait each), then
// ties ranked by index and an order-keeping compaction.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include <cub/device/device_scan.cuh>
#include <cub/device/device_select.cuh>

#include "sidco/backend/cuda/tuning.cuh"
#include "sidco/backend/cuda/workspace.cuh"
#include "sidco/core/magnitude_key.hpp"
#include "sidco/core/radix_select.hpp"
#include "sidco/core/sparse_vector.hpp"
#include "sidco/memory/device.cuh"

namespace sidco::backend::cuda_detail {

// Counts of this round's 8-bit digit among the keys still in the running.
template <class Tuning, class T>
__global__ void __launch_bounds__(Tuning::block_threads)
    digit_histogram(const T* values, std::size_t count, radix_select<magnitude_key_t<T>> walk, int round,
                    unsigned long long* bins) {
  constexpr int bin_count = radix_select<magnitude_key_t<T>>::bins;
  __shared__ unsigned int local[bin_count];
  for (int b = threadIdx.x; b < bin_count; b += Tuning::block_threads) local[b] = 0;
  __syncthreads();
  for (std::size_t j = std::size_t(blockIdx.x) * Tuning::block_threads + threadIdx.x; j < count;
       j += std::size_t(gridDim.x) * Tuning::block_threads) {
    const int d = walk.digit(magnitude_key(values[j]), round);
    if (d >= 0) atomicAdd(&local[d], 1u);
  }
  __syncthreads();
  for (int b = threadIdx.x; b < bin_count; b += Tuning::block_threads)
    if (local[b]) atomicAdd(&bins[b], static_cast<unsigned long long>(local[b]));
}

// 1 where the k-th key is tied, for the scan that ranks ties by index.
template <class Tuning, class T>
__global__ void __launch_bounds__(Tuning::block_threads)
    tie_flags(const T* values, std::size_t count, radix_select<magnitude_key_t<T>> walk, std::uint32_t* ties) {
  for (std::size_t j = std::size_t(blockIdx.x) * Tuning::block_threads + threadIdx.x; j < count;
       j += std::size_t(gridDim.x) * Tuning::block_threads)
    ties[j] = walk.rank(magnitude_key(values[j])) == 0;
}

// 1 where an entry belongs to the top k: above the k-th key, or among its first
// walk.needed ties (tie_rank: ties before it).
template <class Tuning, class T>
__global__ void __launch_bounds__(Tuning::block_threads)
    top_k_flags(const T* values, std::size_t count, radix_select<magnitude_key_t<T>> walk,
                const std::uint32_t* tie_rank, char* keep) {
  for (std::size_t j = std::size_t(blockIdx.x) * Tuning::block_threads + threadIdx.x; j < count;
       j += std::size_t(gridDim.x) * Tuning::block_threads) {
    const int r = walk.rank(magnitude_key(values[j]));
    keep[j] = r > 0 || (r == 0 && tie_rank[j] < walk.needed);
  }
}

/// Keeps the k entries of out from begin on with the largest magnitudes (ties: lowest
/// index), in index order.
template <class Tuning, class T, class Index>
void keep_top_k(workspace& ws, sparse_vector<T, Index, sidco::memory::device>& out, std::size_t begin,
                std::size_t k) {
  using Key = magnitude_key_t<T>;
  using walk_type = radix_select<Key>;
  const std::size_t count = out.size() - begin;
  if (count <= k) return;
  const T* values = out.value_data() + begin;
  const unsigned blocks = grid<Tuning>(count);
  walk_type walk(k);
  auto* bins = ws.counters(walk_type::bins);  // zeroed for round 0
  ws.host_counters.resize(walk_type::bins);
  for (int round = 0; round < walk_type::rounds; ++round) {
    if (round > 0) SIDCO_CUDA(cudaMemsetAsync(bins, 0, walk_type::bins * sizeof(unsigned long long), ws.stream));
    digit_histogram<Tuning><<<blocks, Tuning::block_threads, 0, ws.stream>>>(values, count, walk, round, bins);
    SIDCO_CUDA(cudaGetLastError());
    ws.copy_back(ws.host_counters.data(), bins, walk_type::bins);
    walk.choose(ws.host_counters.data(), round);
  }
  // Ties ranked by index (entries ascend by index), then an order-keeping compaction.
  ws.ranks.resize(count);
  ws.flags.resize(count);
  tie_flags<Tuning><<<blocks, Tuning::block_threads, 0, ws.stream>>>(values, count, walk, ws.ranks.data());
  SIDCO_CUDA(cudaGetLastError());
  std::size_t bytes = 0;
  SIDCO_CUDA(cub::DeviceScan::ExclusiveSum(nullptr, bytes, ws.ranks.data(), ws.ranks.data(), count, ws.stream));
  SIDCO_CUDA(cub::DeviceScan::ExclusiveSum(ws.scratch(bytes), bytes, ws.ranks.data(), ws.ranks.data(), count, ws.stream));
  top_k_flags<Tuning><<<blocks, Tuning::block_threads, 0, ws.stream>>>(values, count, walk, ws.ranks.data(),
                                                                        ws.flags.data());
  SIDCO_CUDA(cudaGetLastError());
  Index* kept_indices = workspace::staging<Index>(ws.staging_indices, k);
  T* kept_values = workspace::staging<T>(ws.staging_values, k);
  auto* selected = ws.counters(1);
  const Index* indices = out.index_data() + begin;
  bytes = 0;
  SIDCO_CUDA(cub::DeviceSelect::Flagged(nullptr, bytes, indices, ws.flags.data(), kept_indices, selected,
                                        std::int64_t(count), ws.stream));
  SIDCO_CUDA(cub::DeviceSelect::Flagged(ws.scratch(bytes), bytes, indices, ws.flags.data(), kept_indices, selected,
                                        std::int64_t(count), ws.stream));
  bytes = 0;
  SIDCO_CUDA(cub::DeviceSelect::Flagged(nullptr, bytes, values, ws.flags.data(), kept_values, selected,
                                        std::int64_t(count), ws.stream));
  SIDCO_CUDA(cub::DeviceSelect::Flagged(ws.scratch(bytes), bytes, values, ws.flags.data(), kept_values, selected,
                                        std::int64_t(count), ws.stream));
  SIDCO_CUDA(cudaMemcpyAsync(out.index_data() + begin, kept_indices, k * sizeof(Index), cudaMemcpyDeviceToDevice,
                             ws.stream));
  SIDCO_CUDA(cudaMemcpyAsync(out.value_data() + begin, kept_values, k * sizeof(T), cudaMemcpyDeviceToDevice, ws.stream));
  out.truncate(begin + k);
}

}  // namespace sidco::backend::cuda_detail
