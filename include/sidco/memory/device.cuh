// Device memory: the memory space of backend::cuda. Buffers grow geometrically and keep
// their contents, in their stream's order when they have one (the installed
// device_allocator: cudaMallocAsync unless a program installed its own), else
// synchronously (cudaMalloc); pointers and views are device addresses the host never
// dereferences. Whole-buffer operations (zero, copies to and
// from host vectors) are synchronous: they are for setting up and inspecting, not for the
// hot path.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <span>
#include <utility>

#include "sidco/backend/cuda/check.cuh"
#include "sidco/memory/device_allocator.cuh"
#include "sidco/memory/device_view.hpp"

namespace sidco::memory {

/// Owned device storage: data(), size(), capacity(), resize() (keeps contents; new
/// elements unspecified), reserve(), clear(). A buffer given a stream allocates, grows and
/// releases in that stream's order (the installed device_allocator, cudaMemcpyAsync: no
/// host wait, no other stream touched); a backend gives the buffers it writes its own
/// stream. Without one (nullptr) it is synchronous, like cudaMalloc, so that a buffer a
/// caller fills is ready for any stream. Copies take the source's stream and are complete
/// when they return.
template <class T>
class device_buffer {
 public:
  device_buffer() = default;
  explicit device_buffer(std::size_t size, cudaStream_t stream = nullptr) : stream_(stream) { resize(size); }
  // Delegates so that a failed copy still frees what it allocated.
  device_buffer(const device_buffer& other) : device_buffer() {
    stream_ = other.stream_;
    resize(other.size_);
    if (size_) {
      SIDCO_CUDA(cudaMemcpyAsync(data_, other.data_, size_ * sizeof(T), cudaMemcpyDeviceToDevice, stream_));
      SIDCO_CUDA(cudaStreamSynchronize(stream_));
    }
  }
  device_buffer(device_buffer&& other) noexcept { swap(other); }
  device_buffer& operator=(const device_buffer& other) {
    if (this == &other) return *this;
    device_buffer copy(other);
    swap(copy);
    return *this;
  }
  device_buffer& operator=(device_buffer&& other) noexcept {
    swap(other);
    return *this;
  }
  ~device_buffer() { release(data_, source_); }

  T* data() { return data_; }
  const T* data() const { return data_; }
  std::size_t size() const { return size_; }
  device_view<T> view() { return {data_, size_}; }
  device_view<const T> view() const { return {data_, size_}; }
  std::size_t capacity() const { return capacity_; }

  /// The stream that growth and release are ordered on (nullptr: the default stream).
  cudaStream_t stream() const { return stream_; }
  /// Orders growth and release on stream from now on. The storage's last use on the old
  /// stream must already be ordered before stream's next work (same stream, or an event).
  void use_stream(cudaStream_t stream) { stream_ = stream; }

  void reserve(std::size_t count) {
    if (count <= capacity_) return;
    const device_allocator* source = stream_ ? &current_device_allocator() : nullptr;
    T* grown = nullptr;
    if (source)
      grown = static_cast<T*>(source->allocate(count * sizeof(T), stream_));
    else
      SIDCO_CUDA(cudaMalloc(reinterpret_cast<void**>(&grown), count * sizeof(T)));
    if (size_) {
      const cudaError_t copied =
          stream_ ? cudaMemcpyAsync(grown, data_, size_ * sizeof(T), cudaMemcpyDeviceToDevice, stream_)
                  : cudaMemcpy(grown, data_, size_ * sizeof(T), cudaMemcpyDeviceToDevice);
      if (copied != cudaSuccess) release(grown, source);
      SIDCO_CUDA(copied);
    }
    release(data_, source_);
    data_ = grown;
    source_ = source;
    capacity_ = count;
  }
  void resize(std::size_t count) {
    if (count > capacity_) reserve(std::max(count, capacity_ + capacity_ / 2));
    size_ = count;
  }
  void clear() { size_ = 0; }
  void swap(device_buffer& other) noexcept {
    std::swap(data_, other.data_);
    std::swap(size_, other.size_);
    std::swap(capacity_, other.capacity_);
    std::swap(stream_, other.stream_);
    std::swap(source_, other.source_);
  }

 private:
  // source: the allocator storage came from; nullptr: cudaMalloc.
  void release(T* storage, const device_allocator* source) {
    if (!storage) return;
    if (source)
      source->release(storage, stream_);
    else
      cudaFree(storage);
  }

  T* data_ = nullptr;
  std::size_t size_ = 0, capacity_ = 0;
  cudaStream_t stream_ = nullptr;
  const device_allocator* source_ = nullptr;
};

/// Page-locked host memory that uploads go through: cudaMemcpyAsync from it leaves the
/// stream running, where from pageable memory it would synchronize it first. Before it is
/// refilled it waits for its last upload (long done, in steady use). Copies start empty.
class upload_staging {
 public:
  upload_staging() = default;
  upload_staging(const upload_staging&) {}
  upload_staging& operator=(const upload_staging&) { return *this; }
  ~upload_staging() {
    if (event_) cudaEventDestroy(event_);
    if (data_) cudaFreeHost(data_);
  }

  /// Whether the last upload is still queued (fill would wait for it).
  bool upload_pending() const {
    if (!event_) return false;
    const cudaError_t state = cudaEventQuery(event_);
    if (state == cudaErrorNotReady) {
      // Not an error: cleared so that the next launch check does not report it (every
      // launch is checked where it is made, so nothing else is cleared here).
      static_cast<void>(cudaGetLastError());
      return true;
    }
    SIDCO_CUDA(state);
    return false;
  }

  /// Room for count values of U, filled by the caller, then upload()ed.
  template <class U>
  U* fill(std::size_t count) {
    if (event_) SIDCO_CUDA(cudaEventSynchronize(event_));
    const std::size_t bytes = std::max<std::size_t>(count * sizeof(U), 1);
    if (bytes > capacity_) {
      if (data_) cudaFreeHost(data_);
      data_ = nullptr;
      SIDCO_CUDA(cudaMallocHost(&data_, bytes));
      capacity_ = bytes;
    }
    return static_cast<U*>(data_);
  }

  /// The first bytes of the staging to device memory at to, on stream.
  void upload(void* to, std::size_t bytes, cudaStream_t stream) {
    if (!event_) SIDCO_CUDA(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming));
    if (bytes) SIDCO_CUDA(cudaMemcpyAsync(to, data_, bytes, cudaMemcpyHostToDevice, stream));
    SIDCO_CUDA(cudaEventRecord(event_, stream));
  }

  std::size_t capacity() const { return capacity_; }

 private:
  void* data_ = nullptr;
  std::size_t capacity_ = 0;
  cudaEvent_t event_ = nullptr;
};

struct device {
  static constexpr const char* name = "device";
  template <class T>
  using buffer = device_buffer<T>;
  template <class T>
  using pointer = T*;
  /// Not std::span: host memory given to a device compressor does not compile.
  template <class T>
  using view = device_view<T>;

  template <class T>
  static void zero(view<T> v) {
    if (v.empty()) return;
    // Complete when this returns, whatever stream reads it next; waits for the legacy
    // stream only, not for every stream on the device.
    SIDCO_CUDA(cudaMemsetAsync(v.data(), 0, v.size() * sizeof(T), cudaStreamLegacy));
    SIDCO_CUDA(cudaStreamSynchronize(cudaStreamLegacy));
  }
  template <class T>
  static void copy_to_host(view<const T> from, std::span<T> to) {
    if (!from.empty()) SIDCO_CUDA(cudaMemcpy(to.data(), from.data(), from.size() * sizeof(T), cudaMemcpyDeviceToHost));
  }
  template <class T>
  static void copy_from_host(std::span<const T> from, view<T> to) {
    if (!from.empty()) SIDCO_CUDA(cudaMemcpy(to.data(), from.data(), from.size() * sizeof(T), cudaMemcpyHostToDevice));
  }
};

}  // namespace sidco::memory
