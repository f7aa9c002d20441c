// backend::cuda's Random-k selection: the chosen positions' entries, then the error-feedback
// state settled (every value unsent, then the chosen ones sent). No host wait.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <span>

#include "sidco/backend/cuda/tuning.cuh"
#include "sidco/backend/cuda/workspace.cuh"
#include "sidco/core/sparse_vector.hpp"
#include "sidco/memory/device.cuh"

namespace sidco::backend::cuda_detail {

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

/// Appends the entries at the chosen positions (distinct, ascending) to out.
template <class Tuning, class Source, class T, class Index>
void select_indices(workspace& ws, const Source& source, std::span<const std::size_t> chosen,
                    sparse_vector<T, Index, sidco::memory::device>& out) {
  const std::size_t start = out.size();
  ws.adopt(out);
  out.resize(start + chosen.size());
  auto* positions = ws.upload_positions(chosen);
  if (!chosen.empty())
    write_chosen<Tuning><<<grid<Tuning>(chosen.size()), Tuning::block_threads, 0, ws.stream>>>(
        source, positions, chosen.size(), out.index_data() + start, out.value_data() + start);
  if constexpr (Source::has_state) {
    settle_unsent<Tuning><<<grid<Tuning>(source.size), Tuning::block_threads, 0, ws.stream>>>(source);
    if (!chosen.empty())
      mark_chosen<Tuning><<<grid<Tuning>(chosen.size()), Tuning::block_threads, 0, ws.stream>>>(source, positions,
                                                                                               chosen.size());
  }
  SIDCO_CUDA(cudaGetLastError());
}

}  // namespace sidco::backend::cuda_detail
