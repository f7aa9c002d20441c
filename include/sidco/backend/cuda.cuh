// The CUDA backend: the backend contract on device memory (memory::device), on a stream the
// caller gives (default: the legacy default stream). Gradients may be float, double,
// __half or __nv_bfloat16; moments are summed in double (as the serial oracle);
// values are sent in the gradient's type. The estimator's math stays on the host: each
// pass that feeds it brings back a few bytes (the moments, a count).
//
// Stream rule: the gradient is read on the backend's stream, so the caller writes it there
// (or orders that stream after the write with an event). compress returns with work still
// queued on that stream (Top-k's keep_top_k, merge_runs, mark_sent): the sparse output and
// the residual are complete in the stream's order only. Read them on backend().stream(), or
// after an event recorded there; comm::nccl_allreducer does this itself (the output's
// buffers name the stream they were written on).
//
// Syncs with the host per call (each is a device-to-host copy of a small result):
//   analyze, tail, count_above, kth_largest_bins, sample_magnitudes: 1
//   coarse_histograms: 1 with counts (each segment's zeros and non-finite values), else 0
//   select_above, select_band: 1 (the per-piece counts, fetched after the write pass)
//   merge_runs, mark_sent, keep_top_k: 0 (Top-k's radix walks stay on the device)
//   select_random: one per redraw round where the device draws (k >= device_draw_from and
//     k <= N/32; two rounds when the first draws repeats, likely once k^2 > 2N), else 0
//   scatter_add: 1 (the index check, before anything is written)
//   first_nonfinite (the error path): 2
// So a threshold compress makes 2 plus one per pass of the estimator's own
// (report.passes), plus one for DGC's sample: 2 for a single-stage or steady multi-stage
// SIDCo call, exact_k's included; Top-k makes 3 (its coarse histograms, which are also its
// input check, the coarse bins, the candidates) over two passes of the values. Per layer
// (segmented), exact_k, trimmed and Top-k select every layer's candidates in one pass,
// keep every layer's top in one keep_top_k, and Top-k histograms every layer in one pass,
// so a call waits 2 plus the estimator's passes and exact_k's rescans (Top-k: 3), whatever
// the layer count. host_waits() counts them (tests/cuda/backend_test.cu asserts
// it). What goes up to the device (probes, thresholds, offsets, positions) is staged in
// page-locked memory, whose copies leave the stream running (from pageable memory each would
// synchronize it); refilling a staging whose last upload is still queued waits for it and
// counts (not in a warm compress, where an earlier wait covered it); buffers are reused, so
// a warm call allocates nothing on the host or the device, and they (and the outputs this
// backend writes) grow in the stream's order (memory::device_buffer).
//
// Block layout: every pass hands each thread block one piece of the layout (at most a tile
// of values inside one segment), so per-layer passes cost one launch whatever the layer
// count, and results merge per piece and per segment in a fixed order: the same input gives
// the same bits on the same GPU. The tile follows N and the multiprocessor count (min_tile
// doubled until about blocks_per_sm pieces a multiprocessor cover N: one wave of blocks,
// whose per-piece partial results stay O(multiprocessors + segments) at any N); grid-stride
// kernels launch at most blocks_per_sm blocks a multiprocessor; streaming passes keep
// load_items loads in flight per thread (cuda/stripes.hpp).
//
// One algorithm per file under cuda/ (its kernels and its launch), all on the workspace
// (cuda/workspace.cuh: the stream, the buffers, every host wait); the launch shapes are a
// struct (cuda/tuning.cuh) that basic_cuda takes, so a tuned build passes its own.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <span>

#include "sidco/backend/cuda/analyze.cuh"
#include "sidco/backend/cuda/compact.cuh"
#include "sidco/backend/cuda/half.cuh"
#include "sidco/backend/cuda/keep_top_k.cuh"
#include "sidco/backend/cuda/merge_runs.cuh"
#include "sidco/backend/cuda/scans.cuh"
#include "sidco/backend/cuda/scatter_add.cuh"
#include "sidco/backend/cuda/select_random.cuh"
#include "sidco/backend/cuda/tuning.cuh"
#include "sidco/backend/cuda/workspace.cuh"
#include "sidco/backend/pass_statistics.hpp"
#include "sidco/backend/source.hpp"
#include "sidco/core/moments.hpp"
#include "sidco/core/segment.hpp"
#include "sidco/core/sparse_vector.hpp"
#include "sidco/memory/device.cuh"

namespace sidco::backend {

template <class Tuning>
class basic_cuda {
  template <class T, class Index>
  using output = sparse_vector<T, Index, sidco::memory::device>;

 public:
  using memory = sidco::memory::device;
  using tuning = Tuning;
  static constexpr const char* name = "cuda";
  /// The smallest piece: a thread block's share of a pass over a short layout.
  static constexpr std::size_t min_tile = Tuning::min_tile;

  basic_cuda() = default;
  /// Every kernel and copy runs on stream (which the caller keeps alive).
  explicit basic_cuda(cudaStream_t stream) : work_(stream) {}

  cudaStream_t stream() const { return work_.stream; }

  /// The piece size a layout of total values gets on the current GPU (tests use it to put
  /// layer sizes on piece boundaries).
  std::size_t tile_for(std::size_t total) { return work_.template tile<Tuning>(total); }

  template <class Stats, class Source>
  void analyze(const Source& source, std::span<const segment> layout, std::span<const double> probes,
               std::span<moments> out) {
    const std::size_t per = layout.empty() ? 0 : probes.size() / layout.size();
    if (per == 0) return cuda_detail::analyze<Tuning, Stats, 0>(work_, source, layout, probes, out);
    if (per == 1) return cuda_detail::analyze<Tuning, Stats, 1>(work_, source, layout, probes, out);
    cuda_detail::analyze<Tuning, Stats, 2>(work_, source, layout, probes, out);
  }

  template <bool Log, class Source>
  moments tail(const Source& source, double t) {
    const segment whole{0, source.size};
    moments out[2];
    cuda_detail::analyze<Tuning, pass_statistics<true, false, Log>, 1>(work_, source, {&whole, 1}, {&t, 1}, out);
    return out[1];
  }

  template <class Source>
  std::size_t count_above(const Source& source, double t) {
    return cuda_detail::count_above<Tuning>(work_, source, t);
  }

  template <class Source>
  void coarse_histograms(const Source& source, std::span<const segment> layout, std::span<moments> counts) {
    cuda_detail::coarse_histograms<Tuning>(work_, source, layout, counts);
  }

  void kth_largest_bins(std::span<const std::size_t> targets, std::span<key_bin> out) {
    cuda_detail::kth_largest_bins<Tuning>(work_, targets, out);
  }

  template <class Source>
  nonfinite_value first_nonfinite(const Source& source) {
    return cuda_detail::first_nonfinite<Tuning>(work_, source);
  }

  template <bool Final, class Source, class T, class Index>
  void select_above(const Source& source, std::span<const segment> layout, std::span<const double> thresholds,
                    output<T, Index>& out, std::size_t hint, std::span<std::size_t> kept) {
    cuda_detail::select_above<Tuning, Final>(work_, source, layout, thresholds, out, hint, kept);
  }

  template <class Source, class T, class Index>
  void select_band(const Source& source, double low, double high, output<T, Index>& out) {
    cuda_detail::select_band<Tuning>(work_, source, low, high, out);
  }

  template <class Source, class T, class Index>
  void select_random(const Source& source, std::size_t k, std::uint64_t state, output<T, Index>& out) {
    cuda_detail::select_random<Tuning>(work_, source, k, state, out);
  }

  template <class Source>
  void sample_magnitudes(const Source& source, std::uint64_t state, std::span<double> out) {
    cuda_detail::sample_magnitudes<Tuning>(work_, source, state, out);
  }

  template <class T, class Index>
  void keep_top_k(output<T, Index>& out, std::size_t begin, std::span<const std::size_t> run_sizes,
                  std::span<const std::size_t> keep) {
    cuda_detail::keep_top_k<Tuning>(work_, out, begin, run_sizes, keep);
  }

  template <class T, class Index>
  void merge_runs(output<T, Index>& out, std::size_t begin, std::span<const std::size_t>) {
    cuda_detail::merge_runs(work_, out, begin);
  }

  template <class Source, class T, class Index>
  void mark_sent(const Source& source, const output<T, Index>& out, std::size_t begin) {
    cuda_detail::mark_sent<Tuning>(work_, source, out, begin);
  }

  template <class T, class Index>
  void scatter_add(const output<T, Index>& in, memory::view<T> dense, T scale) {
    cuda_detail::scatter_add<Tuning>(work_, in, dense, scale);
  }

  /// Waits for everything this backend queued.
  void synchronize() { work_.synchronize(); }

  /// How many times the host has waited for this backend's stream (every wait goes through
  /// the workspace), so that tests can assert the syncs per call listed above.
  std::uint64_t host_waits() const { return work_.host_waits; }

  /// Device and host bytes kept between calls: O(multiprocessors + segments), never O(N)
  /// (plus O(candidates) for an exact Top-k, and Random-k's k indices).
  std::size_t workspace_bytes() const { return work_.bytes(); }

 private:
  cuda_detail::workspace work_;
};

/// The CUDA backend with the default launch shapes.
using cuda = basic_cuda<cuda_detail::default_tuning>;

}  // namespace sidco::backend
