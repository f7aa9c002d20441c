// backend::cuda's threshold selections (select_above per segment, select_band over one
// source). Per-piece counts, their scan on the device, then each block writes its piece's
// kept entries in index order, settling the error-feedback state as it goes, into an output
// sized from the caller's hint (striped by default, see write_pieces_striped); one host wait
// at the end brings the counts back (the per-segment totals). A block whose entries would
// not fit writes and settles nothing; only those run again, once the output has grown
// (never when the hint held). A tuning with one_pass_select writes select_above's entries in
// one pass instead, into regions sized from the hint (compact_in_regions).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
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

/// Rows a step of the striped write loads: load_items, or stateful_write_rows where it
/// also settles an error-feedback state (two loads and a store a value: the registers of
/// load_items rows would leave fewer blocks resident than the pieces were sized for).
template <class Tuning, bool Settles>
SIDCO_HOST_DEVICE constexpr int striped_write_rows() {
  if constexpr (Settles && requires { Tuning::stateful_write_rows; })
    return Tuning::stateful_write_rows;
  else
    return Tuning::load_items;
}

// The striped write's step ranking, by warp 0: the kept counts per (row, warp) in firsts
// scanned in place into each one's first output position, their sum into step_kept.
template <int Slots>
__device__ __forceinline__ void scan_step(std::uint32_t* firsts, unsigned lane, std::uint32_t& step_kept) {
  constexpr int per_lane = (Slots + 31) / 32;
  std::uint32_t mine = 0;
  for (int e = 0; e < per_lane; ++e)
    if (const int slot = int(lane) * per_lane + e; slot < Slots) mine += firsts[slot];
  std::uint32_t before = mine;  // inclusive scan over the lanes, then made exclusive
  for (int d = 1; d < 32; d *= 2) {
    const std::uint32_t up = __shfl_up_sync(0xffffffffu, before, d);
    if (int(lane) >= d) before += up;
  }
  if (lane == 31) step_kept = before;
  before -= mine;
  for (int e = 0; e < per_lane; ++e)
    if (const int slot = int(lane) * per_lane + e; slot < Slots) {
      const std::uint32_t count = firsts[slot];
      firsts[slot] = before;
      before += count;
    }
}

// A striped write step's rows into v: row r of this thread at chunk + r * Threads + its
// index, every load issued before any is used (a settle's store may alias a later load).
template <bool Rescan, int Threads, int Rows, class Source>
__device__ __forceinline__ void load_step(const Source& source, std::size_t chunk, std::size_t end,
                                          typename Source::value_type (&v)[Rows]) {
#pragma unroll
  for (int r = 0; r < Rows; ++r) {
    const std::size_t i = chunk + std::size_t(r) * Threads + threadIdx.x;
    if (i < end) v[r] = read<Rescan>(source, i);
  }
}

// The same as write_pieces, striped: each step loads load_items rows of the piece (row r of
// thread t at chunk + r * threads + t: every load a warp-wide coalesced stripe, all issued
// before any is used) and ranks the kept values in index order from warp ballots (row by
// row, warp by warp within a row, lane by lane within a warp), so a step of
// threads * load_items values needs two barriers and a one-warp scan of rows * warps counts.
// Resume: the pieces a one-pass write (write_regions_striped) stopped in, from their stop,
// after what they wrote (regions[3 p + 2] and regions[3 p]); the others have nothing left.
template <class Tuning, bool Rescan, bool Settle, bool Final, bool Resume = false, class Source, class Predicate,
          class Index>
__global__ void __launch_bounds__(Tuning::block_threads)
    write_pieces_striped(Source source, const piece* pieces, const Predicate* predicates, const std::size_t* offsets,
                         const std::uint32_t* counts, std::size_t capacity, bool retry, Index* __restrict__ indices,
                         typename Source::value_type* __restrict__ values,
                         const unsigned long long* regions = nullptr) {
  using T = typename Source::value_type;
  constexpr int threads = Tuning::block_threads, rows = striped_write_rows<Tuning, Settle && Source::has_state>();
  static_assert(threads % 32 == 0, "the striped write ranks by whole warps");
  constexpr int warps = threads / 32, slots = rows * warps;
  // Kept counts per (row, warp), scanned in place into each one's first output position.
  __shared__ std::uint32_t firsts[slots];
  __shared__ std::uint32_t step_kept;
  std::size_t at = offsets[blockIdx.x];
  if constexpr (!Resume) {
    if ((at + counts[blockIdx.x] > capacity) != retry) return;
  }
  const piece pc = pieces[blockIdx.x];
  const Predicate keep = predicates[pc.segment];
  const std::size_t end = pc.offset + pc.size;
  const unsigned lane = threadIdx.x % 32, warp = threadIdx.x / 32, lanes_below = (1u << lane) - 1;
  std::size_t chunk = pc.offset;
  if constexpr (Resume) {
    chunk = std::size_t(regions[3 * std::size_t(blockIdx.x) + 2]);
    at += std::size_t(regions[3 * std::size_t(blockIdx.x)]);
  }
  for (; chunk < end; chunk += std::size_t(threads) * rows) {
    T v[rows];
    unsigned kept[rows];
    load_step<Rescan, threads>(source, chunk, end, v);
#pragma unroll
    for (int r = 0; r < rows; ++r) {
      const std::size_t i = chunk + std::size_t(r) * threads + threadIdx.x;
      bool flag = false;
      if (i < end) {
        flag = keep(v[r]);
        if constexpr (Settle && Source::has_state) source.settle(i, v[r], Final && flag);
      }
      kept[r] = __ballot_sync(0xffffffffu, flag);
      if (lane == 0) firsts[r * warps + int(warp)] = std::uint32_t(__popc(kept[r]));
    }
    __syncthreads();
    if (warp == 0) scan_step<slots>(firsts, lane, step_kept);
    __syncthreads();
#pragma unroll
    for (int r = 0; r < rows; ++r)
      if (kept[r] >> lane & 1u) {
        const std::size_t position = at + firsts[r * warps + int(warp)] + std::size_t(__popc(kept[r] & lanes_below));
        indices[position] = Index(source.base + chunk + std::size_t(r) * threads + threadIdx.x);
        values[position] = v[r];
      }
    at += step_kept;
    __syncthreads();  // firsts and step_kept are rewritten by the next step
  }
}

// select_above in one pass (one_pass_select): write_pieces_striped's steps, each piece into
// its own region [region_starts[p], region_starts[p + 1]) of a scratch, settling a step only
// once its entries fit. A piece whose next step would not fit stops before it (nothing from
// there on written or settled) and counts what the rest keeps. regions[3 p, 3 p + 1, 3 p + 2]
// = written, rest, stop (the piece's end when it finished); totals[p] = written + rest.
template <class Tuning, bool Final, class Source, class Predicate, class Index>
__global__ void __launch_bounds__(Tuning::block_threads)
    write_regions_striped(Source source, const piece* pieces, const Predicate* predicates,
                          const std::size_t* region_starts, Index* __restrict__ indices,
                          typename Source::value_type* __restrict__ values, unsigned long long* regions,
                          std::uint32_t* totals) {
  using T = typename Source::value_type;
  constexpr int threads = Tuning::block_threads, rows = striped_write_rows<Tuning, Source::has_state>();
  static_assert(threads % 32 == 0, "the striped write ranks by whole warps");
  constexpr int warps = threads / 32, slots = rows * warps;
  __shared__ std::uint32_t firsts[slots];
  __shared__ std::uint32_t step_kept;
  const std::size_t begin = region_starts[blockIdx.x], limit = region_starts[blockIdx.x + 1];
  std::size_t at = begin;
  const piece pc = pieces[blockIdx.x];
  const Predicate keep = predicates[pc.segment];
  const std::size_t end = pc.offset + pc.size;
  const unsigned lane = threadIdx.x % 32, warp = threadIdx.x / 32, lanes_below = (1u << lane) - 1;
  std::size_t chunk = pc.offset;
  for (; chunk < end; chunk += std::size_t(threads) * rows) {
    T v[rows];
    unsigned kept[rows];
    load_step<false, threads>(source, chunk, end, v);
#pragma unroll
    for (int r = 0; r < rows; ++r) {
      const std::size_t i = chunk + std::size_t(r) * threads + threadIdx.x;
      kept[r] = __ballot_sync(0xffffffffu, i < end && keep(v[r]));
      if (lane == 0) firsts[r * warps + int(warp)] = std::uint32_t(__popc(kept[r]));
    }
    __syncthreads();
    if (warp == 0) scan_step<slots>(firsts, lane, step_kept);
    __syncthreads();
    if (at + step_kept > limit) break;  // the block's at and step_kept: every thread leaves
#pragma unroll
    for (int r = 0; r < rows; ++r) {
      const std::size_t i = chunk + std::size_t(r) * threads + threadIdx.x;
      const bool flag = kept[r] >> lane & 1u;
      if constexpr (Source::has_state)
        if (i < end) source.settle(i, v[r], Final && flag);
      if (flag) {
        const std::size_t position = at + firsts[r * warps + int(warp)] + std::size_t(__popc(kept[r] & lanes_below));
        indices[position] = Index(source.base + i);
        values[position] = v[r];
      }
    }
    at += step_kept;
    __syncthreads();  // firsts and step_kept are rewritten by the next step
  }
  std::uint32_t rest = 0;
  if (chunk < end)
    for_each_striped<Tuning::load_items>(
        chunk + threadIdx.x, end, threads, [&](std::size_t i) { return source.value(i); },
        [&](T v) { rest += keep(v); });
  using reduce = cub::BlockReduce<std::uint32_t, threads>;
  __shared__ typename reduce::TempStorage temp;
  const std::uint32_t rest_kept = reduce(temp).Sum(rest);
  if (threadIdx.x == 0) {
    unsigned long long* own = regions + 3 * std::size_t(blockIdx.x);
    own[0] = at - begin;
    own[1] = rest_kept;
    own[2] = chunk < end ? chunk : end;
    totals[blockIdx.x] = std::uint32_t(at - begin) + rest_kept;
  }
}

// Moves each piece's region entries to their place: out[offsets[p] + j] = the region's j-th,
// j < regions[3 p] (what the piece wrote there).
template <class Tuning, class Index, class T>
__global__ void __launch_bounds__(Tuning::block_threads)
    place_regions(const std::size_t* region_starts, const unsigned long long* regions, const std::size_t* offsets,
                  const Index* __restrict__ from_indices, const T* __restrict__ from_values,
                  Index* __restrict__ indices, T* __restrict__ values) {
  const std::size_t from = region_starts[blockIdx.x], to = offsets[blockIdx.x];
  const std::size_t count = std::size_t(regions[3 * std::size_t(blockIdx.x)]);
  for (std::size_t j = threadIdx.x; j < count; j += Tuning::block_threads) {
    indices[to + j] = from_indices[from + j];
    values[to + j] = from_values[from + j];
  }
}

/// Whether a tuning's write pass is striped (write_pieces_striped, the default) or blocked
/// (write_pieces, write_items values a thread a step; tunings without the flag).
template <class Tuning>
constexpr bool striped_write() {
  if constexpr (requires { Tuning::striped_write; })
    return Tuning::striped_write;
  else
    return false;
}

struct add_counts {
  __device__ std::size_t operator()(std::size_t a, std::size_t b) const { return a + b; }
};

/// Whether a tuning's select_above with a hint writes in one pass into regions sized from
/// it (write_regions_striped), or counts first (tunings without the flag).
template <class Tuning>
constexpr bool one_pass_select() {
  if constexpr (requires { Tuning::one_pass_select; })
    return Tuning::one_pass_select;
  else
    return false;
}

/// Room a one-pass compaction gives the hint (an expected count): above it, the pieces that
/// did not fit run again.
inline constexpr double hint_slack = 1.5;

/// kept[s] = the sum of count(p) over segment s's pieces p (the plan's segment_first).
template <class Count>
void sum_per_segment(const workspace& ws, Count count, std::span<std::size_t> kept) {
  const auto& first = ws.plan.segment_first();
  for (std::size_t s = 0; s + 1 < first.size(); ++s) {
    kept[s] = 0;
    for (std::uint32_t p = first[s]; p < first[s + 1]; ++p) kept[s] += std::size_t(count(p));
  }
}

/// offsets = the exclusive scan of the pieces' counts, on the device.
inline void scan_counts(workspace& ws, std::size_t pieces) {
  std::size_t bytes = 0;
  SIDCO_CUDA(cub::DeviceScan::ExclusiveScan(nullptr, bytes, ws.counts.data(), ws.offsets.data(), add_counts{},
                                            std::size_t(0), pieces, ws.stream));
  SIDCO_CUDA(cub::DeviceScan::ExclusiveScan(ws.scratch(bytes), bytes, ws.counts.data(), ws.offsets.data(),
                                            add_counts{}, std::size_t(0), pieces, ws.stream));
}

/// compact's one pass (one_pass_select, with a hint; select_above only): each piece writes
/// into its region of a scratch (its share of hint_slack times the hint, by its size, plus
/// one write step, at most its size), settling as it goes; the scan of what each kept places the regions in
/// order, and one host wait brings their counts back; one kernel moves them into out. A
/// piece that filled its region stopped before the step that did not fit and counted the
/// rest: only those pieces run again, from there, into their place (never when the hint
/// held). One read of the values where compact makes two.
template <class Tuning, bool Final, class Source, class Predicate, class T, class Index>
void compact_in_regions(workspace& ws, const Source& source, const Predicate* device_predicates,
                        sparse_vector<T, Index, sidco::memory::device>& out, std::span<std::size_t> kept,
                        std::size_t hint) {
  const auto& all = ws.plan.pieces();
  const std::size_t pieces = all.size();
  std::size_t values = 0;
  for (const piece& pc : all) values += pc.size;
  constexpr std::size_t step =
      std::size_t(Tuning::block_threads) * std::size_t(striped_write_rows<Tuning, Source::has_state>());
  std::size_t* starts = ws.fill<std::size_t>(ws.region_staging, pieces + 1);
  std::size_t room = 0;
  for (std::size_t p = 0; p < pieces; ++p) {
    starts[p] = room;
    const auto share = std::size_t(std::ceil(hint_slack * double(hint) * double(all[p].size) / double(values)));
    room += std::min<std::size_t>(share + step, all[p].size);  // never more than the piece holds
  }
  starts[pieces] = room;
  const std::size_t* device_starts = ws.upload<std::size_t>(ws.region_starts, ws.region_staging, pieces + 1);
  Index* region_indices = workspace::staging<Index>(ws.region_indices, room);
  T* region_values = workspace::staging<T>(ws.region_values, room);
  ws.region_results.resize(3 * pieces);
  ws.counts.resize(pieces);
  ws.offsets.resize(pieces);
  write_regions_striped<Tuning, Final><<<unsigned(pieces), Tuning::block_threads, 0, ws.stream>>>(
      source, ws.piece_table.data(), device_predicates, device_starts, region_indices, region_values,
      ws.region_results.data(), ws.counts.data());
  SIDCO_CUDA(cudaGetLastError());
  scan_counts(ws, pieces);
  const auto regions = workspace::host_scratch<unsigned long long>(ws.result_bytes, 3 * pieces);
  ws.copy_back(regions.data(), ws.region_results.data(), 3 * pieces);
  std::size_t total = 0;
  bool stopped = false;
  for (std::size_t p = 0; p < pieces; ++p) {
    total += std::size_t(regions[3 * p] + regions[3 * p + 1]);
    stopped |= regions[3 * p + 1] > 0;
  }
  sum_per_segment(ws, [&](std::uint32_t p) { return regions[3 * p] + regions[3 * p + 1]; }, kept);
  const std::size_t start = out.size();
  ws.adopt(out);
  out.resize(start + total);  // keeps what out held (stream-ordered)
  place_regions<Tuning><<<unsigned(pieces), Tuning::block_threads, 0, ws.stream>>>(
      device_starts, ws.region_results.data(), ws.offsets.data(), region_indices, region_values,
      out.index_data() + start, out.value_data() + start);
  SIDCO_CUDA(cudaGetLastError());
  if (stopped) {
    write_pieces_striped<Tuning, false, true, Final, true><<<unsigned(pieces), Tuning::block_threads, 0, ws.stream>>>(
        source, ws.piece_table.data(), device_predicates, ws.offsets.data(), ws.counts.data(), 0, false,
        out.index_data() + start, out.value_data() + start, ws.region_results.data());
    SIDCO_CUDA(cudaGetLastError());
  }
}

/// Appends what device_predicates (one a segment, in device memory) keep to out, per
/// segment in order; kept[s]: how many segment s gave. hint: the count expected (0: none).
template <class Tuning, bool Rescan, bool Settle, bool Final, class Source, class Predicate, class T, class Index>
void compact(workspace& ws, const Source& source, std::span<const segment> layout, const Predicate* device_predicates,
             sparse_vector<T, Index, sidco::memory::device>& out, std::span<std::size_t> kept, std::size_t hint) {
  ws.refresh_pieces<Tuning>(layout);
  const std::size_t pieces = ws.plan.pieces().size();
  if constexpr (one_pass_select<Tuning>() && !Rescan && Settle) {
    if (hint > 0 && pieces > 0)
      return compact_in_regions<Tuning, Final>(ws, source, device_predicates, out, kept, hint);
  }
  ws.counts.resize(pieces);
  ws.offsets.resize(pieces);
  count_pieces<Tuning, Rescan><<<unsigned(pieces), Tuning::block_threads, 0, ws.stream>>>(
      source, ws.piece_table.data(), device_predicates, ws.counts.data());
  SIDCO_CUDA(cudaGetLastError());
  scan_counts(ws, pieces);
  const std::size_t start = out.size();
  ws.adopt(out);
  const auto wanted = std::size_t(hint_slack * double(hint));
  const std::size_t capacity = std::max(out.capacity() - start, wanted);
  out.resize(start + capacity);
  auto write = [&](bool retry) {
    if constexpr (striped_write<Tuning>())
      write_pieces_striped<Tuning, Rescan, Settle, Final><<<unsigned(pieces), Tuning::block_threads, 0, ws.stream>>>(
          source, ws.piece_table.data(), device_predicates, ws.offsets.data(), ws.counts.data(), capacity, retry,
          out.index_data() + start, out.value_data() + start);
    else
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
  sum_per_segment(ws, [&](std::uint32_t p) { return ws.host_counts[p]; }, kept);
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
