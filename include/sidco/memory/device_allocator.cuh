// Where stream-ordered device buffers get their storage. By default from CUDA's stream-ordered
// pool (cudaMallocAsync, cudaFreeAsync); a program with its own device allocator (a framework's
// caching allocator) installs it once, before its first buffer, so that sidco's scratch is
// counted, limited and reused with the rest of its memory instead of a second pool growing
// beside it. Buffers without a stream stay on cudaMalloc: they must be ready for any stream.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "sidco/backend/cuda/check.cuh"

namespace sidco::memory {

/// allocate: bytes (> 0) usable on stream in its order, or throws (an out-of-memory error
/// of the allocator's own kind is passed through unchanged). release: gives back what
/// allocate returned, after the work queued so far on stream; never throws.
struct device_allocator {
  void* (*allocate)(std::size_t bytes, cudaStream_t stream);
  void (*release)(void* storage, cudaStream_t stream) noexcept;
};

inline constexpr device_allocator cuda_stream_ordered_allocator{
    [](std::size_t bytes, cudaStream_t stream) -> void* {
      void* storage = nullptr;
      SIDCO_CUDA(cudaMallocAsync(&storage, bytes, stream));
      return storage;
    },
    [](void* storage, cudaStream_t stream) noexcept { cudaFreeAsync(storage, stream); }};

namespace detail {
inline const device_allocator*& installed_device_allocator() {
  static const device_allocator* installed = &cuda_stream_ordered_allocator;
  return installed;
}
}  // namespace detail

/// The allocator new storage comes from. A buffer gives its storage back to the allocator
/// it came from, so installing another later leaves existing buffers sound.
inline const device_allocator& current_device_allocator() { return *detail::installed_device_allocator(); }

/// Installs allocator (static storage: it must outlive every buffer) for every stream-ordered
/// buffer allocated from now on, process-wide; returns the one it replaces.
inline const device_allocator& install_device_allocator(const device_allocator& allocator) {
  const device_allocator& previous = current_device_allocator();
  detail::installed_device_allocator() = &allocator;
  return previous;
}

}  // namespace sidco::memory
