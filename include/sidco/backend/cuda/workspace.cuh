// What backend::cuda keeps between calls: its stream, the host-wait counter, the layout's
// piece tables and the buffers its algorithms reuse (grown, never shrunk, so a warm call
// allocates nothing on the host or the device). Every host wait goes through copy_back,
// synchronize or fill (a staging whose last upload is still queued), so host_waits counts
// them all. Grids and piece sizes come from the tuning and the multiprocessor count.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <type_traits>
#include <vector>

#include "sidco/backend/cuda/check.cuh"
#include "sidco/backend/cuda/pieces.hpp"
#include "sidco/backend/cuda/tuning.cuh"
#include "sidco/core/segment.hpp"
#include "sidco/memory/device.cuh"

namespace sidco::backend::cuda_detail {

struct workspace {
  template <class T>
  using device_buffer = sidco::memory::device_buffer<T>;

  workspace() = default;
  /// Every buffer grows and is released in s's order.
  explicit workspace(cudaStream_t s) : stream(s) {
    each_device_buffer(*this, [s](auto& buffer) { buffer.use_stream(s); });
  }

  cudaStream_t stream = nullptr;
  std::uint64_t host_waits = 0;
  std::size_t multiprocessor_count = 0;  // 0 until read

  piece_plan plan;
  device_buffer<piece> piece_table;
  device_buffer<std::uint32_t> segment_table;
  device_buffer<unsigned char> temp, bundles, merged, predicates;
  device_buffer<std::uint32_t> counts, run_labels;
  device_buffer<std::size_t> offsets, positions;
  device_buffer<unsigned long long> counter_buffer;
  device_buffer<unsigned long long> histograms;  // coarse_histograms' per segment, then their tallies
  device_buffer<unsigned char> walk_state, bins, tallies, run_table;
  device_buffer<unsigned char> staging_indices, staging_values;
  // A one-pass selection's regions (one_pass_select): their starts, entries and per-piece results.
  device_buffer<std::size_t> region_starts;
  device_buffer<unsigned char> region_indices, region_values;
  device_buffer<unsigned long long> region_results;
  sidco::memory::upload_staging predicate_staging, position_staging, piece_staging, segment_staging, run_staging,
      region_staging;
  std::vector<std::uint32_t> host_counts;
  std::vector<unsigned char> result_bytes;
  std::vector<std::size_t> host_chosen;  // Random-k's draw where the host makes it

  /// Device and host bytes kept: O(pieces + segments), pieces O(multiprocessors +
  /// segments), never O(N) (plus, per candidate of an exact Top-k, its tally, run label and
  /// staging, Random-k's k indices, and a one-pass selection's regions: 1.5 entries an
  /// expected one, plus a write step a piece).
  std::size_t bytes() const {
    std::size_t total = predicate_staging.capacity() + position_staging.capacity() +
                        piece_staging.capacity() + segment_staging.capacity() + run_staging.capacity() +
                        region_staging.capacity() + host_chosen.capacity() * sizeof(std::size_t);
    each_device_buffer(*this, [&total](const auto& buffer) {
      total += buffer.capacity() * sizeof(*buffer.data());
    });
    return total;
  }

  template <class Self, class F>
  static void each_device_buffer(Self& self, F&& f) {
    f(self.piece_table), f(self.segment_table), f(self.temp), f(self.bundles), f(self.merged), f(self.predicates);
    f(self.counts), f(self.run_labels), f(self.offsets), f(self.positions), f(self.counter_buffer), f(self.histograms);
    f(self.walk_state), f(self.bins), f(self.tallies), f(self.run_table);
    f(self.staging_indices), f(self.staging_values), f(self.region_starts), f(self.region_indices);
    f(self.region_values), f(self.region_results);
  }

  /// Grows out's buffers on the stream from now on, so that growth is ordered after the
  /// kernels this backend queued on them.
  template <class Vector>
  void adopt(Vector& out) {
    out.for_each_buffer([this](auto& buffer) { buffer.use_stream(stream); });
  }

  /// Waits for everything queued on the stream.
  void synchronize() {
    ++host_waits;
    SIDCO_CUDA(cudaStreamSynchronize(stream));
  }

  /// The current device's multiprocessor count, read once (kernels run on the current
  /// device, as the stream must belong to it).
  std::size_t multiprocessors() {
    if (multiprocessor_count == 0) {
      int device = 0, count = 0;
      SIDCO_CUDA(cudaGetDevice(&device));
      SIDCO_CUDA(cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device));
      multiprocessor_count = std::size_t(std::max(count, 1));
    }
    return multiprocessor_count;
  }

  /// Blocks for a grid-stride kernel over n items (per_block a block per step): enough to
  /// cover n, at most blocks_per_sm a multiprocessor and max_grid.
  template <class Tuning>
  unsigned blocks(std::size_t n, std::size_t per_block = std::size_t(Tuning::block_threads)) {
    return grid_for(n, per_block,
                    std::min<std::size_t>(Tuning::max_grid, multiprocessors() * std::size_t(Tuning::blocks_per_sm)));
  }

  /// The piece size of a layout of total values (tile_for on this GPU).
  template <class Tuning>
  std::size_t tile(std::size_t total) {
    return tile_for<Tuning>(total, multiprocessors());
  }

  /// The layout's piece tables on the device, re-uploaded only when the layout changed:
  /// through page-locked staging on the stream, ordered after any kernel still reading the
  /// old ones (a pageable cudaMemcpy runs on the legacy stream, unordered against a
  /// non-blocking one, and can return before the data lands).
  template <class Tuning>
  void refresh_pieces(std::span<const segment> layout) {
    std::size_t total = 0;
    for (const segment& s : layout) total += s.size;
    if (!plan.plan(layout, tile<Tuning>(total))) return;
    try {
      const auto& all = plan.pieces();
      const auto& first = plan.segment_first();
      std::copy(all.begin(), all.end(), fill<piece>(piece_staging, all.size()));
      upload<piece>(piece_table, piece_staging, all.size());
      std::copy(first.begin(), first.end(), fill<std::uint32_t>(segment_staging, first.size()));
      upload<std::uint32_t>(segment_table, segment_staging, first.size());
    } catch (...) {
      plan.forget();  // the device tables may be stale or short: rebuilt on the next call
      throw;
    }
  }

  /// Room for count values of U in a staging, once its last upload has left it: a host wait
  /// (counted) only where that upload is still queued (not in a warm compress, where an
  /// earlier wait covered it).
  template <class U>
  U* fill(sidco::memory::upload_staging& staging, std::size_t count) {
    if (staging.upload_pending()) ++host_waits;
    return staging.fill<U>(count);
  }

  /// count values of U from a staging to a device byte buffer grown to hold them.
  template <class U>
  const U* upload(device_buffer<unsigned char>& to, sidco::memory::upload_staging& from, std::size_t count) {
    to.resize(std::max<std::size_t>(count * sizeof(U), 1));
    from.upload(to.data(), count * sizeof(U), stream);
    return reinterpret_cast<const U*>(to.data());
  }
  template <class U>
  U* upload(device_buffer<U>& to, sidco::memory::upload_staging& from, std::size_t count) {
    to.resize(std::max<std::size_t>(count, 1));
    from.upload(to.data(), count * sizeof(U), stream);
    return to.data();
  }
  const std::size_t* upload_positions(std::span<const std::size_t> chosen) {
    std::copy(chosen.begin(), chosen.end(), fill<std::size_t>(position_staging, chosen.size()));
    return upload<std::size_t>(positions, position_staging, chosen.size());
  }

  /// count values of U back to the host: one host wait.
  template <class U>
  void copy_back(U* to, const U* from, std::size_t count) {
    SIDCO_CUDA(cudaMemcpyAsync(to, from, count * sizeof(U), cudaMemcpyDeviceToHost, stream));
    synchronize();
  }

  /// count zeroed counters on the device.
  unsigned long long* counters(std::size_t count) {
    counter_buffer.resize(count);
    SIDCO_CUDA(cudaMemsetAsync(counter_buffer.data(), 0, count * sizeof(unsigned long long), stream));
    return counter_buffer.data();
  }
  unsigned long long fetch_counter(const unsigned long long* counter) {
    unsigned long long value = 0;
    copy_back(&value, counter, 1);
    return value;
  }

  /// CUB's temporary storage.
  void* scratch(std::size_t size) {
    temp.resize(std::max<std::size_t>(size, 1));
    return temp.data();
  }

  /// count values of U in a device byte buffer kept for the purpose.
  template <class U>
  static U* staging(device_buffer<unsigned char>& buffer, std::size_t count) {
    buffer.resize(std::max<std::size_t>(count * sizeof(U), 1));
    return reinterpret_cast<U*>(buffer.data());
  }
  /// count values of a trivially copyable U in a host byte buffer kept for the purpose.
  template <class U>
  static std::span<U> host_scratch(std::vector<unsigned char>& buffer, std::size_t count) {
    static_assert(std::is_trivially_copyable_v<U> && alignof(U) <= alignof(std::max_align_t));
    buffer.resize(std::max<std::size_t>(count * sizeof(U), 1));
    return {reinterpret_cast<U*>(buffer.data()), count};
  }
};

}  // namespace sidco::backend::cuda_detail
