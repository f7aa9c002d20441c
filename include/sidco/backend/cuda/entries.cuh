// Entries kept on the host (what goes back into a residual, an exchange's update) written
// into device memory: to[indices[j]] = values[j]. The one entry-writing kernel of the
// exchanges' device paths (comm/nccl_reduce.cuh, the DDP hook's CUDA codecs) and the writer
// that uploads a batch of entries and runs it once.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "sidco/backend/cuda/check.cuh"
#include "sidco/backend/cuda/tuning.cuh"
#include "sidco/memory/device.cuh"

namespace sidco::backend::cuda_detail {

/// to[indices[j]] = values[j] for j < count (distinct indices: no atomics). Values arrive
/// as bits of T's layout (a host type of the same bits is copied as they are).
template <class Tuning, class T, class Index>
__global__ void __launch_bounds__(Tuning::block_threads)
    set_entries(const Index* indices, const T* values, std::size_t count, T* to) {
  for (std::size_t j = std::size_t(blockIdx.x) * Tuning::block_threads + threadIdx.x; j < count;
       j += std::size_t(gridDim.x) * Tuning::block_threads)
    to[indices[j]] = values[j];
}

/// set_entries on device copies of count entries, on stream.
template <class Tuning, class T, class Index>
void launch_set_entries(const Index* indices, const T* values, std::size_t count, T* to, cudaStream_t stream) {
  if (count == 0) return;
  set_entries<Tuning><<<grid<Tuning>(count), Tuning::block_threads, 0, stream>>>(indices, values, count, to);
  SIDCO_CUDA(cudaGetLastError());
}

/// Writes entries held on the host into device memory through buffers reused from call to
/// call: one upload of the indices, one of the values, one kernel.
template <class T, class Index, class Tuning = default_tuning>
class entry_writer {
 public:
  entry_writer() = default;
  entry_writer(const entry_writer&) = delete;
  entry_writer& operator=(const entry_writer&) = delete;

  /// to[indices[j]] = values[j] (values: count of T's bits); complete when it returns, so
  /// the buffers are free for the next call. Nothing when to is null or count is 0.
  void write(T* to, const Index* indices, const void* values, std::size_t count, cudaStream_t stream) {
    if (count == 0 || to == nullptr) return;
    indices_.use_stream(stream);
    values_.use_stream(stream);
    indices_.resize(count);
    values_.resize(count);
    SIDCO_CUDA(cudaMemcpyAsync(indices_.data(), indices, count * sizeof(Index), cudaMemcpyHostToDevice, stream));
    SIDCO_CUDA(cudaMemcpyAsync(values_.data(), values, count * sizeof(T), cudaMemcpyHostToDevice, stream));
    launch_set_entries<Tuning>(indices_.data(), values_.data(), count, to, stream);
    SIDCO_CUDA(cudaStreamSynchronize(stream));
  }

  /// Releases the buffers (on the stream they were last used on).
  void release() {
    indices_ = {};
    values_ = {};
  }

 private:
  memory::device_buffer<Index> indices_;
  memory::device_buffer<T> values_;
};

}  // namespace sidco::backend::cuda_detail
