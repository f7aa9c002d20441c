// backend::cuda's kernels. Each thread block works on one piece of the layout (pieces.hpp);
// what they compute per element is in elementwise.hpp, shared with the host tests.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>

#include "sidco/backend/cuda/elementwise.hpp"
#include "sidco/backend/cuda/pieces.hpp"
#include "sidco/core/arithmetic.hpp"
#include "sidco/core/magnitude_key.hpp"
#include "sidco/core/radix_select.hpp"

namespace sidco::backend::cuda_detail {

/// Threads per block of every kernel, and values each thread handles per step of the
/// selection's write pass (4 values: 16 bytes of floats, one cache line a warp).
inline constexpr int block_threads = 256;
inline constexpr int write_items = 4;

// Moments of |x| and the probes' tails over one piece per block, reduced in a fixed order.
template <bool Log, bool TailLog, std::size_t Probes, class Source>
__global__ void __launch_bounds__(block_threads)
    analyze_pieces(Source source, const piece* pieces, const device_probe<typename Source::value_type>* probes,
                   moments_bundle<1 + Probes>* out) {
  using T = typename Source::value_type;
  const piece pc = pieces[blockIdx.x];
  thread_statistics<T, Probes> mine;
  const device_probe<T>* own = probes + std::size_t(pc.segment) * Probes;
  for (std::size_t i = pc.offset + threadIdx.x; i < pc.offset + pc.size; i += block_threads)
    mine.template add<Log, TailLog>(source.value(i), own);
  moments_bundle<1 + Probes> bundle;
  mine.to_moments(bundle.m);
  using reduce = cub::BlockReduce<moments_bundle<1 + Probes>, block_threads>;
  __shared__ typename reduce::TempStorage temp;
  const auto total = reduce(temp).Reduce(bundle, merge_bundles{});
  if (threadIdx.x == 0) out[blockIdx.x] = total;
}

// One block per segment merges its pieces' bundles, in a fixed order.
template <std::size_t Width>
__global__ void __launch_bounds__(block_threads)
    merge_segments(const moments_bundle<Width>* per_piece, const std::uint32_t* segment_first,
                   moments_bundle<Width>* out) {
  moments_bundle<Width> mine;
  for (std::uint32_t j = segment_first[blockIdx.x] + threadIdx.x; j < segment_first[blockIdx.x + 1];
       j += block_threads)
    mine = mine.merged(per_piece[j]);
  using reduce = cub::BlockReduce<moments_bundle<Width>, block_threads>;
  __shared__ typename reduce::TempStorage temp;
  const auto total = reduce(temp).Reduce(mine, merge_bundles{});
  if (threadIdx.x == 0) out[blockIdx.x] = total;
}

// What a selection keeps: Rescan reads the settled state (select_band), else the value.
template <bool Rescan, class Source>
__device__ typename Source::value_type read(const Source& source, std::size_t i) {
  if constexpr (Rescan)
    return source.rescan_value(i);
  else
    return source.value(i);
}

// Per piece: how many values the predicate of its segment keeps.
template <bool Rescan, class Source, class Predicate>
__global__ void __launch_bounds__(block_threads)
    count_pieces(Source source, const piece* pieces, const Predicate* predicates, std::uint32_t* counts) {
  const piece pc = pieces[blockIdx.x];
  const Predicate keep = predicates[pc.segment];
  std::uint32_t mine = 0;
  for (std::size_t i = pc.offset + threadIdx.x; i < pc.offset + pc.size; i += block_threads)
    mine += keep(read<Rescan>(source, i));
  using reduce = cub::BlockReduce<std::uint32_t, block_threads>;
  __shared__ typename reduce::TempStorage temp;
  const std::uint32_t total = reduce(temp).Sum(mine);
  if (threadIdx.x == 0) counts[blockIdx.x] = total;
}

// Per piece: writes the kept (base + i, v) from offsets[piece] on, in index order, and
// (Settle) settles every value: as sent where kept when Final, else as unsent.
template <bool Rescan, bool Settle, bool Final, class Source, class Predicate, class Index>
__global__ void __launch_bounds__(block_threads)
    write_pieces(Source source, const piece* pieces, const Predicate* predicates, const std::size_t* offsets,
                 Index* indices, typename Source::value_type* values) {
  using T = typename Source::value_type;
  using scan = cub::BlockScan<int, block_threads>;
  __shared__ typename scan::TempStorage temp;
  const piece pc = pieces[blockIdx.x];
  const Predicate keep = predicates[pc.segment];
  const std::size_t end = pc.offset + pc.size;
  std::size_t at = offsets[blockIdx.x];
  for (std::size_t chunk = pc.offset; chunk < end; chunk += std::size_t(block_threads) * write_items) {
    T v[write_items];
    int flag[write_items], position[write_items];
    const std::size_t first = chunk + std::size_t(threadIdx.x) * write_items;
    for (int j = 0; j < write_items; ++j) {
      const std::size_t i = first + std::size_t(j);
      flag[j] = 0;
      if (i < end) {
        v[j] = read<Rescan>(source, i);
        flag[j] = keep(v[j]);
        if constexpr (Settle && Source::has_state) source.settle(i, v[j], Final && flag[j]);
      }
    }
    int kept = 0;
    scan(temp).ExclusiveSum(flag, position, kept);
    for (int j = 0; j < write_items; ++j)
      if (flag[j]) {
        indices[at + std::size_t(position[j])] = Index(source.base + first + std::size_t(j));
        values[at + std::size_t(position[j])] = v[j];
      }
    at += std::size_t(kept);
    __syncthreads();  // temp is reused
  }
}

// Counts magnitude keys >> shift into bins (a block's histogram in shared memory first).
template <class Source>
__global__ void __launch_bounds__(block_threads)
    key_histogram(Source source, int shift, unsigned long long* bins, int bin_count) {
  extern __shared__ unsigned int local[];
  for (int b = threadIdx.x; b < bin_count; b += block_threads) local[b] = 0;
  __syncthreads();
  for (std::size_t i = std::size_t(blockIdx.x) * block_threads + threadIdx.x; i < source.size;
       i += std::size_t(gridDim.x) * block_threads)
    atomicAdd(&local[magnitude_key(source.value(i)) >> shift], 1u);
  __syncthreads();
  for (int b = threadIdx.x; b < bin_count; b += block_threads)
    if (local[b]) atomicAdd(&bins[b], static_cast<unsigned long long>(local[b]));
}

// How many |x| > t, into *count.
template <class Source>
__global__ void __launch_bounds__(block_threads)
    count_above(Source source, above_key<typename Source::value_type> keep, unsigned long long* count) {
  unsigned long long mine = 0;
  for (std::size_t i = std::size_t(blockIdx.x) * block_threads + threadIdx.x; i < source.size;
       i += std::size_t(gridDim.x) * block_threads)
    mine += keep(source.value(i));
  using reduce = cub::BlockReduce<unsigned long long, block_threads>;
  __shared__ typename reduce::TempStorage temp;
  const unsigned long long total = reduce(temp).Sum(mine);
  if (threadIdx.x == 0 && total) atomicAdd(count, total);
}

// The smallest index of a NaN or infinity, into *first (which starts at the size).
template <class Source>
__global__ void __launch_bounds__(block_threads) first_nonfinite(Source source, unsigned long long* first) {
  using T = typename Source::value_type;
  for (std::size_t i = std::size_t(blockIdx.x) * block_threads + threadIdx.x; i < source.size;
       i += std::size_t(gridDim.x) * block_threads)
    if (magnitude_key(source.value(i)) >= magnitude_key_t<T>(float_traits<T>::infinity))
      atomicMin(first, static_cast<unsigned long long>(i));
}

// out[j] = |x at positions[j]| (also the one value the error path reports).
template <class Source>
__global__ void __launch_bounds__(block_threads)
    gather_magnitudes(Source source, const std::size_t* positions, std::size_t count, double* out, bool magnitude) {
  for (std::size_t j = std::size_t(blockIdx.x) * block_threads + threadIdx.x; j < count;
       j += std::size_t(gridDim.x) * block_threads) {
    const double v = double(to_accumulator(source.value(positions[j])));
    out[j] = magnitude ? (v < 0 ? -v : v) : v;
  }
}

// Random-k: the chosen entries' (base + i, v); then every value settles as unsent, then
// the chosen ones as sent (the state's value is v there, as the write read it).
template <class Source, class Index>
__global__ void __launch_bounds__(block_threads)
    write_chosen(Source source, const std::size_t* chosen, std::size_t count, Index* indices,
                 typename Source::value_type* values) {
  for (std::size_t j = std::size_t(blockIdx.x) * block_threads + threadIdx.x; j < count;
       j += std::size_t(gridDim.x) * block_threads) {
    indices[j] = Index(source.base + chosen[j]);
    values[j] = source.value(chosen[j]);
  }
}

template <class Source>
__global__ void __launch_bounds__(block_threads) settle_unsent(Source source) {
  for (std::size_t i = std::size_t(blockIdx.x) * block_threads + threadIdx.x; i < source.size;
       i += std::size_t(gridDim.x) * block_threads)
    source.settle(i, source.value(i), false);
}

// Clears the state of the entries sent (global indices, base subtracted).
template <class Source, class Index>
__global__ void __launch_bounds__(block_threads) mark_sent(Source source, const Index* indices, std::size_t count) {
  for (std::size_t j = std::size_t(blockIdx.x) * block_threads + threadIdx.x; j < count;
       j += std::size_t(gridDim.x) * block_threads)
    source.mark_sent(std::size_t(indices[j]) - source.base);
}

template <class Source>
__global__ void __launch_bounds__(block_threads)
    mark_chosen(Source source, const std::size_t* chosen, std::size_t count) {
  for (std::size_t j = std::size_t(blockIdx.x) * block_threads + threadIdx.x; j < count;
       j += std::size_t(gridDim.x) * block_threads)
    source.mark_sent(chosen[j]);
}

// Radix select: counts of this round's 8-bit digit among the keys still in the running.
template <class T>
__global__ void __launch_bounds__(block_threads)
    digit_histogram(const T* values, std::size_t count, radix_select<magnitude_key_t<T>> walk, int round,
                    unsigned long long* bins) {
  __shared__ unsigned int local[256];
  for (int b = threadIdx.x; b < 256; b += block_threads) local[b] = 0;
  __syncthreads();
  for (std::size_t j = std::size_t(blockIdx.x) * block_threads + threadIdx.x; j < count;
       j += std::size_t(gridDim.x) * block_threads) {
    const int d = walk.digit(magnitude_key(values[j]), round);
    if (d >= 0) atomicAdd(&local[d], 1u);
  }
  __syncthreads();
  for (int b = threadIdx.x; b < 256; b += block_threads)
    if (local[b]) atomicAdd(&bins[b], static_cast<unsigned long long>(local[b]));
}

// 1 where the k-th key is tied, for the scan that ranks ties by index.
template <class T>
__global__ void __launch_bounds__(block_threads)
    tie_flags(const T* values, std::size_t count, radix_select<magnitude_key_t<T>> walk, std::uint32_t* ties) {
  for (std::size_t j = std::size_t(blockIdx.x) * block_threads + threadIdx.x; j < count;
       j += std::size_t(gridDim.x) * block_threads)
    ties[j] = walk.rank(magnitude_key(values[j])) == 0;
}

// 1 where an entry belongs to the top k: above the k-th key, or among its first
// walk.needed ties (tie_rank: ties before it).
template <class T>
__global__ void __launch_bounds__(block_threads)
    top_k_flags(const T* values, std::size_t count, radix_select<magnitude_key_t<T>> walk,
                const std::uint32_t* tie_rank, char* keep) {
  for (std::size_t j = std::size_t(blockIdx.x) * block_threads + threadIdx.x; j < count;
       j += std::size_t(gridDim.x) * block_threads) {
    const int r = walk.rank(magnitude_key(values[j]));
    keep[j] = r > 0 || (r == 0 && tie_rank[j] < walk.needed);
  }
}

// The largest index of a sparse vector, into *largest.
template <class Index>
__global__ void __launch_bounds__(block_threads)
    largest_index(const Index* indices, std::size_t count, unsigned long long* largest) {
  unsigned long long mine = 0;
  for (std::size_t j = std::size_t(blockIdx.x) * block_threads + threadIdx.x; j < count;
       j += std::size_t(gridDim.x) * block_threads)
    mine = indices[j] > mine ? indices[j] : mine;
  if (mine) atomicMax(largest, mine);
}

// dense[i] += scale v for every entry: indices within one vector are distinct, so no
// atomics; the add is rounded once, as on the host.
template <class T, class Index>
__global__ void __launch_bounds__(block_threads)
    scatter_add(const Index* indices, const T* values, std::size_t count, T* dense, T scale) {
  for (std::size_t j = std::size_t(blockIdx.x) * block_threads + threadIdx.x; j < count;
       j += std::size_t(gridDim.x) * block_threads)
    dense[indices[j]] = sidco::detail::fused_multiply_add(scale, values[j], dense[indices[j]]);
}

}  // namespace sidco::backend::cuda_detail
