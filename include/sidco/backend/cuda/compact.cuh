// backend::cuda's threshold selections (select_above per segment, select_band over one
// source): a two-pass compaction. Per-piece counts (one host wait, which sizes the output),
// offsets, then each block writes its piece's kept entries in index order, settling the
// error-feedback state as it goes.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <span>

#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>

#include "sidco/backend/cuda/elementwise.hpp"
#include "sidco/backend/cuda/tuning.cuh"
#include "sidco/backend/cuda/workspace.cuh"
#include "sidco/core/magnitude_key.hpp"
#include "sidco/core/segment.hpp"
#include "sidco/core/sparse_vector.hpp"
#include "sidco/memory/device.cuh"

namespace sidco::backend::cuda_detail {

// What a selection keeps: Rescan reads the settled state (select_band), else the value.
template <bool Rescan, class Source>
__device__ typename Source::value_type read(const Source& source, std::size_t i) {
  if constexpr (Rescan)
    return source.rescan_value(i);
  else
    return source.value(i);
}

// Per piece: how many values the predicate of its segment keeps.
template <class Tuning, bool Rescan, class Source, class Predicate>
__global__ void __launch_bounds__(Tuning::block_threads)
    count_pieces(Source source, const piece* pieces, const Predicate* predicates, std::uint32_t* counts) {
  const piece pc = pieces[blockIdx.x];
  const Predicate keep = predicates[pc.segment];
  std::uint32_t mine = 0;
  for (std::size_t i = pc.offset + threadIdx.x; i < pc.offset + pc.size; i += Tuning::block_threads)
    mine += keep(read<Rescan>(source, i));
  using reduce = cub::BlockReduce<std::uint32_t, Tuning::block_threads>;
  __shared__ typename reduce::TempStorage temp;
  const std::uint32_t total = reduce(temp).Sum(mine);
  if (threadIdx.x == 0) counts[blockIdx.x] = total;
}

// Per piece: writes the kept (base + i, v) from offsets[piece] on, in index order, and
// (Settle) settles every value: as sent where kept when Final, else as unsent.
template <class Tuning, bool Rescan, bool Settle, bool Final, class Source, class Predicate, class Index>
__global__ void __launch_bounds__(Tuning::block_threads)
    write_pieces(Source source, const piece* pieces, const Predicate* predicates, const std::size_t* offsets,
                 Index* indices, typename Source::value_type* values) {
  using T = typename Source::value_type;
  constexpr int items = Tuning::write_items;
  using scan = cub::BlockScan<int, Tuning::block_threads>;
  __shared__ typename scan::TempStorage temp;
  const piece pc = pieces[blockIdx.x];
  const Predicate keep = predicates[pc.segment];
  const std::size_t end = pc.offset + pc.size;
  std::size_t at = offsets[blockIdx.x];
  for (std::size_t chunk = pc.offset; chunk < end; chunk += std::size_t(Tuning::block_threads) * items) {
    T v[items];
    int flag[items], position[items];
    const std::size_t first = chunk + std::size_t(threadIdx.x) * items;
    for (int j = 0; j < items; ++j) {
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
    for (int j = 0; j < items; ++j)
      if (flag[j]) {
        indices[at + std::size_t(position[j])] = Index(source.base + first + std::size_t(j));
        values[at + std::size_t(position[j])] = v[j];
      }
    at += std::size_t(kept);
    __syncthreads();  // temp is reused
  }
}

/// Appends what device_predicates (one a segment, in device memory) keep to out, per
/// segment in order; kept[s]: how many segment s gave.
template <class Tuning, bool Rescan, bool Settle, bool Final, class Source, class Predicate, class T, class Index>
void compact(workspace& ws, const Source& source, std::span<const segment> layout, const Predicate* device_predicates,
             sparse_vector<T, Index, sidco::memory::device>& out, std::span<std::size_t> kept) {
  ws.refresh_pieces(layout, Tuning::tile);
  const std::size_t pieces = ws.plan.pieces().size();
  ws.counts.resize(pieces);
  count_pieces<Tuning, Rescan><<<unsigned(pieces), Tuning::block_threads, 0, ws.stream>>>(
      source, ws.piece_table.data(), device_predicates, ws.counts.data());
  SIDCO_CUDA(cudaGetLastError());
  ws.host_counts.resize(pieces);
  ws.copy_back(ws.host_counts.data(), ws.counts.data(), pieces);
  const std::size_t start = out.size();
  auto* host_offsets = ws.offset_staging.fill<std::size_t>(pieces);
  std::size_t total = 0;
  for (std::size_t p = 0; p < pieces; ++p) {
    host_offsets[p] = total;
    total += ws.host_counts[p];
  }
  const auto& first = ws.plan.segment_first();
  for (std::size_t s = 0; s < layout.size(); ++s) {
    kept[s] = 0;
    for (std::uint32_t p = first[s]; p < first[s + 1]; ++p) kept[s] += ws.host_counts[p];
  }
  ws.adopt(out);
  out.resize(start + total);
  auto* offsets = ws.upload<std::size_t>(ws.offsets, ws.offset_staging, pieces);
  write_pieces<Tuning, Rescan, Settle, Final><<<unsigned(pieces), Tuning::block_threads, 0, ws.stream>>>(
      source, ws.piece_table.data(), device_predicates, offsets, out.index_data() + start, out.value_data() + start);
  SIDCO_CUDA(cudaGetLastError());
}

/// |x| > thresholds[s] per segment s of layout.
template <class Tuning, bool Final, class Source, class T, class Index>
void select_above(workspace& ws, const Source& source, std::span<const segment> layout,
                  std::span<const double> thresholds, sparse_vector<T, Index, sidco::memory::device>& out,
                  std::span<std::size_t> kept) {
  auto* keys = ws.predicate_staging.fill<above_key<T>>(layout.size());
  for (std::size_t s = 0; s < layout.size(); ++s) keys[s] = {threshold_key<T>(thresholds[s])};
  const auto* predicates = ws.upload<above_key<T>>(ws.predicates, ws.predicate_staging, layout.size());
  compact<Tuning, false, true, Final>(ws, source, layout, predicates, out, kept);
}

/// low < |x| <= high over the settled state of the whole source.
template <class Tuning, class Source, class T, class Index>
void select_band(workspace& ws, const Source& source, double low, double high,
                 sparse_vector<T, Index, sidco::memory::device>& out) {
  const segment whole{0, source.size};
  *ws.predicate_staging.fill<in_band<T>>(1) = {threshold_key<T>(low), threshold_key<T>(high)};
  const auto* band = ws.upload<in_band<T>>(ws.predicates, ws.predicate_staging, 1);
  std::size_t kept = 0;
  compact<Tuning, true, false, false>(ws, source, {&whole, 1}, band, out, {&kept, 1});
}

}  // namespace sidco::backend::cuda_detail
