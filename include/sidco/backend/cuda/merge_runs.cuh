// backend::cuda's merge of a sparse vector's per-layer runs into one index order: the runs
// hold distinct indices, so a CUB radix sort of the pairs by index is the merge. No host wait.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include <cub/device/device_radix_sort.cuh>

#include "sidco/backend/cuda/workspace.cuh"
#include "sidco/core/sparse_vector.hpp"
#include "sidco/memory/device.cuh"

namespace sidco::backend::cuda_detail {

template <class T, class Index>
void merge_runs(workspace& ws, sparse_vector<T, Index, sidco::memory::device>& out, std::size_t begin) {
  const std::size_t count = out.size() - begin;
  if (count < 2) return;
  Index* sorted_indices = workspace::staging<Index>(ws.staging_indices, count);
  T* sorted_values = workspace::staging<T>(ws.staging_values, count);
  Index* indices = out.index_data() + begin;
  T* values = out.value_data() + begin;
  std::size_t bytes = 0;
  SIDCO_CUDA(cub::DeviceRadixSort::SortPairs(nullptr, bytes, indices, sorted_indices, values, sorted_values,
                                             std::int64_t(count), 0, int(8 * sizeof(Index)), ws.stream));
  SIDCO_CUDA(cub::DeviceRadixSort::SortPairs(ws.scratch(bytes), bytes, indices, sorted_indices, values, sorted_values,
                                             std::int64_t(count), 0, int(8 * sizeof(Index)), ws.stream));
  SIDCO_CUDA(cudaMemcpyAsync(indices, sorted_indices, count * sizeof(Index), cudaMemcpyDeviceToDevice, ws.stream));
  SIDCO_CUDA(cudaMemcpyAsync(values, sorted_values, count * sizeof(T), cudaMemcpyDeviceToDevice, ws.stream));
}

}  // namespace sidco::backend::cuda_detail
