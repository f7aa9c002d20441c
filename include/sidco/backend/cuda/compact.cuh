// backend::cuda's threshold selections (select_above per segment, select_band over one
// source). Per-piece counts, their scan on the device, then each block writes its piece's
// kept entries in index order, settling the error-feedback state as it goes, into an output
// sized from the caller's hint; one host wait at the end brings the counts back (the
// per-segment totals). A block whose entries would not fit writes and settles nothing; only
// those run again, once the output has grown (never when the hint held).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>

#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>
#include <cub/device/device_scan.cuh>

#include "sidco/backend/cuda/elementwise.hpp"
#include "sidco/backend/cuda/stripes.hpp"
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
  for_each_striped<Tuning::load_items>(
      pc.offset + threadIdx.x, pc.offset + pc.size, Tuning::block_threads,
      [&](std::size_t i) { return read<Rescan>(source, i); }, [&](typename Source::value_type v) { mine += keep(v); });
  using reduce = cub::BlockReduce<std::uint32_t, Tuning::block_threads>;
  __shared__ typename reduce::TempStorage temp;
  const std::uint32_t total = reduce(temp).Sum(mine);
  if (threadIdx.x == 0) counts[blockIdx.x] = total;
}

// Per piece: writes the kept (base + i, v) from offsets[piece] on, in index order, and
// (Settle) settles every value: as sent where kept when Final, else as unsent.
// Pass Retry = false runs the pieces whose entries end within capacity; Retry = true the
// others (after the output grew), so each piece writes and settles exactly once.
template <class Tuning, bool Rescan, bool Settle, bool Final, class Source, class Predicate, class Index>
__global__ void __launch_bounds__(Tuning::block_threads)
    write_pieces(Source source, const piece* pieces, const Predicate* predicates, const std::size_t* offsets,
                 const std::uint32_t* counts, std::size_t capacity, bool retry, Index* __restrict__ indices,
                 typename Source::value_type* __restrict__ values) {
  using T = typename Source::value_type;
  constexpr int items = Tuning::write_items;
  using scan = cub::BlockScan<int, Tuning::block_threads>;
  __shared__ typename scan::TempStorage temp;
  std::size_t at = offsets[blockIdx.x];
  if ((at + counts[blockIdx.x] > capacity) != retry) return;
  const piece pc = pieces[blockIdx.x];
  const Predicate keep = predicates[pc.segment];
  const std::size_t end = pc.offset + pc.size;
  for (std::size_t chunk = pc.offset; chunk < end; chunk += std::size_t(Tuning::block_threads) * items) {
    T v[items];
    int flag[items], position[items];
    const std::size_t first = chunk + std::size_t(threadIdx.x) * items;
    // Every item loaded before any state is stored: a store may alias a later load as far
    // as the compiler knows, which would serialize them.
#pragma unroll
    for (int j = 0; j < items; ++j)
      if (first + std::size_t(j) < end) v[j] = read<Rescan>(source, first + std::size_t(j));
#pragma unroll
    for (int j = 0; j < items; ++j) {
      const std::size_t i = first + std::size_t(j);
      flag[j] = 0;
      if (i < end) {
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

struct add_counts {
  __device__ std::size_t operator()(std::size_t a, std::size_t b) const { return a + b; }
};

/// Room a one-pass compaction gives the hint (an expected count): above it, the pieces that
/// did not fit run again.
inline constexpr double hint_slack = 1.5;

/// Appends what device_predicates (one a segment, in device memory) keep to out, per
/// segment in order; kept[s]: how many segment s gave. hint: the count expected (0: none).
template <class Tuning, bool Rescan, bool Settle, bool Final, class Source, class Predicate, class T, class Index>
void compact(workspace& ws, const Source& source, std::span<const segment> layout, const Predicate* device_predicates,
             sparse_vector<T, Index, sidco::memory::device>& out, std::span<std::size_t> kept, std::size_t hint) {
  ws.refresh_pieces<Tuning>(layout);
  const std::size_t pieces = ws.plan.pieces().size();
  ws.counts.resize(pieces);
  ws.offsets.resize(pieces);
  count_pieces<Tuning, Rescan><<<unsigned(pieces), Tuning::block_threads, 0, ws.stream>>>(
      source, ws.piece_table.data(), device_predicates, ws.counts.data());
  SIDCO_CUDA(cudaGetLastError());
  std::size_t bytes = 0;
  SIDCO_CUDA(cub::DeviceScan::ExclusiveScan(nullptr, bytes, ws.counts.data(), ws.offsets.data(), add_counts{},
                                            std::size_t(0), pieces, ws.stream));
  SIDCO_CUDA(cub::DeviceScan::ExclusiveScan(ws.scratch(bytes), bytes, ws.counts.data(), ws.offsets.data(),
                                            add_counts{}, std::size_t(0), pieces, ws.stream));
  const std::size_t start = out.size();
  ws.adopt(out);
  const auto wanted = std::size_t(hint_slack * double(hint));
  const std::size_t capacity = std::max(out.capacity() - start, wanted);
  out.resize(start + capacity);
  auto write = [&](bool retry) {
    write_pieces<Tuning, Rescan, Settle, Final><<<unsigned(pieces), Tuning::block_threads, 0, ws.stream>>>(
        source, ws.piece_table.data(), device_predicates, ws.offsets.data(), ws.counts.data(), capacity, retry,
        out.index_data() + start, out.value_data() + start);
    SIDCO_CUDA(cudaGetLastError());
  };
  write(false);
  ws.host_counts.resize(pieces);
  ws.copy_back(ws.host_counts.data(), ws.counts.data(), pieces);
  std::size_t total = 0;
  for (std::size_t p = 0; p < pieces; ++p) total += ws.host_counts[p];
  const auto& first = ws.plan.segment_first();
  for (std::size_t s = 0; s < layout.size(); ++s) {
    kept[s] = 0;
    for (std::uint32_t p = first[s]; p < first[s + 1]; ++p) kept[s] += ws.host_counts[p];
  }
  if (total > capacity) {
    out.resize(start + total);  // keeps what the first pass wrote (stream-ordered)
    write(true);
  }
  out.truncate(start + total);
}

/// |x| > thresholds[s] per segment s of layout.
template <class Tuning, bool Final, class Source, class T, class Index>
void select_above(workspace& ws, const Source& source, std::span<const segment> layout,
                  std::span<const double> thresholds, sparse_vector<T, Index, sidco::memory::device>& out,
                  std::size_t hint, std::span<std::size_t> kept) {
  auto* keys = ws.fill<above_key<T>>(ws.predicate_staging, layout.size());
  for (std::size_t s = 0; s < layout.size(); ++s) keys[s] = {threshold_key<T>(thresholds[s])};
  const auto* predicates = ws.upload<above_key<T>>(ws.predicates, ws.predicate_staging, layout.size());
  compact<Tuning, false, true, Final>(ws, source, layout, predicates, out, kept, hint);
}

/// low < |x| <= high over the settled state of the whole source.
template <class Tuning, class Source, class T, class Index>
void select_band(workspace& ws, const Source& source, double low, double high,
                 sparse_vector<T, Index, sidco::memory::device>& out) {
  const segment whole{0, source.size};
  *ws.fill<in_band<T>>(ws.predicate_staging, 1) = {threshold_key<T>(low), threshold_key<T>(high)};
  const auto* band = ws.upload<in_band<T>>(ws.predicates, ws.predicate_staging, 1);
  std::size_t kept = 0;
  compact<Tuning, true, false, false>(ws, source, {&whole, 1}, band, out, {&kept, 1}, 0);
}

}  // namespace sidco::backend::cuda_detail
