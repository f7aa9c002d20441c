// backend::cuda's decode: dense += scale × a sparse vector, after one check (one host wait)
// that every index is in range, so that a bad vector changes nothing. The NCCL reducer
// uses the same two kernels.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "sidco/backend/cuda/tuning.cuh"
#include "sidco/backend/cuda/workspace.cuh"
#include "sidco/core/arithmetic.hpp"
#include "sidco/core/error.hpp"
#include "sidco/core/sparse_vector.hpp"
#include "sidco/memory/device.cuh"

namespace sidco::backend::cuda_detail {

// The largest index of a sparse vector, into *largest: reduced within each warp first, so
// one atomic per warp reaches the one address (same-address atomics serialize).
template <class Tuning, class Index>
__global__ void __launch_bounds__(Tuning::block_threads)
    largest_index(const Index* indices, std::size_t count, unsigned long long* largest) {
  static_assert(Tuning::block_threads % 32 == 0, "the warp reduction needs whole warps");
  unsigned long long mine = 0;
  for (std::size_t j = std::size_t(blockIdx.x) * Tuning::block_threads + threadIdx.x; j < count;
       j += std::size_t(gridDim.x) * Tuning::block_threads)
    mine = indices[j] > mine ? indices[j] : mine;
  for (int offset = 16; offset > 0; offset /= 2) {
    const unsigned long long other = __shfl_down_sync(0xffffffffu, mine, offset);
    mine = other > mine ? other : mine;
  }
  if (threadIdx.x % 32 == 0 && mine) atomicMax(largest, mine);
}

// dense[i] += scale v for every entry: indices within one vector are distinct, so no
// atomics; the add is rounded once, as on the host.
template <class Tuning, class T, class Index>
__global__ void __launch_bounds__(Tuning::block_threads)
    add_entries(const Index* indices, const T* values, std::size_t count, T* dense, T scale) {
  for (std::size_t j = std::size_t(blockIdx.x) * Tuning::block_threads + threadIdx.x; j < count;
       j += std::size_t(gridDim.x) * Tuning::block_threads)
    dense[indices[j]] = sidco::detail::fused_multiply_add(scale, values[j], dense[indices[j]]);
}

template <class Tuning, class T, class Index>
void scatter_add(workspace& ws, const sparse_vector<T, Index, sidco::memory::device>& in,
                 sidco::memory::device::view<T> dense, T scale) {
  if (in.dense_size() != dense.size())
    sidco::detail::fail("dense: size ", dense.size(), " does not match the sparse vector's dense size ", in.dense_size());
  if (in.empty()) return;
  auto* largest = ws.counters(1);
  largest_index<Tuning><<<ws.blocks<Tuning>(in.size()), Tuning::block_threads, 0, ws.stream>>>(
      in.indices().data(), in.size(), largest);
  SIDCO_CUDA(cudaGetLastError());
  const auto top = ws.fetch_counter(largest);
  if (top >= dense.size())
    sidco::detail::fail("sparse vector: index ", top, " is out of range for dense size ", dense.size());
  add_entries<Tuning><<<ws.blocks<Tuning>(in.size()), Tuning::block_threads, 0, ws.stream>>>(
      in.indices().data(), in.values().data(), in.size(), dense.data(), scale);
  SIDCO_CUDA(cudaGetLastError());
}

}  // namespace sidco::backend::cuda_detail
