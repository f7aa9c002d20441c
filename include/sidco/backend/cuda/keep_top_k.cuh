// backend::cuda's exact Top-k over runs of a sparse vector's entries (one run per layer):
// the radix walk of core/radix_select.hpp kept on the device, one walk per run. Each entry's
// run is found once (a binary search over the runs) and kept as a 32-bit label; each 8-bit
// round is one digit histogram over every run's entries and one launch that chooses every
// run's digit (a block a run); then one scan counts, per entry, the keys above its run's k-th
// and the ties before it, and one pass writes the kept (index, value) pairs in order. The
// launches do not depend on the run count, and nothing waits for the host: the keeps are
// known, so nothing sizes the output.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <span>
#include <type_traits>

#include <cub/block/block_scan.cuh>
#include <cub/device/device_scan.cuh>
#include <thrust/iterator/counting_iterator.h>
#include <thrust/iterator/transform_iterator.h>

#include "sidco/backend/cuda/runs.hpp"
#include "sidco/backend/cuda/tuning.cuh"
#include "sidco/backend/cuda/workspace.cuh"
#include "sidco/backend/host/keep_top_k.hpp"
#include "sidco/core/magnitude_key.hpp"
#include "sidco/core/radix_select.hpp"
#include "sidco/core/sparse_vector.hpp"
#include "sidco/memory/device.cuh"

namespace sidco::backend::cuda_detail {

// Entry j's tally once the walks are done (read through a transform iterator: no flag array).
template <class T>
struct tally_of {
  const T* values;
  const run_plan* plans;
  const std::uint32_t* labels;
  const radix_select<magnitude_key_t<T>>* walks;
  __device__ top_k_tally operator()(std::size_t j) const {
    const std::uint32_t s = labels[j];
    return tally(plans[s], walks[s], magnitude_key(values[j]));
  }
};

// labels[j] = the run holding entry j.
template <class Tuning>
__global__ void __launch_bounds__(Tuning::block_threads)
    label_runs(const run_plan* plans, std::size_t runs, std::size_t count, std::uint32_t* labels) {
  for (std::size_t j = std::size_t(blockIdx.x) * Tuning::block_threads + threadIdx.x; j < count;
       j += std::size_t(gridDim.x) * Tuning::block_threads)
    labels[j] = std::uint32_t(run_of(plans, runs, j));
}

// Every run's walk before round 0.
template <class Key>
__global__ void start_walks(const run_plan* plans, std::size_t runs, radix_select<Key>* walks) {
  for (std::size_t s = std::size_t(blockIdx.x) * blockDim.x + threadIdx.x; s < runs;
       s += std::size_t(gridDim.x) * blockDim.x)
    walks[s] = radix_select<Key>(plans[s].keep);
}

// Counts of this round's 8-bit digit among each trimmed run's keys still in the running,
// runs x 256 bins. A block takes chunks of consecutive entries; the run its chunk starts in
// counts in shared memory, a run starting inside the chunk (a small one) straight in global.
template <class Tuning>
inline constexpr std::size_t histogram_chunk = std::size_t(Tuning::block_threads) * Tuning::write_items * 4;

template <class Tuning, class T>
__global__ void __launch_bounds__(Tuning::block_threads)
    digit_histogram(const T* __restrict__ values, std::size_t count, const run_plan* plans,
                    const std::uint32_t* __restrict__ labels,
                    const radix_select<magnitude_key_t<T>>* walks, int round, unsigned long long* bins) {
  constexpr int bin_count = radix_select<magnitude_key_t<T>>::bins;
  constexpr std::size_t chunk = histogram_chunk<Tuning>;
  __shared__ unsigned int local[bin_count];
  for (std::size_t first = std::size_t(blockIdx.x) * chunk; first < count; first += std::size_t(gridDim.x) * chunk) {
    const std::size_t last = first + chunk < count ? first + chunk : count;
    const std::size_t home = labels[first];
    const run_plan home_plan = plans[home];
    const auto home_walk = walks[home];
    for (int b = threadIdx.x; b < bin_count; b += Tuning::block_threads) local[b] = 0;
    __syncthreads();
    for (std::size_t j = first + threadIdx.x; j < last; j += Tuning::block_threads) {
      if (j < home_plan.end) {
        if (!home_plan.trims()) continue;
        const int d = home_walk.digit(magnitude_key(values[j]), round);
        if (d >= 0) atomicAdd(&local[d], 1u);
      } else {
        const std::size_t s = labels[j];
        if (!plans[s].trims()) continue;
        const int d = walks[s].digit(magnitude_key(values[j]), round);
        if (d >= 0) atomicAdd(&bins[s * bin_count + std::size_t(d)], 1ull);
      }
    }
    __syncthreads();
    if (home_plan.trims())
      for (int b = threadIdx.x; b < bin_count; b += Tuning::block_threads)
        if (local[b]) atomicAdd(&bins[home * bin_count + std::size_t(b)], static_cast<unsigned long long>(local[b]));
    __syncthreads();
  }
}

// This round's digit of every trimmed run (block s: run s) from its histogram, then its
// bins zeroed for the next round.
template <class Key>
__global__ void choose_digits(const run_plan* plans, radix_select<Key>* walks, unsigned long long* bins, int round) {
  constexpr std::size_t bin_count = radix_select<Key>::bins;
  const std::size_t s = blockIdx.x;
  if (!plans[s].trims()) return;
  unsigned long long* run_bins = bins + s * bin_count;
  if (threadIdx.x == 0) walks[s].choose(run_bins, round);
  __syncthreads();
  for (unsigned b = threadIdx.x; b < bin_count; b += blockDim.x) run_bins[b] = 0;
}

// choose_digits with every thread of the block (a tuning's parallel_digit_choice): each holds
// bins / threads consecutive positions counted from the top bin, an inclusive block scan sums
// them from the top, and the one position where the count first reaches the walk's needed
// (bin_reaching_at) fixes the digit; the same digit and needed as choose(), without one
// thread reading 256 counts one after another.
template <class Tuning, class Key>
__global__ void __launch_bounds__(Tuning::block_threads)
    choose_digits_parallel(const run_plan* plans, radix_select<Key>* walks, unsigned long long* bins, int round) {
  constexpr std::size_t bin_count = radix_select<Key>::bins;
  static_assert(bin_count % std::size_t(Tuning::block_threads) == 0, "whole shares of the bins a thread");
  constexpr int items = int(bin_count / std::size_t(Tuning::block_threads));
  using scan = cub::BlockScan<unsigned long long, Tuning::block_threads>;
  __shared__ typename scan::TempStorage temp;
  const std::size_t s = blockIdx.x;
  if (!plans[s].trims()) return;
  unsigned long long* run_bins = bins + s * bin_count;
  const std::size_t needed = walks[s].needed;  // read by all before the scan's barriers
  const std::size_t first = std::size_t(threadIdx.x) * items;
  unsigned long long counts[items], at_or_above[items];
  for (int i = 0; i < items; ++i) counts[i] = run_bins[bin_count - 1 - (first + std::size_t(i))];
  scan(temp).InclusiveSum(counts, at_or_above);
  for (int i = 0; i < items; ++i) {
    const std::size_t p = first + std::size_t(i);
    std::size_t needed_now = 0;
    if (bin_reaching_at(p, bin_count, at_or_above[i], at_or_above[i] - counts[i], needed, needed_now))
      walks[s].take(bin_count - 1 - p, needed_now, round);
    run_bins[bin_count - 1 - p] = 0;  // for the next round; only this thread read it
  }
}

/// Whether a tuning chooses the radix walks' digits with the whole block
/// (choose_digits_parallel) or one thread (choose_digits; tunings without the flag).
template <class Tuning>
constexpr bool parallel_digit_choice() {
  if constexpr (requires { Tuning::parallel_digit_choice; })
    return Tuning::parallel_digit_choice;
  else
    return false;
}

// Each kept entry at its run's output offset plus its rank in the run: every entry of a run
// kept whole; else the keys above the k-th before it plus the ties before it, at most
// walk.needed of them (ties go to the lower index).
template <class Tuning, class T, class Index>
__global__ void __launch_bounds__(Tuning::block_threads)
    write_top_k(const T* __restrict__ values, const Index* __restrict__ indices, std::size_t count,
                const run_plan* plans, const std::uint32_t* __restrict__ labels,
                const radix_select<magnitude_key_t<T>>* walks, const top_k_tally* __restrict__ before,
                Index* __restrict__ kept_indices, T* __restrict__ kept_values) {
  for (std::size_t j = std::size_t(blockIdx.x) * Tuning::block_threads + threadIdx.x; j < count;
       j += std::size_t(gridDim.x) * Tuning::block_threads) {
    const std::uint32_t s = labels[j];
    const run_plan plan = plans[s];
    const T v = values[j];
    const std::size_t at = kept_at(plan, walks[s], magnitude_key(v), j, before[j], before[plan.begin]);
    if (at == not_kept) continue;
    kept_indices[at] = indices[j];
    kept_values[at] = v;
  }
}

/// Of the entries of out from begin on, runs of run_sizes[s]: keeps the keep[s] largest
/// magnitudes of each (ties: lowest index), in order. Everything on the workspace's stream;
/// no host wait.
template <class Tuning, class T, class Index>
void keep_top_k(workspace& ws, sparse_vector<T, Index, sidco::memory::device>& out, std::size_t begin,
                std::span<const std::size_t> run_sizes, std::span<const std::size_t> keep) {
  using Key = magnitude_key_t<T>;
  using walk_type = radix_select<Key>;
  static_assert(std::is_trivially_copyable_v<walk_type> && std::is_trivially_copyable_v<run_plan>);
  const std::size_t count = out.size() - begin, runs = run_sizes.size();
  run_plan* plans = ws.fill<run_plan>(ws.run_staging, runs);
  const run_totals totals = plan_runs(run_sizes, keep, plans);
  host::check_runs_hold(totals.entries, count);
  if (!totals.trims) return;
  const run_plan* table = ws.upload<run_plan>(ws.run_table, ws.run_staging, runs);
  const T* values = out.value_data() + begin;
  const Index* indices = out.index_data() + begin;
  auto* walks = workspace::staging<walk_type>(ws.walk_state, runs);
  auto* bins = workspace::staging<unsigned long long>(ws.bins, runs * walk_type::bins);
  const unsigned run_blocks = ws.blocks<Tuning>(runs);
  start_walks<<<run_blocks, Tuning::block_threads, 0, ws.stream>>>(table, runs, walks);
  SIDCO_CUDA(cudaGetLastError());
  SIDCO_CUDA(cudaMemsetAsync(bins, 0, runs * walk_type::bins * sizeof(unsigned long long), ws.stream));
  ws.run_labels.resize(count);
  std::uint32_t* labels = ws.run_labels.data();
  const unsigned blocks = ws.blocks<Tuning>(count);
  label_runs<Tuning><<<blocks, Tuning::block_threads, 0, ws.stream>>>(table, runs, count, labels);
  SIDCO_CUDA(cudaGetLastError());
  const unsigned chunk_blocks = ws.blocks<Tuning>(count, histogram_chunk<Tuning>);
  for (int round = 0; round < walk_type::rounds; ++round) {
    digit_histogram<Tuning><<<chunk_blocks, Tuning::block_threads, 0, ws.stream>>>(values, count, table, labels, walks,
                                                                                   round, bins);
    SIDCO_CUDA(cudaGetLastError());
    if constexpr (parallel_digit_choice<Tuning>())
      choose_digits_parallel<Tuning><<<unsigned(runs), Tuning::block_threads, 0, ws.stream>>>(table, walks, bins, round);
    else
      choose_digits<<<unsigned(runs), Tuning::block_threads, 0, ws.stream>>>(table, walks, bins, round);
    SIDCO_CUDA(cudaGetLastError());
  }
  auto* tallies = workspace::staging<top_k_tally>(ws.tallies, count);
  const auto tally_in = thrust::make_transform_iterator(thrust::counting_iterator<std::size_t>(0),
                                                        tally_of<T>{values, table, labels, walks});
  std::size_t bytes = 0;
  SIDCO_CUDA(cub::DeviceScan::ExclusiveScan(nullptr, bytes, tally_in, tallies, add_tallies{}, top_k_tally{}, count,
                                            ws.stream));
  SIDCO_CUDA(cub::DeviceScan::ExclusiveScan(ws.scratch(bytes), bytes, tally_in, tallies, add_tallies{}, top_k_tally{},
                                            count, ws.stream));
  Index* kept_indices = workspace::staging<Index>(ws.staging_indices, totals.kept);
  T* kept_values = workspace::staging<T>(ws.staging_values, totals.kept);
  write_top_k<Tuning><<<blocks, Tuning::block_threads, 0, ws.stream>>>(values, indices, count, table, labels, walks,
                                                                        tallies, kept_indices, kept_values);
  SIDCO_CUDA(cudaGetLastError());
  SIDCO_CUDA(cudaMemcpyAsync(out.index_data() + begin, kept_indices, totals.kept * sizeof(Index),
                             cudaMemcpyDeviceToDevice, ws.stream));
  SIDCO_CUDA(cudaMemcpyAsync(out.value_data() + begin, kept_values, totals.kept * sizeof(T), cudaMemcpyDeviceToDevice,
                             ws.stream));
  out.truncate(begin + totals.kept);
}

}  // namespace sidco::backend::cuda_detail
