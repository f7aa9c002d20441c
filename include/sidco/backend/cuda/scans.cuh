// backend::cuda's whole-source scans: count above a threshold, a magnitude-key histogram,
// the first non-finite value, a gather of chosen values (each one host wait for its small
// result), and the sent marks of error feedback (none).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <span>

#include <cub/block/block_reduce.cuh>

#include "sidco/backend/cuda/elementwise.hpp"
#include "sidco/backend/cuda/tuning.cuh"
#include "sidco/backend/cuda/workspace.cuh"
#include "sidco/backend/pass_statistics.hpp"
#include "sidco/core/magnitude_key.hpp"
#include "sidco/core/sparse_vector.hpp"
#include "sidco/memory/device.cuh"

namespace sidco::backend::cuda_detail {

// Counts magnitude keys >> shift into bins (a block's histogram in shared memory first).
template <class Tuning, class Source>
__global__ void __launch_bounds__(Tuning::block_threads)
    histogram_keys(Source source, int shift, unsigned long long* bins, int bin_count) {
  extern __shared__ unsigned int local[];
  for (int b = threadIdx.x; b < bin_count; b += Tuning::block_threads) local[b] = 0;
  __syncthreads();
  for (std::size_t i = std::size_t(blockIdx.x) * Tuning::block_threads + threadIdx.x; i < source.size;
       i += std::size_t(gridDim.x) * Tuning::block_threads)
    atomicAdd(&local[magnitude_key(source.value(i)) >> shift], 1u);
  __syncthreads();
  for (int b = threadIdx.x; b < bin_count; b += Tuning::block_threads)
    if (local[b]) atomicAdd(&bins[b], static_cast<unsigned long long>(local[b]));
}

// How many |x| > t, into *count.
template <class Tuning, class Source>
__global__ void __launch_bounds__(Tuning::block_threads)
    count_exceeding(Source source, above_key<typename Source::value_type> keep, unsigned long long* count) {
  unsigned long long mine = 0;
  for (std::size_t i = std::size_t(blockIdx.x) * Tuning::block_threads + threadIdx.x; i < source.size;
       i += std::size_t(gridDim.x) * Tuning::block_threads)
    mine += keep(source.value(i));
  using reduce = cub::BlockReduce<unsigned long long, Tuning::block_threads>;
  __shared__ typename reduce::TempStorage temp;
  const unsigned long long total = reduce(temp).Sum(mine);
  if (threadIdx.x == 0 && total) atomicAdd(count, total);
}

// The smallest index of a NaN or infinity, into *first (which starts at the size).
template <class Tuning, class Source>
__global__ void __launch_bounds__(Tuning::block_threads) find_nonfinite(Source source, unsigned long long* first) {
  using T = typename Source::value_type;
  for (std::size_t i = std::size_t(blockIdx.x) * Tuning::block_threads + threadIdx.x; i < source.size;
       i += std::size_t(gridDim.x) * Tuning::block_threads)
    if (magnitude_key(source.value(i)) >= magnitude_key_t<T>(float_traits<T>::infinity))
      atomicMin(first, static_cast<unsigned long long>(i));
}

// out[j] = x (or |x|) at positions[j].
template <class Tuning, class Source>
__global__ void __launch_bounds__(Tuning::block_threads)
    gather_values(Source source, const std::size_t* positions, std::size_t count, double* out, bool magnitude) {
  for (std::size_t j = std::size_t(blockIdx.x) * Tuning::block_threads + threadIdx.x; j < count;
       j += std::size_t(gridDim.x) * Tuning::block_threads) {
    const double v = double(to_accumulator(source.value(positions[j])));
    out[j] = magnitude ? (v < 0 ? -v : v) : v;
  }
}

// Clears the state of the entries sent (global indices, base subtracted).
template <class Tuning, class Source, class Index>
__global__ void __launch_bounds__(Tuning::block_threads)
    clear_sent(Source source, const Index* indices, std::size_t count) {
  for (std::size_t j = std::size_t(blockIdx.x) * Tuning::block_threads + threadIdx.x; j < count;
       j += std::size_t(gridDim.x) * Tuning::block_threads)
    source.mark_sent(std::size_t(indices[j]) - source.base);
}

template <class Tuning, class Source>
std::size_t count_above(workspace& ws, const Source& source, double t) {
  using T = typename Source::value_type;
  auto* count = ws.counters(1);
  count_exceeding<Tuning><<<grid<Tuning>(source.size), Tuning::block_threads, 0, ws.stream>>>(
      source, above_key<T>{threshold_key<T>(t)}, count);
  SIDCO_CUDA(cudaGetLastError());
  return std::size_t(ws.fetch_counter(count));
}

/// counts[d] += how many magnitude keys >> shift equal d.
template <class Tuning, class Source>
void key_histogram(workspace& ws, const Source& source, int shift, std::span<std::uint64_t> counts) {
  auto* bins = ws.counters(counts.size());
  histogram_keys<Tuning><<<grid<Tuning>(source.size), Tuning::block_threads, counts.size() * sizeof(unsigned int),
                           ws.stream>>>(source, shift, bins, int(counts.size()));
  SIDCO_CUDA(cudaGetLastError());
  ws.host_counters.resize(counts.size());
  ws.copy_back(ws.host_counters.data(), bins, counts.size());
  for (std::size_t d = 0; d < counts.size(); ++d) counts[d] += ws.host_counters[d];
}

/// out[j] = x (magnitude: |x|) at positions[j], in double.
template <class Tuning, class Source>
void gather(workspace& ws, const Source& source, std::span<const std::size_t> positions, std::span<double> out,
            bool magnitude) {
  if (positions.empty()) return;
  auto* device_positions = ws.upload_positions(positions);
  double* values = workspace::staging<double>(ws.staging_values, positions.size());
  gather_values<Tuning><<<grid<Tuning>(positions.size()), Tuning::block_threads, 0, ws.stream>>>(
      source, device_positions, positions.size(), values, magnitude);
  SIDCO_CUDA(cudaGetLastError());
  ws.copy_back(out.data(), values, positions.size());
}

/// The first NaN or infinity and its value ({size, 0} when none): the error path's 2 waits.
template <class Tuning, class Source>
nonfinite_value first_nonfinite(workspace& ws, const Source& source) {
  auto* first = ws.counters(1);
  const unsigned long long none = source.size;
  SIDCO_CUDA(cudaMemcpyAsync(first, &none, sizeof none, cudaMemcpyHostToDevice, ws.stream));
  find_nonfinite<Tuning><<<grid<Tuning>(source.size), Tuning::block_threads, 0, ws.stream>>>(source, first);
  SIDCO_CUDA(cudaGetLastError());
  const std::size_t at = std::size_t(ws.fetch_counter(first));
  if (at >= source.size) return {source.size, 0.0};
  double value = 0;
  const std::size_t position = at;
  gather<Tuning>(ws, source, {&position, 1}, {&value, 1}, false);
  return {at, value};
}

/// Error feedback: the state of the entries of out from begin on is cleared (sent).
template <class Tuning, class Source, class T, class Index>
void mark_sent(workspace& ws, const Source& source, const sparse_vector<T, Index, sidco::memory::device>& out,
               std::size_t begin) {
  if constexpr (Source::has_state) {
    const std::size_t count = out.size() - begin;
    if (count == 0) return;
    clear_sent<Tuning><<<grid<Tuning>(count), Tuning::block_threads, 0, ws.stream>>>(
        source, out.indices().data() + begin, count);
    SIDCO_CUDA(cudaGetLastError());
  }
}

}  // namespace sidco::backend::cuda_detail
