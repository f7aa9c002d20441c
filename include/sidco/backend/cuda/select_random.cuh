// backend::cuda's Random-k selection: uniform_subset's draw (core/uniform_subset.hpp), then
// the chosen entries, then the error-feedback state settled (every value unsent, then the
// chosen ones sent). A large draw by redraws is made on the device, one host wait a round
// (for the count left after dropping repeats); a small one, or one by selection sampling
// (sequential), on the host, its indices uploaded from page-locked staging (a host wait,
// counted, only when the previous layer's upload from it is still queued).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <span>

#include <cub/device/device_radix_sort.cuh>
#include <cub/device/device_select.cuh>

#include "sidco/backend/cuda/tuning.cuh"
#include "sidco/backend/cuda/workspace.cuh"
#include "sidco/core/sparse_vector.hpp"
#include "sidco/core/splitmix.hpp"
#include "sidco/core/uniform_subset.hpp"
#include "sidco/memory/device.cuh"

namespace sidco::backend::cuda_detail {

// positions[j] = the generator's draw first + j, uniform in [0, n).
template <class Tuning>
__global__ void __launch_bounds__(Tuning::block_threads)
    draw_positions(std::uint64_t state, std::size_t first, std::size_t count, std::size_t n, std::size_t* positions) {
  for (std::size_t j = std::size_t(blockIdx.x) * Tuning::block_threads + threadIdx.x; j < count;
       j += std::size_t(gridDim.x) * Tuning::block_threads)
    positions[j] = sample_position(state, first + j, n);
}

// The chosen entries' (base + i, v), read before any settling (the state's value is v there).
template <class Tuning, class Source, class Index>
__global__ void __launch_bounds__(Tuning::block_threads)
    write_chosen(Source source, const std::size_t* chosen, std::size_t count, Index* indices,
                 typename Source::value_type* values) {
  for (std::size_t j = std::size_t(blockIdx.x) * Tuning::block_threads + threadIdx.x; j < count;
       j += std::size_t(gridDim.x) * Tuning::block_threads) {
    indices[j] = Index(source.base + chosen[j]);
    values[j] = source.value(chosen[j]);
  }
}

template <class Tuning, class Source>
__global__ void __launch_bounds__(Tuning::block_threads) settle_unsent(Source source) {
  for (std::size_t i = std::size_t(blockIdx.x) * Tuning::block_threads + threadIdx.x; i < source.size;
       i += std::size_t(gridDim.x) * Tuning::block_threads)
    source.settle(i, source.value(i), false);
}

template <class Tuning, class Source>
__global__ void __launch_bounds__(Tuning::block_threads)
    mark_chosen(Source source, const std::size_t* chosen, std::size_t count) {
  for (std::size_t j = std::size_t(blockIdx.x) * Tuning::block_threads + threadIdx.x; j < count;
       j += std::size_t(gridDim.x) * Tuning::block_threads)
    source.mark_sent(chosen[j]);
}

/// uniform_subset's redraw rounds on the device (k of n, subset_by_redraws): each round
/// draws the missing indices after the distinct ones kept, sorts all k and drops repeats,
/// and waits for the count kept; the same draws in the same order as the host, so the same
/// subset. Returns the k ascending indices in ws.positions.
template <class Tuning>
const std::size_t* draw_subset(workspace& ws, std::size_t n, std::size_t k, std::uint64_t state) {
  ws.positions.resize(k);
  std::size_t* kept = ws.positions.data();
  std::size_t* sorted = workspace::staging<std::size_t>(ws.staging_indices, k);
  unsigned long long* distinct = ws.counters(1);
  const int end_bit = std::bit_width(n - 1);
  std::size_t sort_bytes = 0, unique_bytes = 0;
  SIDCO_CUDA(cub::DeviceRadixSort::SortKeys(nullptr, sort_bytes, kept, sorted, std::int64_t(k), 0, end_bit,
                                            ws.stream));
  SIDCO_CUDA(cub::DeviceSelect::Unique(nullptr, unique_bytes, sorted, kept, distinct, std::int64_t(k), ws.stream));
  const std::size_t bytes = std::max(sort_bytes, unique_bytes);
  void* temp = ws.scratch(bytes);
  std::size_t have = 0, drawn = 0;
  while (have < k) {
    const std::size_t missing = k - have;
    draw_positions<Tuning><<<ws.blocks<Tuning>(missing), Tuning::block_threads, 0, ws.stream>>>(
        state, drawn, missing, n, kept + have);
    SIDCO_CUDA(cudaGetLastError());
    std::size_t temp_bytes = bytes;
    SIDCO_CUDA(cub::DeviceRadixSort::SortKeys(temp, temp_bytes, kept, sorted, std::int64_t(k), 0, end_bit,
                                              ws.stream));
    temp_bytes = bytes;
    SIDCO_CUDA(cub::DeviceSelect::Unique(temp, temp_bytes, sorted, kept, distinct, std::int64_t(k), ws.stream));
    have = std::size_t(ws.fetch_counter(distinct));
    drawn += missing;
  }
  return kept;
}

/// Appends the entries at uniform_subset(size, k, state) to out (k <= size).
template <class Tuning, class Source, class T, class Index>
void select_random(workspace& ws, const Source& source, std::size_t k, std::uint64_t state,
                   sparse_vector<T, Index, sidco::memory::device>& out) {
  const std::size_t start = out.size();
  ws.adopt(out);
  out.resize(start + k);
  const std::size_t* positions = nullptr;
  if (k >= Tuning::device_draw_from && subset_by_redraws(source.size, k)) {
    positions = draw_subset<Tuning>(ws, source.size, k, state);
  } else {
    uniform_subset(source.size, k, state, ws.host_chosen);
    positions = ws.upload_positions(ws.host_chosen);
  }
  if (k > 0)
    write_chosen<Tuning><<<ws.blocks<Tuning>(k), Tuning::block_threads, 0, ws.stream>>>(
        source, positions, k, out.index_data() + start, out.value_data() + start);
  if constexpr (Source::has_state) {
    settle_unsent<Tuning><<<ws.blocks<Tuning>(source.size), Tuning::block_threads, 0, ws.stream>>>(source);
    if (k > 0)
      mark_chosen<Tuning><<<ws.blocks<Tuning>(k), Tuning::block_threads, 0, ws.stream>>>(source, positions, k);
  }
  SIDCO_CUDA(cudaGetLastError());
}

}  // namespace sidco::backend::cuda_detail
