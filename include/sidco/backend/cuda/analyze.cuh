// backend::cuda's moments pass: moments of |x| (and of up to two probes' tails) per segment, one
// block per piece, merged per segment in a fixed order; one host wait for the result.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <span>
#include <type_traits>

#include <cub/block/block_reduce.cuh>

#include "sidco/backend/cuda/elementwise.hpp"
#include "sidco/backend/cuda/stripes.hpp"
#include "sidco/backend/cuda/tuning.cuh"
#include "sidco/backend/cuda/workspace.cuh"
#include "sidco/core/magnitude_key.hpp"
#include "sidco/core/moments.hpp"
#include "sidco/core/segment.hpp"

namespace sidco::backend::cuda_detail {

/// A tuning's analyze_min_blocks (tunings without it: 0, no cap).
template <class Tuning>
struct analyze_min_blocks : std::integral_constant<int, 0> {};
template <class Tuning>
  requires requires { Tuning::analyze_min_blocks; }
struct analyze_min_blocks<Tuning> : std::integral_constant<int, Tuning::analyze_min_blocks> {};

// Moments of |x| and the probes' tails over one piece per block, reduced in a fixed order.
template <class Tuning, bool Log, bool TailLog, std::size_t Probes, class Source>
__global__ void __launch_bounds__(Tuning::block_threads, analyze_min_blocks<Tuning>::value)
    analyze_pieces(Source source, const piece* pieces, const device_probe<typename Source::value_type>* probes,
                   moments_bundle<1 + Probes>* out) {
  using T = typename Source::value_type;
  const piece pc = pieces[blockIdx.x];
  thread_statistics<T, Probes> mine;
  const device_probe<T>* own = probes + std::size_t(pc.segment) * Probes;
  for_each_striped<Tuning::load_items>(
      pc.offset + threadIdx.x, pc.offset + pc.size, Tuning::block_threads, [&](std::size_t i) { return source.value(i); },
      [&](T v) { mine.template add<Log, TailLog>(v, own); });
  moments_bundle<1 + Probes> bundle;
  mine.to_moments(bundle.m);
  using reduce = cub::BlockReduce<moments_bundle<1 + Probes>, Tuning::block_threads>;
  __shared__ typename reduce::TempStorage temp;
  const auto total = reduce(temp).Reduce(bundle, merge_bundles{});
  if (threadIdx.x == 0) out[blockIdx.x] = total;
}

// One block per segment merges its pieces' bundles, in a fixed order.
template <class Tuning, std::size_t Width>
__global__ void __launch_bounds__(Tuning::block_threads)
    merge_segments(const moments_bundle<Width>* per_piece, const std::uint32_t* segment_first,
                   moments_bundle<Width>* out) {
  moments_bundle<Width> mine;
  for (std::uint32_t j = segment_first[blockIdx.x] + threadIdx.x; j < segment_first[blockIdx.x + 1];
       j += Tuning::block_threads)
    mine = mine.merged(per_piece[j]);
  using reduce = cub::BlockReduce<moments_bundle<Width>, Tuning::block_threads>;
  __shared__ typename reduce::TempStorage temp;
  const auto total = reduce(temp).Reduce(mine, merge_bundles{});
  if (threadIdx.x == 0) out[blockIdx.x] = total;
}

/// out[s (1 + Probes)] = moments of segment s, out[s (1 + Probes) + 1 + p] = its probe p's
/// tail (Probes: 0 to 2, probes[s Probes + p] the probes of segment s).
template <class Tuning, class Stats, std::size_t Probes, class Source>
void analyze(workspace& ws, const Source& source, std::span<const segment> layout, std::span<const double> probes,
             std::span<moments> out) {
  static_assert(Probes <= 2, "backend::cuda: at most two probes per segment");
  using T = typename Source::value_type;
  constexpr std::size_t width = 1 + Probes;
  ws.refresh_pieces<Tuning>(layout);
  const std::size_t probe_count = layout.size() * Probes;
  auto* host_probes = ws.fill<device_probe<T>>(ws.predicate_staging, probe_count);
  for (std::size_t p = 0; p < probe_count; ++p) {
    const auto key = threshold_key<T>(probes[p] < 0 ? 0.0 : probes[p]);
    host_probes[p] = {key, to_accumulator(magnitude_of_key<T>(magnitude_key_t<T>(key)))};
  }
  const auto* device_probes = ws.upload<device_probe<T>>(ws.predicates, ws.predicate_staging, probe_count);
  const std::size_t pieces = ws.plan.pieces().size(), segments = layout.size();
  ws.bundles.resize(pieces * sizeof(moments_bundle<width>));
  ws.merged.resize(segments * sizeof(moments_bundle<width>));
  auto* per_piece = reinterpret_cast<moments_bundle<width>*>(ws.bundles.data());
  auto* per_segment = reinterpret_cast<moments_bundle<width>*>(ws.merged.data());
  analyze_pieces<Tuning, Stats::log, Stats::tail_log, Probes><<<unsigned(pieces), Tuning::block_threads, 0, ws.stream>>>(
      source, ws.piece_table.data(), device_probes, per_piece);
  merge_segments<Tuning, width><<<unsigned(segments), Tuning::block_threads, 0, ws.stream>>>(
      per_piece, ws.segment_table.data(), per_segment);
  SIDCO_CUDA(cudaGetLastError());
  auto result = workspace::host_scratch<moments_bundle<width>>(ws.result_bytes, segments);
  ws.copy_back(result.data(), per_segment, segments);
  for (std::size_t s = 0; s < segments; ++s)
    for (std::size_t w = 0; w < width; ++w) out[s * width + w] = result[s].m[w];
}

}  // namespace sidco::backend::cuda_detail
