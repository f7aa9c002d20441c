// backend::cuda's exact Top-k over a sparse vector's entries: the radix walk of
// core/radix_select.hpp kept on the device (one digit histogram per 8-bit round, the digit
// chosen by a one-thread kernel that reads it), then one scan that counts, per entry, the
// keys above the k-th and its ties before it, and one pass that writes the kept (index,
// value) pairs in index order. No host wait: k is known, so nothing sizes the output.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include <cub/device/device_scan.cuh>
#include <thrust/iterator/transform_iterator.h>

#include "sidco/backend/cuda/tuning.cuh"
#include "sidco/backend/cuda/workspace.cuh"
#include "sidco/core/magnitude_key.hpp"
#include "sidco/core/radix_select.hpp"
#include "sidco/core/sparse_vector.hpp"
#include "sidco/memory/device.cuh"

namespace sidco::backend::cuda_detail {

/// Per entry, in the scan's order: the keys above the k-th largest and the ties with it.
struct top_k_tally {
  unsigned long long above = 0, ties = 0;
};

struct add_tallies {
  __device__ top_k_tally operator()(const top_k_tally& a, const top_k_tally& b) const {
    return {a.above + b.above, a.ties + b.ties};
  }
};

// One entry's tally once the walk is done (read through a transform iterator: no flag array).
template <class T>
struct tally_of {
  const radix_select<magnitude_key_t<T>>* walk;
  __device__ top_k_tally operator()(const T& value) const {
    const int r = walk->rank(magnitude_key(value));
    return {r > 0 ? 1ull : 0ull, r == 0 ? 1ull : 0ull};
  }
};

// The walk before round 0, and round 0's bins zeroed.
template <class Key>
__global__ void start_walk(radix_select<Key>* walk, std::size_t k, unsigned long long* bins) {
  if (threadIdx.x == 0) *walk = radix_select<Key>(k);
  for (unsigned b = threadIdx.x; b < radix_select<Key>::bins; b += blockDim.x) bins[b] = 0;
}

// Counts of this round's 8-bit digit among the keys still in the running.
template <class Tuning, class T>
__global__ void __launch_bounds__(Tuning::block_threads)
    digit_histogram(const T* values, std::size_t count, const radix_select<magnitude_key_t<T>>* walk_state, int round,
                    unsigned long long* bins) {
  constexpr int bin_count = radix_select<magnitude_key_t<T>>::bins;
  __shared__ unsigned int local[bin_count];
  const auto walk = *walk_state;
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

// This round's digit fixed from its histogram (one thread: 256 bins), then the bins zeroed
// for the next round.
template <class Key>
__global__ void choose_digit(radix_select<Key>* walk, unsigned long long* bins, int round) {
  if (threadIdx.x == 0) walk->choose(bins, round);
  __syncthreads();
  for (unsigned b = threadIdx.x; b < radix_select<Key>::bins; b += blockDim.x) bins[b] = 0;
}

// The top k (above the k-th key, or among its first walk.needed ties: ties go to the lower
// index), each written at its rank in index order: the keys above before it plus the ties
// before it, at most walk.needed of them.
template <class Tuning, class T, class Index>
__global__ void __launch_bounds__(Tuning::block_threads)
    write_top_k(const T* values, const Index* indices, std::size_t count,
                const radix_select<magnitude_key_t<T>>* walk_state, const top_k_tally* before, Index* kept_indices,
                T* kept_values) {
  const auto walk = *walk_state;
  const unsigned long long needed = walk.needed;
  for (std::size_t j = std::size_t(blockIdx.x) * Tuning::block_threads + threadIdx.x; j < count;
       j += std::size_t(gridDim.x) * Tuning::block_threads) {
    const T v = values[j];
    const int r = walk.rank(magnitude_key(v));
    if (r < 0) continue;
    const top_k_tally t = before[j];
    if (r == 0 && t.ties >= needed) continue;
    const std::size_t at = std::size_t(t.above + (t.ties < needed ? t.ties : needed));
    kept_indices[at] = indices[j];
    kept_values[at] = v;
  }
}

/// Keeps the k entries of out from begin on with the largest magnitudes (ties: lowest
/// index), in index order. Everything on the workspace's stream; no host wait.
template <class Tuning, class T, class Index>
void keep_top_k(workspace& ws, sparse_vector<T, Index, sidco::memory::device>& out, std::size_t begin,
                std::size_t k) {
  using Key = magnitude_key_t<T>;
  using walk_type = radix_select<Key>;
  static_assert(std::is_trivially_copyable_v<walk_type>);
  const std::size_t count = out.size() - begin;
  if (count <= k) return;
  const T* values = out.value_data() + begin;
  const Index* indices = out.index_data() + begin;
  const unsigned blocks = grid<Tuning>(count);
  auto* walk = workspace::staging<walk_type>(ws.walk_state, 1);
  auto* bins = workspace::staging<unsigned long long>(ws.bins, walk_type::bins);
  start_walk<<<1, Tuning::block_threads, 0, ws.stream>>>(walk, k, bins);
  SIDCO_CUDA(cudaGetLastError());
  for (int round = 0; round < walk_type::rounds; ++round) {
    digit_histogram<Tuning><<<blocks, Tuning::block_threads, 0, ws.stream>>>(values, count, walk, round, bins);
    SIDCO_CUDA(cudaGetLastError());
    choose_digit<<<1, Tuning::block_threads, 0, ws.stream>>>(walk, bins, round);
    SIDCO_CUDA(cudaGetLastError());
  }
  auto* tallies = workspace::staging<top_k_tally>(ws.tallies, count);
  const auto tally_in = thrust::make_transform_iterator(values, tally_of<T>{walk});
  std::size_t bytes = 0;
  SIDCO_CUDA(cub::DeviceScan::ExclusiveScan(nullptr, bytes, tally_in, tallies, add_tallies{}, top_k_tally{}, count,
                                            ws.stream));
  SIDCO_CUDA(cub::DeviceScan::ExclusiveScan(ws.scratch(bytes), bytes, tally_in, tallies, add_tallies{}, top_k_tally{},
                                            count, ws.stream));
  Index* kept_indices = workspace::staging<Index>(ws.staging_indices, k);
  T* kept_values = workspace::staging<T>(ws.staging_values, k);
  write_top_k<Tuning><<<blocks, Tuning::block_threads, 0, ws.stream>>>(values, indices, count, walk, tallies,
                                                                        kept_indices, kept_values);
  SIDCO_CUDA(cudaGetLastError());
  SIDCO_CUDA(cudaMemcpyAsync(out.index_data() + begin, kept_indices, k * sizeof(Index), cudaMemcpyDeviceToDevice,
                             ws.stream));
  SIDCO_CUDA(cudaMemcpyAsync(out.value_data() + begin, kept_values, k * sizeof(T), cudaMemcpyDeviceToDevice, ws.stream));
  out.truncate(begin + k);
}

}  // namespace sidco::backend::cuda_detail
