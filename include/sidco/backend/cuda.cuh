// The CUDA backend: the backend contract on device memory (memory::device), on a stream the
// caller gives (default: the legacy default stream). Gradients may be float, double,
// __half or __nv_bfloat16; moments are summed in double (as the serial oracle);
// values are sent in the gradient's type. The estimator's math stays on the host: each
// pass that feeds it brings back a few bytes (the moments, a count).
//
// Syncs with the host per call (each is a device-to-host copy of a small result):
//   analyze, tail, count_above, key_histogram, gather_magnitudes: 1
//   select_above, select_band: 1 (the per-piece counts, which size the output)
//   select_indices, merge_runs, mark_sent: 0
//   keep_top_k: one per 8-bit digit of the key (4 for float) and 1 more
//   scatter_add: 1 (the index check, before anything is written)
//   first_nonfinite (the error path): 2
// So a threshold compress makes 2 plus one per pass of the estimator's own
// (report.passes): 2 for a single-stage or steady multi-stage SIDCo call. host_waits()
// counts them (tests/cuda/backend_test.cu asserts it). What goes up to the
// device (probes, thresholds, offsets, positions) is staged in page-locked memory, whose
// copies leave the stream running (from pageable memory each would synchronize it); buffers
// are reused, so a warm call allocates nothing on the host or the device.
//
// Block layout: every pass hands each thread block one piece of the layout (at most
// `tile` values inside one segment), so per-layer passes cost one launch whatever the
// layer count, and results merge per piece and per segment in a fixed order: the same
// input gives the same bits on the same GPU.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <type_traits>
#include <vector>

#include <cub/device/device_radix_sort.cuh>
#include <cub/device/device_scan.cuh>
#include <cub/device/device_select.cuh>

#include "sidco/backend/cuda/check.cuh"
#include "sidco/backend/cuda/elementwise.hpp"
#include "sidco/backend/cuda/half.cuh"
#include "sidco/backend/cuda/kernels.cuh"
#include "sidco/backend/cuda/pieces.hpp"
#include "sidco/backend/pass_statistics.hpp"
#include "sidco/backend/source.hpp"
#include "sidco/core/magnitude_key.hpp"
#include "sidco/core/moments.hpp"
#include "sidco/core/radix_select.hpp"
#include "sidco/core/segment.hpp"
#include "sidco/core/sparse_vector.hpp"
#include "sidco/memory/device.cuh"

namespace sidco::backend {

class cuda {
  template <class T>
  using device_buffer = sidco::memory::device_buffer<T>;
  template <class T, class Index>
  using output = sparse_vector<T, Index, sidco::memory::device>;

 public:
  using memory = sidco::memory::device;
  static constexpr const char* name = "cuda";
  /// Values per piece: a thread block's share of a pass (64 values a thread).
  static constexpr std::size_t tile = std::size_t(cuda_detail::block_threads) * 64;

  cuda() = default;
  /// Every kernel and copy runs on stream (which the caller keeps alive).
  explicit cuda(cudaStream_t stream) : stream_(stream) {}

  cudaStream_t stream() const { return stream_; }

  template <class Stats, class Source>
  void analyze(const Source& source, std::span<const segment> layout, std::span<const double> probes,
               std::span<moments> out) {
    if (probes.empty()) return analyze_with<Stats, 0>(source, layout, probes, out);
    analyze_with<Stats, 1>(source, layout, probes, out);
  }

  template <bool Log, class Source>
  moments tail(const Source& source, double t) {
    const segment whole{0, source.size};
    moments out[2];
    analyze_with<pass_statistics<true, false, Log>, 1>(source, {&whole, 1}, {&t, 1}, out);
    return out[1];
  }

  template <class Source>
  std::size_t count_above(const Source& source, double t) {
    using T = typename Source::value_type;
    auto* count = counters(1);
    cuda_detail::count_above<<<grid(source.size), cuda_detail::block_threads, 0, stream_>>>(
        source, cuda_detail::above_key<T>{threshold_key<T>(t)}, count);
    SIDCO_CUDA(cudaGetLastError());
    return std::size_t(fetch_counter(count));
  }

  template <class Source>
  void key_histogram(const Source& source, int shift, std::span<std::uint64_t> counts) {
    auto* bins = counters(counts.size());
    cuda_detail::key_histogram<<<grid(source.size), cuda_detail::block_threads,
                                 counts.size() * sizeof(unsigned int), stream_>>>(source, shift, bins, int(counts.size()));
    SIDCO_CUDA(cudaGetLastError());
    host_counters_.resize(counts.size());
    copy_back(host_counters_.data(), bins, counts.size());
    for (std::size_t d = 0; d < counts.size(); ++d) counts[d] += host_counters_[d];
  }

  template <class Source>
  nonfinite_value first_nonfinite(const Source& source) {
    auto* first = counters(1);
    const unsigned long long none = source.size;
    SIDCO_CUDA(cudaMemcpyAsync(first, &none, sizeof none, cudaMemcpyHostToDevice, stream_));
    cuda_detail::first_nonfinite<<<grid(source.size), cuda_detail::block_threads, 0, stream_>>>(source, first);
    SIDCO_CUDA(cudaGetLastError());
    const std::size_t at = std::size_t(fetch_counter(first));
    if (at >= source.size) return {source.size, 0.0};
    double value = 0;
    const std::size_t position = at;
    gather(source, {&position, 1}, {&value, 1}, false);
    return {at, value};
  }

  template <bool Final, class Source, class T, class Index>
  void select_above(const Source& source, std::span<const segment> layout, std::span<const double> thresholds,
                    output<T, Index>& out, std::size_t, std::span<std::size_t> kept) {
    auto* keys = predicate_staging_.fill<cuda_detail::above_key<T>>(layout.size());
    for (std::size_t s = 0; s < layout.size(); ++s) keys[s] = {threshold_key<T>(thresholds[s])};
    const auto* predicates = upload<cuda_detail::above_key<T>>(predicates_, predicate_staging_, layout.size());
    compact<false, true, Final>(source, layout, predicates, out, kept);
  }

  template <class Source, class T, class Index>
  void select_band(const Source& source, double low, double high, output<T, Index>& out) {
    const segment whole{0, source.size};
    *predicate_staging_.fill<cuda_detail::in_band<T>>(1) = {threshold_key<T>(low), threshold_key<T>(high)};
    const auto* band = upload<cuda_detail::in_band<T>>(predicates_, predicate_staging_, 1);
    std::size_t kept = 0;
    compact<true, false, false>(source, {&whole, 1}, band, out, {&kept, 1});
  }

  template <class Source, class T, class Index>
  void select_indices(const Source& source, std::span<const std::size_t> chosen, output<T, Index>& out) {
    const std::size_t start = out.size();
    out.resize(start + chosen.size());
    auto* positions = upload_positions(chosen);
    if (!chosen.empty())
      cuda_detail::write_chosen<<<grid(chosen.size()), cuda_detail::block_threads, 0, stream_>>>(
          source, positions, chosen.size(), out.index_data() + start, out.value_data() + start);
    if constexpr (Source::has_state) {
      cuda_detail::settle_unsent<<<grid(source.size), cuda_detail::block_threads, 0, stream_>>>(source);
      if (!chosen.empty())
        cuda_detail::mark_chosen<<<grid(chosen.size()), cuda_detail::block_threads, 0, stream_>>>(source, positions,
                                                                                                   chosen.size());
    }
    SIDCO_CUDA(cudaGetLastError());
  }

  template <class Source>
  void gather_magnitudes(const Source& source, std::span<const std::size_t> positions, std::span<double> out) {
    gather(source, positions, out, true);
  }

  template <class T, class Index>
  void keep_top_k(output<T, Index>& out, std::size_t begin, std::size_t k) {
    using Key = magnitude_key_t<T>;
    const std::size_t count = out.size() - begin;
    if (count <= k) return;
    const T* values = out.value_data() + begin;
    // Eight bits a round from the top (core/radix_select.hpp): the k-th largest key, and
    // how many ties it keeps.
    radix_select<Key> walk(k);
    auto* bins = counters(radix_select<Key>::bins);
    host_counters_.resize(radix_select<Key>::bins);
    for (int round = 0; round < radix_select<Key>::rounds; ++round) {
      SIDCO_CUDA(cudaMemsetAsync(bins, 0, radix_select<Key>::bins * sizeof(unsigned long long), stream_));
      cuda_detail::digit_histogram<<<grid(count), cuda_detail::block_threads, 0, stream_>>>(values, count, walk,
                                                                                           round, bins);
      SIDCO_CUDA(cudaGetLastError());
      copy_back(host_counters_.data(), bins, radix_select<Key>::bins);
      walk.choose(host_counters_.data(), round);
    }
    // Ties ranked by index (entries ascend by index), then an order-keeping compaction.
    ranks_.resize(count);
    flags_.resize(count);
    cuda_detail::tie_flags<<<grid(count), cuda_detail::block_threads, 0, stream_>>>(values, count, walk, ranks_.data());
    SIDCO_CUDA(cudaGetLastError());
    std::size_t bytes = 0;
    SIDCO_CUDA(cub::DeviceScan::ExclusiveSum(nullptr, bytes, ranks_.data(), ranks_.data(), count, stream_));
    SIDCO_CUDA(cub::DeviceScan::ExclusiveSum(scratch(bytes), bytes, ranks_.data(), ranks_.data(), count, stream_));
    cuda_detail::top_k_flags<<<grid(count), cuda_detail::block_threads, 0, stream_>>>(values, count, walk, ranks_.data(),
                                                                                       flags_.data());
    SIDCO_CUDA(cudaGetLastError());
    Index* kept_indices = staging<Index>(staging_indices_, k);
    T* kept_values = staging<T>(staging_values_, k);
    auto* selected = counters(1);
    const Index* indices = out.index_data() + begin;
    bytes = 0;
    SIDCO_CUDA(cub::DeviceSelect::Flagged(nullptr, bytes, indices, flags_.data(), kept_indices, selected,
                                          std::int64_t(count), stream_));
    SIDCO_CUDA(cub::DeviceSelect::Flagged(scratch(bytes), bytes, indices, flags_.data(), kept_indices, selected,
                                          std::int64_t(count), stream_));
    bytes = 0;
    SIDCO_CUDA(cub::DeviceSelect::Flagged(nullptr, bytes, values, flags_.data(), kept_values, selected,
                                          std::int64_t(count), stream_));
    SIDCO_CUDA(cub::DeviceSelect::Flagged(scratch(bytes), bytes, values, flags_.data(), kept_values, selected,
                                          std::int64_t(count), stream_));
    SIDCO_CUDA(cudaMemcpyAsync(out.index_data() + begin, kept_indices, k * sizeof(Index),
                               cudaMemcpyDeviceToDevice, stream_));
    SIDCO_CUDA(cudaMemcpyAsync(out.value_data() + begin, kept_values, k * sizeof(T), cudaMemcpyDeviceToDevice,
                               stream_));
    out.truncate(begin + k);
  }

  template <class T, class Index>
  void merge_runs(output<T, Index>& out, std::size_t begin, std::span<const std::size_t>) {
    // The runs hold distinct indices: sorting by index is the merge.
    const std::size_t count = out.size() - begin;
    if (count < 2) return;
    Index* sorted_indices = staging<Index>(staging_indices_, count);
    T* sorted_values = staging<T>(staging_values_, count);
    Index* indices = out.index_data() + begin;
    T* values = out.value_data() + begin;
    std::size_t bytes = 0;
    SIDCO_CUDA(cub::DeviceRadixSort::SortPairs(nullptr, bytes, indices, sorted_indices, values,
                                               sorted_values, std::int64_t(count), 0, int(8 * sizeof(Index)), stream_));
    SIDCO_CUDA(cub::DeviceRadixSort::SortPairs(scratch(bytes), bytes, indices, sorted_indices, values,
                                               sorted_values, std::int64_t(count), 0, int(8 * sizeof(Index)), stream_));
    SIDCO_CUDA(cudaMemcpyAsync(indices, sorted_indices, count * sizeof(Index), cudaMemcpyDeviceToDevice, stream_));
    SIDCO_CUDA(cudaMemcpyAsync(values, sorted_values, count * sizeof(T), cudaMemcpyDeviceToDevice, stream_));
  }

  template <class Source, class T, class Index>
  void mark_sent(const Source& source, const output<T, Index>& out, std::size_t begin) {
    if constexpr (Source::has_state) {
      const std::size_t count = out.size() - begin;
      if (count == 0) return;
      cuda_detail::mark_sent<<<grid(count), cuda_detail::block_threads, 0, stream_>>>(
          source, out.indices().data() + begin, count);
      SIDCO_CUDA(cudaGetLastError());
    }
  }

  template <class T, class Index>
  void scatter_add(const output<T, Index>& in, memory::view<T> dense, T scale) {
    if (in.dense_size() != dense.size())
      sidco::detail::fail("dense: size ", dense.size(), " does not match the sparse vector's dense size ", in.dense_size());
    if (in.empty()) return;
    auto* largest = counters(1);
    cuda_detail::largest_index<<<grid(in.size()), cuda_detail::block_threads, 0, stream_>>>(in.indices().data(), in.size(),
                                                                                              largest);
    SIDCO_CUDA(cudaGetLastError());
    const auto top = fetch_counter(largest);
    if (top >= dense.size())
      sidco::detail::fail("sparse vector: index ", top, " is out of range for dense size ", dense.size());
    cuda_detail::scatter_add<<<grid(in.size()), cuda_detail::block_threads, 0, stream_>>>(
        in.indices().data(), in.values().data(), in.size(), dense.data(), scale);
    SIDCO_CUDA(cudaGetLastError());
  }

  /// Waits for everything this backend queued.
  void synchronize() {
    ++host_waits_;
    SIDCO_CUDA(cudaStreamSynchronize(stream_));
  }

  /// How many times the host has waited for this backend's stream (every wait goes through
  /// copy_back or synchronize), so that tests can assert the syncs per call listed above.
  std::uint64_t host_waits() const { return host_waits_; }

  /// Device and host bytes kept between calls: O(pieces + segments), never O(N) (plus the
  /// staging of Top-k's candidates, cold path only).
  std::size_t workspace_bytes() const {
    return temp_.capacity() + bundles_.capacity() + merged_.capacity() + piece_table_.capacity() * sizeof(cuda_detail::piece) +
           segment_table_.capacity() * sizeof(std::uint32_t) + counts_.capacity() * sizeof(std::uint32_t) +
           offsets_.capacity() * sizeof(std::size_t) + counters_.capacity() * sizeof(unsigned long long) +
           predicates_.capacity() + positions_.capacity() * sizeof(std::size_t) + ranks_.capacity() * sizeof(std::uint32_t) +
           flags_.capacity() + staging_indices_.capacity() + staging_values_.capacity() + predicate_staging_.capacity() +
           offset_staging_.capacity() + position_staging_.capacity() + piece_staging_.capacity() +
           segment_staging_.capacity();
  }

 private:
  static unsigned grid(std::size_t n) {
    const std::size_t blocks = (n + cuda_detail::block_threads - 1) / cuda_detail::block_threads;
    return unsigned(std::clamp<std::size_t>(blocks, 1, 4096));
  }

  template <class Stats, std::size_t Probes, class Source>
  void analyze_with(const Source& source, std::span<const segment> layout, std::span<const double> probes,
                    std::span<moments> out) {
    using T = typename Source::value_type;
    constexpr std::size_t width = 1 + Probes;
    const std::size_t per = probes.size() / layout.size();
    refresh_pieces(layout);
    const std::size_t probe_count = layout.size() * Probes;
    auto* host_probes = predicate_staging_.fill<cuda_detail::device_probe<T>>(probe_count);
    for (std::size_t p = 0; p < probe_count; ++p) {
      const auto key = threshold_key<T>(probes[p] < 0 ? 0.0 : probes[p]);
      host_probes[p] = {key, to_accumulator(magnitude_of_key<T>(magnitude_key_t<T>(key)))};
    }
    const auto* device_probes = upload<cuda_detail::device_probe<T>>(predicates_, predicate_staging_, probe_count);
    const std::size_t pieces = plan_.pieces().size(), segments = layout.size();
    bundles_.resize(pieces * sizeof(cuda_detail::moments_bundle<width>));
    merged_.resize(segments * sizeof(cuda_detail::moments_bundle<width>));
    auto* per_piece = reinterpret_cast<cuda_detail::moments_bundle<width>*>(bundles_.data());
    auto* per_segment = reinterpret_cast<cuda_detail::moments_bundle<width>*>(merged_.data());
    cuda_detail::analyze_pieces<Stats::log, Stats::tail_log, Probes><<<unsigned(pieces), cuda_detail::block_threads, 0, stream_>>>(
        source, piece_table_.data(), device_probes, per_piece);
    cuda_detail::merge_segments<width><<<unsigned(segments), cuda_detail::block_threads, 0, stream_>>>(
        per_piece, segment_table_.data(), per_segment);
    SIDCO_CUDA(cudaGetLastError());
    auto result = host_scratch<cuda_detail::moments_bundle<width>>(result_bytes_, segments);
    copy_back(result.data(), per_segment, segments);
    for (std::size_t s = 0; s < segments; ++s)
      for (std::size_t w = 0; w < width; ++w) out[s * (1 + per) + w] = result[s].m[w];
  }

  // The two-pass compaction: per-piece counts (one sync), offsets, then each block writes
  // its piece's kept entries in order, settling as it goes (Settle). device_predicates: one
  // a segment, in device memory.
  template <bool Rescan, bool Settle, bool Final, class Source, class Predicate, class T, class Index>
  void compact(const Source& source, std::span<const segment> layout, const Predicate* device_predicates,
               output<T, Index>& out, std::span<std::size_t> kept) {
    refresh_pieces(layout);
    const std::size_t pieces = plan_.pieces().size();
    counts_.resize(pieces);
    cuda_detail::count_pieces<Rescan><<<unsigned(pieces), cuda_detail::block_threads, 0, stream_>>>(
        source, piece_table_.data(), device_predicates, counts_.data());
    SIDCO_CUDA(cudaGetLastError());
    host_counts_.resize(pieces);
    copy_back(host_counts_.data(), counts_.data(), pieces);
    const std::size_t start = out.size();
    auto* host_offsets = offset_staging_.fill<std::size_t>(pieces);
    std::size_t total = 0;
    for (std::size_t p = 0; p < pieces; ++p) {
      host_offsets[p] = total;
      total += host_counts_[p];
    }
    const auto& first = plan_.segment_first();
    for (std::size_t s = 0; s < layout.size(); ++s) {
      kept[s] = 0;
      for (std::uint32_t p = first[s]; p < first[s + 1]; ++p) kept[s] += host_counts_[p];
    }
    out.resize(start + total);
    auto* offsets = upload<std::size_t>(offsets_, offset_staging_, pieces);
    cuda_detail::write_pieces<Rescan, Settle, Final><<<unsigned(pieces), cuda_detail::block_threads, 0, stream_>>>(
        source, piece_table_.data(), device_predicates, offsets, out.index_data() + start, out.value_data() + start);
    SIDCO_CUDA(cudaGetLastError());
  }

  template <class Source>
  void gather(const Source& source, std::span<const std::size_t> positions, std::span<double> out, bool magnitude) {
    if (positions.empty()) return;
    auto* device_positions = upload_positions(positions);
    double* values = staging<double>(staging_values_, positions.size());
    cuda_detail::gather_magnitudes<<<grid(positions.size()), cuda_detail::block_threads, 0, stream_>>>(
        source, device_positions, positions.size(), values, magnitude);
    SIDCO_CUDA(cudaGetLastError());
    copy_back(out.data(), values, positions.size());
  }

  void refresh_pieces(std::span<const segment> layout) {
    if (!plan_.plan(layout, tile)) return;
    // A new layout: both tables through page-locked staging on the backend's stream, ordered
    // after any kernel still reading the old ones (a pageable cudaMemcpy ran on the legacy
    // stream, unordered against a non-blocking one, and could return before the data landed).
    const auto& pieces = plan_.pieces();
    const auto& first = plan_.segment_first();
    std::copy(pieces.begin(), pieces.end(), piece_staging_.fill<cuda_detail::piece>(pieces.size()));
    upload<cuda_detail::piece>(piece_table_, piece_staging_, pieces.size());
    std::copy(first.begin(), first.end(), segment_staging_.fill<std::uint32_t>(first.size()));
    upload<std::uint32_t>(segment_table_, segment_staging_, first.size());
  }

  // count values of U from a staging to a device byte buffer grown to hold them.
  template <class U>
  const U* upload(device_buffer<unsigned char>& to, sidco::memory::upload_staging& from, std::size_t count) {
    to.resize(std::max<std::size_t>(count * sizeof(U), 1));
    from.upload(to.data(), count * sizeof(U), stream_);
    return reinterpret_cast<const U*>(to.data());
  }
  template <class U>
  U* upload(device_buffer<U>& to, sidco::memory::upload_staging& from, std::size_t count) {
    to.resize(std::max<std::size_t>(count, 1));
    from.upload(to.data(), count * sizeof(U), stream_);
    return to.data();
  }
  const std::size_t* upload_positions(std::span<const std::size_t> positions) {
    std::copy(positions.begin(), positions.end(), position_staging_.fill<std::size_t>(positions.size()));
    return upload<std::size_t>(positions_, position_staging_, positions.size());
  }

  template <class U>
  void copy_back(U* to, const U* from, std::size_t count) {
    SIDCO_CUDA(cudaMemcpyAsync(to, from, count * sizeof(U), cudaMemcpyDeviceToHost, stream_));
    ++host_waits_;
    SIDCO_CUDA(cudaStreamSynchronize(stream_));
  }

  // count zeroed counters on the device.
  unsigned long long* counters(std::size_t count) {
    counters_.resize(count);
    SIDCO_CUDA(cudaMemsetAsync(counters_.data(), 0, count * sizeof(unsigned long long), stream_));
    return counters_.data();
  }
  unsigned long long fetch_counter(const unsigned long long* counter) {
    unsigned long long value = 0;
    copy_back(&value, counter, 1);
    return value;
  }

  void* scratch(std::size_t bytes) {
    temp_.resize(std::max<std::size_t>(bytes, 1));
    return temp_.data();
  }

  // count values of U in a device byte buffer kept for the purpose (grown, never shrunk).
  template <class U>
  static U* staging(device_buffer<unsigned char>& bytes, std::size_t count) {
    bytes.resize(std::max<std::size_t>(count * sizeof(U), 1));
    return reinterpret_cast<U*>(bytes.data());
  }
  // count values of a trivially copyable U in a host byte buffer kept for the purpose, so
  // that a warm call allocates nothing.
  template <class U>
  static std::span<U> host_scratch(std::vector<unsigned char>& bytes, std::size_t count) {
    static_assert(std::is_trivially_copyable_v<U> && alignof(U) <= alignof(std::max_align_t));
    bytes.resize(std::max<std::size_t>(count * sizeof(U), 1));
    return {reinterpret_cast<U*>(bytes.data()), count};
  }

  cudaStream_t stream_ = nullptr;
  std::uint64_t host_waits_ = 0;
  cuda_detail::piece_plan plan_;
  device_buffer<cuda_detail::piece> piece_table_;
  device_buffer<std::uint32_t> segment_table_;
  device_buffer<unsigned char> temp_, bundles_, merged_, predicates_;
  device_buffer<std::uint32_t> counts_, ranks_;
  device_buffer<std::size_t> offsets_, positions_;
  device_buffer<unsigned long long> counters_;
  device_buffer<char> flags_;
  device_buffer<unsigned char> staging_indices_, staging_values_;
  sidco::memory::upload_staging predicate_staging_, offset_staging_, position_staging_, piece_staging_, segment_staging_;
  std::vector<std::uint32_t> host_counts_;
  std::vector<unsigned long long> host_counters_;
  std::vector<unsigned char> result_bytes_;
};

}  // namespace sidco::backend
