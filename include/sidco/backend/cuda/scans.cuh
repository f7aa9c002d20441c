// backend::cuda's scans: count above a threshold, each segment's coarse histogram (with its
// zeros and non-finite values) and the coarse radix bin of its k-th largest, the first
// non-finite value, a sample of magnitudes at positions drawn on the device, a gather of
// chosen values (each one host wait for its small result), and the sent marks of error
// feedback (none).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <type_traits>

#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>

#include "sidco/backend/cuda/elementwise.hpp"
#include "sidco/backend/cuda/pieces.hpp"
#include "sidco/backend/cuda/stripes.hpp"
#include "sidco/backend/cuda/tuning.cuh"
#include "sidco/backend/cuda/workspace.cuh"
#include "sidco/backend/pass_statistics.hpp"
#include "sidco/core/float_traits.hpp"
#include "sidco/core/magnitude_key.hpp"
#include "sidco/core/moments.hpp"
#include "sidco/core/radix_select.hpp"
#include "sidco/core/segment.hpp"
#include "sidco/core/splitmix.hpp"
#include "sidco/core/sparse_vector.hpp"
#include "sidco/memory/device.cuh"

namespace sidco::backend::cuda_detail {

/// Whether a tuning counts the coarse histogram's zero bin in registers (tunings without the
/// flag: no). A class, not a function: device code reads it.
template <class Tuning>
struct counts_zero_bin_in_registers : std::false_type {};
template <class Tuning>
  requires requires { Tuning::zero_bin_in_registers; }
struct counts_zero_bin_in_registers<Tuning> : std::bool_constant<Tuning::zero_bin_in_registers> {};

// The coarse histogram of one piece per block (magnitude key >> coarse_shift) into its
// segment's coarse_bins counters: in shared memory first, added to global where non-zero.
// The piece's exact zeros and non-finite values go to its segment's tallies (2 s, 2 s + 1).
template <class Tuning, class Source>
__global__ void __launch_bounds__(Tuning::block_threads)
    coarse_histogram(Source source, const piece* pieces, unsigned long long* bins, unsigned long long* tallies) {
  using Key = magnitude_key_t<typename Source::value_type>;
  constexpr int shift = coarse_shift<Key>;
  constexpr Key infinity = Key(float_traits<typename Source::value_type>::infinity);
  __shared__ unsigned int local[coarse_bins];
  __shared__ unsigned int local_tallies[2];
  for (unsigned b = threadIdx.x; b < coarse_bins; b += Tuning::block_threads) local[b] = 0;
  if (threadIdx.x < 2) local_tallies[threadIdx.x] = 0;
  __syncthreads();
  const piece pc = pieces[blockIdx.x];
  unsigned int zeros = 0;  // the zero bin's count, with zero_bin_in_registers
  unsigned int exact_zeros = 0, nonfinite = 0;
  for_each_striped<Tuning::load_items>(
      pc.offset + threadIdx.x, pc.offset + pc.size, Tuning::block_threads, [&](std::size_t i) { return source.value(i); },
      [&](typename Source::value_type v) {
        const Key key = magnitude_key(v);
        exact_zeros += key == 0;
        nonfinite += key >= infinity;
        const auto bin = key >> shift;
        if constexpr (counts_zero_bin_in_registers<Tuning>::value) {
          if (bin == 0) {
            ++zeros;
            return;
          }
        }
        atomicAdd(&local[bin], 1u);
      });
  if (zeros) atomicAdd(&local[0], zeros);
  if (exact_zeros) atomicAdd(&local_tallies[0], exact_zeros);
  if (nonfinite) atomicAdd(&local_tallies[1], nonfinite);
  __syncthreads();
  unsigned long long* own = bins + std::size_t(pc.segment) * coarse_bins;
  for (unsigned b = threadIdx.x; b < coarse_bins; b += Tuning::block_threads)
    if (local[b]) atomicAdd(&own[b], static_cast<unsigned long long>(local[b]));
  if (threadIdx.x < 2 && local_tallies[threadIdx.x])
    atomicAdd(&tallies[2 * std::size_t(pc.segment) + threadIdx.x],
              static_cast<unsigned long long>(local_tallies[threadIdx.x]));
}

// Block s: segment s's kth_largest_bin, each thread taking a share of the bins from the top
// and an exclusive scan telling it how many lie above its share.
template <class Tuning>
__global__ void __launch_bounds__(Tuning::block_threads)
    choose_kth_bins(const unsigned long long* bins, const std::size_t* targets, key_bin* out) {
  constexpr std::size_t share = (coarse_bins + Tuning::block_threads - 1) / Tuning::block_threads;
  const unsigned long long* own = bins + std::size_t(blockIdx.x) * coarse_bins;
  const std::size_t taken = std::size_t(threadIdx.x) * share;
  const std::size_t high = taken < coarse_bins ? coarse_bins - taken : 0;
  const std::size_t low = high > share ? high - share : 0;
  unsigned long long mine = 0;
  for (std::size_t b = low; b < high; ++b) mine += own[b];
  using scan = cub::BlockScan<unsigned long long, Tuning::block_threads>;
  __shared__ typename scan::TempStorage temp;
  unsigned long long above = 0;
  scan(temp).ExclusiveSum(mine, above);
  key_bin found;
  if (kth_largest_bin_in_share(own, low, high, std::size_t(above), targets[blockIdx.x], threadIdx.x == 0,
                               low == 0 && high > 0, found))
    out[blockIdx.x] = found;
}

// How many |x| > t, into *count.
template <class Tuning, class Source>
__global__ void __launch_bounds__(Tuning::block_threads)
    count_exceeding(Source source, above_key<typename Source::value_type> keep, unsigned long long* count) {
  unsigned long long mine = 0;
  for_each_striped<Tuning::load_items>(
      std::size_t(blockIdx.x) * Tuning::block_threads + threadIdx.x, source.size,
      std::size_t(gridDim.x) * Tuning::block_threads, [&](std::size_t i) { return source.value(i); },
      [&](typename Source::value_type v) { mine += keep(v); });
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

// out[j] = x at positions[j].
template <class Tuning, class Source>
__global__ void __launch_bounds__(Tuning::block_threads)
    gather_values(Source source, const std::size_t* __restrict__ positions, std::size_t count, double* __restrict__ out) {
  for (std::size_t j = std::size_t(blockIdx.x) * Tuning::block_threads + threadIdx.x; j < count;
       j += std::size_t(gridDim.x) * Tuning::block_threads)
    out[j] = double(to_accumulator(source.value(positions[j])));
}

// out[j] = |x| at sample position j of a generator at state (the host's draw, made here).
template <class Tuning, class Source>
__global__ void __launch_bounds__(Tuning::block_threads)
    sample_values(Source source, std::uint64_t state, std::size_t count, double* __restrict__ out) {
  for (std::size_t j = std::size_t(blockIdx.x) * Tuning::block_threads + threadIdx.x; j < count;
       j += std::size_t(gridDim.x) * Tuning::block_threads) {
    const double v = double(to_accumulator(source.value(sample_position(state, j, source.size))));
    out[j] = v < 0 ? -v : v;
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
  count_exceeding<Tuning><<<ws.blocks<Tuning>(source.size), Tuning::block_threads, 0, ws.stream>>>(
      source, above_key<T>{threshold_key<T>(t)}, count);
  SIDCO_CUDA(cudaGetLastError());
  return std::size_t(ws.fetch_counter(count));
}

/// Every segment's coarse histogram, kept in ws.histograms for kth_largest_bins: one
/// histogram kernel over every segment's pieces; with counts, one host wait for each
/// segment's exact zeros and non-finite values (16 bytes a segment).
template <class Tuning, class Source>
void coarse_histograms(workspace& ws, const Source& source, std::span<const segment> layout,
                       std::span<moments> counts) {
  const std::size_t segments = layout.size();
  if (segments == 0) return;
  ws.refresh_pieces<Tuning>(layout);
  const std::size_t histogram_counts = segments * coarse_bins, total = histogram_counts + 2 * segments;
  ws.histograms.resize(total);
  SIDCO_CUDA(cudaMemsetAsync(ws.histograms.data(), 0, total * sizeof(unsigned long long), ws.stream));
  unsigned long long* const bins = ws.histograms.data();
  unsigned long long* const tallies = bins + histogram_counts;
  const std::size_t pieces = ws.plan.pieces().size();
  if (pieces > 0) {
    coarse_histogram<Tuning><<<unsigned(pieces), Tuning::block_threads, 0, ws.stream>>>(source, ws.piece_table.data(),
                                                                                        bins, tallies);
    SIDCO_CUDA(cudaGetLastError());
  }
  if (counts.empty()) return;
  const auto fetched = workspace::host_scratch<unsigned long long>(ws.result_bytes, 2 * segments);
  ws.copy_back(fetched.data(), tallies, 2 * segments);
  for (std::size_t s = 0; s < segments; ++s) {
    moments& m = counts[s] = moments{};
    m.count = layout[s].size;
    m.zeros = fetched[2 * s];
    m.nonfinite = fetched[2 * s + 1];
  }
}

/// out[s] = the coarse bin of segment s's targets[s]-th largest magnitude, from the
/// histograms the last coarse_histograms kept: one choosing kernel (a block a segment), one
/// host wait for the segments' bins (16 bytes each).
template <class Tuning>
void kth_largest_bins(workspace& ws, std::span<const std::size_t> targets, std::span<key_bin> out) {
  const std::size_t segments = targets.size();
  if (segments == 0) return;
  std::copy(targets.begin(), targets.end(), ws.fill<std::size_t>(ws.position_staging, segments));
  const std::size_t* device_targets = ws.upload<std::size_t>(ws.positions, ws.position_staging, segments);
  key_bin* found = workspace::staging<key_bin>(ws.merged, segments);
  choose_kth_bins<Tuning><<<unsigned(segments), Tuning::block_threads, 0, ws.stream>>>(ws.histograms.data(),
                                                                                      device_targets, found);
  SIDCO_CUDA(cudaGetLastError());
  ws.copy_back(out.data(), found, segments);
}

/// out[j] = x at positions[j], in double.
template <class Tuning, class Source>
void gather(workspace& ws, const Source& source, std::span<const std::size_t> positions, std::span<double> out) {
  if (positions.empty()) return;
  auto* device_positions = ws.upload_positions(positions);
  double* values = workspace::staging<double>(ws.staging_values, positions.size());
  gather_values<Tuning><<<ws.blocks<Tuning>(positions.size()), Tuning::block_threads, 0, ws.stream>>>(
      source, device_positions, positions.size(), values);
  SIDCO_CUDA(cudaGetLastError());
  ws.copy_back(out.data(), values, positions.size());
}

/// out[j] = |x| at sample_position(state, j, size), in double: the positions are drawn on
/// the device, so only the magnitudes cross the bus (one host wait).
template <class Tuning, class Source>
void sample_magnitudes(workspace& ws, const Source& source, std::uint64_t state, std::span<double> out) {
  if (out.empty() || source.size == 0) return;
  double* values = workspace::staging<double>(ws.staging_values, out.size());
  sample_values<Tuning><<<ws.blocks<Tuning>(out.size()), Tuning::block_threads, 0, ws.stream>>>(
      source, state, out.size(), values);
  SIDCO_CUDA(cudaGetLastError());
  ws.copy_back(out.data(), values, out.size());
}

/// The first NaN or infinity and its value ({size, 0} when none): the error path's 2 waits.
template <class Tuning, class Source>
nonfinite_value first_nonfinite(workspace& ws, const Source& source) {
  auto* first = ws.counters(1);
  const unsigned long long none = source.size;
  SIDCO_CUDA(cudaMemcpyAsync(first, &none, sizeof none, cudaMemcpyHostToDevice, ws.stream));
  find_nonfinite<Tuning><<<ws.blocks<Tuning>(source.size), Tuning::block_threads, 0, ws.stream>>>(source, first);
  SIDCO_CUDA(cudaGetLastError());
  const std::size_t at = std::size_t(ws.fetch_counter(first));
  if (at >= source.size) return {source.size, 0.0};
  double value = 0;
  const std::size_t position = at;
  gather<Tuning>(ws, source, {&position, 1}, {&value, 1});
  return {at, value};
}

/// Error feedback: the state of the entries of out from begin on is cleared (sent).
template <class Tuning, class Source, class T, class Index>
void mark_sent(workspace& ws, const Source& source, const sparse_vector<T, Index, sidco::memory::device>& out,
               std::size_t begin) {
  if constexpr (Source::has_state) {
    const std::size_t count = out.size() - begin;
    if (count == 0) return;
    clear_sent<Tuning><<<ws.blocks<Tuning>(count), Tuning::block_threads, 0, ws.stream>>>(
        source, out.indices().data() + begin, count);
    SIDCO_CUDA(cudaGetLastError());
  }
}

}  // namespace sidco::backend::cuda_detail
