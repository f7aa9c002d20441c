// The hook's codec for a CUDA bucket. Compress runs on backend::cuda with the residual in
// device memory; the selection (about δ N entries) comes to the host, where it is trimmed
// to the capacity and packed exactly as on the CPU, and the payload goes back to device
// memory, which NCCL gathers. Decode reads the gathered payloads on the host (the same
// agreement as the CPU's: every rank raises the same error) and adds them up on the device,
// rank by rank in rank order, in the accumulator type, dividing once: the bits
// sidco::comm::decode gives on the host.
//
// Streams: compress runs on the codec's own stream, ordered after torch's current stream;
// the payload's upload and the whole decode run on the current stream (after the gather,
// whose future orders it). Each call waits for the host twice at most (the selection, the
// gathered payloads).
#pragma once

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <memory>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include <sidco/backend/cuda.cuh>
#include <sidco/comm/capacity.hpp>
#include <sidco/comm/wire.hpp>

#include "../binding.hpp"
#include "../classes.hpp"
#include "../engine.hpp"
#include "device_support.cuh"

namespace sidco_torch {
namespace codec_kernels {

constexpr int block_threads = 256;

inline unsigned grid(std::size_t n) {
  return unsigned(std::clamp<std::size_t>((n + block_threads - 1) / block_threads, 1, 4096));
}

// residual[indices[j]] = values[j]: entries going back into the residual (trimmed, or sent
// in an exchange that failed), where the compressor left +0.
template <class T, class Index>
__global__ void put_entries(const Index* indices, const T* values, std::size_t count, T* residual) {
  for (std::size_t j = std::size_t(blockIdx.x) * blockDim.x + threadIdx.x; j < count;
       j += std::size_t(gridDim.x) * blockDim.x)
    residual[indices[j]] = values[j];
}

// sum[indices[j]] += values[j] in the accumulator type: one rank's entries (distinct
// indices: no atomics), launched rank after rank on one stream.
template <class T, class A, class Index>
__global__ void accumulate(const Index* indices, const T* values, std::size_t count, A* sum) {
  for (std::size_t j = std::size_t(blockIdx.x) * blockDim.x + threadIdx.x; j < count;
       j += std::size_t(gridDim.x) * blockDim.x)
    sum[indices[j]] = A(sum[indices[j]] + sidco::to_accumulator(values[j]));
}

// out[i] = T(average ? sum[i] / ranks : sum[i]), rounded as sidco::comm::decode rounds it.
template <class T, class A>
__global__ void finish(const A* sum, std::size_t n, bool average, A ranks, T* out) {
  for (std::size_t i = std::size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += std::size_t(gridDim.x) * blockDim.x)
    out[i] = sidco::from_accumulator<T>(average ? A(sum[i] / ranks) : sum[i]);
}

}  // namespace codec_kernels

// to[indices[j]] = values[j] for entries held on the host (what goes back into a residual,
// an update's entries), through device buffers reused from call to call.
template <class T, class Index>
class entry_writer {
 public:
  entry_writer() = default;
  entry_writer(const entry_writer&) = delete;
  entry_writer& operator=(const entry_writer&) = delete;

  // Complete when it returns: the buffers are free for the next call.
  void put(T* to, const Index* indices, const T* values, std::size_t count, cudaStream_t stream) {
    if (count == 0 || to == nullptr) return;
    indices_.use_stream(stream);
    values_.use_stream(stream);
    indices_.resize(count);
    values_.resize(count);
    SIDCO_CUDA(cudaMemcpyAsync(indices_.data(), indices, count * sizeof(Index), cudaMemcpyHostToDevice, stream));
    SIDCO_CUDA(cudaMemcpyAsync(values_.data(), values, count * sizeof(T), cudaMemcpyHostToDevice, stream));
    codec_kernels::put_entries<<<codec_kernels::grid(count), codec_kernels::block_threads, 0, stream>>>(
        indices_.data(), values_.data(), count, to);
    SIDCO_CUDA(cudaGetLastError());
    SIDCO_CUDA(cudaStreamSynchronize(stream));
  }

  // Releases the buffers (on the stream they were last used on).
  void release() {
    indices_ = {};
    values_ = {};
  }

 private:
  sidco::memory::device_buffer<Index> indices_;
  sidco::memory::device_buffer<T> values_;
};

template <class T>
class cuda_codec final : public codec_impl {
  using Index = std::uint32_t;
  using A = typename sidco::float_traits<T>::accumulator;
  using memory = sidco::memory::device;

 public:
  cuda_codec(const codec_settings& settings, const sidco::comm::wire_format& format,
             const sidco::comm::capacity_plan& plan, const at::Device& device)
      : settings_(settings), format_(format), plan_(plan), device_(device), size_(settings.layout.back().end()) {
    const c10::cuda::CUDAGuard guard(device_);
    SIDCO_CUDA(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    ready_ = std::make_unique<event>();
    SIDCO_CUDA(cudaEventCreateWithFlags(&uploaded_, cudaEventDisableTiming));
    const cudaStream_t stream = stream_;
    engine_ = make_engine<T, Index, sidco::backend::cuda>(settings.method, settings.options, settings.layout,
                                                          layer_budget::per_layer,
                                                          [stream] { return sidco::backend::cuda(stream); });
    const auto bytes = std::int64_t(format_.bytes());
    host_payload_ = at::zeros({bytes}, at::TensorOptions().dtype(at::kByte).pinned_memory(true));
    payload_ = at::zeros({bytes}, at::TensorOptions().dtype(at::kByte).device(device_));
  }
  cuda_codec(const cuda_codec&) = delete;
  cuda_codec& operator=(const cuda_codec&) = delete;
  ~cuda_codec() override {
    // Buffers ordered on the stream are released on it first; the stream goes once its
    // work is done.
    engine_.reset();
    sent_ = {};
    returned_.release();
    if (uploaded_) cudaEventDestroy(uploaded_);
    if (stream_) cudaStreamDestroy(stream_);
  }

  at::Tensor encode(const at::Tensor& gradient, const c10::optional<at::Tensor>& residual,
                    const sidco::comm::wire_fields& fields) override {
    report_ = {};
    const c10::cuda::CUDAGuard guard(device_);
    const cudaStream_t current = at::cuda::getCurrentCUDAStream(device_.index()).stream();
    SIDCO_CUDA(cudaEventSynchronize(uploaded_));  // the last upload has left host_payload_
    // Whatever fails here fails on this rank alone: the payload carries the error to every
    // rank, and the residual is as it was (compress changes nothing when it throws).
    try {
      check(gradient, "bucket");
      T* r = nullptr;
      if (residual) {
        check(*residual, "residual");
        r = reinterpret_cast<T*>(residual->data_ptr());
      }
      ready_->order(current, stream_);
      report_.compress = engine_->compress({reinterpret_cast<const T*>(gradient.data_ptr()), size_},
                                           settings_.density, r ? memory::view<T>{r, size_} : memory::view<T>{},
                                           sent_);
      fetch_selection();
      report_.trimmed = trim(r);
      report_.compress.selected = host_sent_.size();
      report_.compress.density = double(host_sent_.size()) / double(size_);
      sidco::comm::pack(host_sent_, report_.trimmed, fields, format_, bytes_of(host_payload_));
    } catch (const std::exception& e) {
      report_.failed = true;
      sidco::comm::pack_failure<T, Index>(e, size_, fields, format_, bytes_of(host_payload_));
    }
    upload(current);
    return payload_;
  }

  at::Tensor encode_failure(const std::string& message, const sidco::comm::wire_fields& fields) override {
    report_ = {};
    report_.failed = true;
    const c10::cuda::CUDAGuard guard(device_);
    SIDCO_CUDA(cudaEventSynchronize(uploaded_));
    sidco::comm::pack_failure<T, Index>(sidco::runtime_error(message), size_, fields, format_, bytes_of(host_payload_));
    upload(at::cuda::getCurrentCUDAStream(device_.index()).stream());
    return payload_;
  }

  void decode(const std::vector<at::Tensor>& payloads, const at::Tensor& out,
              const c10::optional<at::Tensor>& residual) override {
    const c10::cuda::CUDAGuard guard(device_);
    if (residual) check(*residual, "residual");
    const cudaStream_t current = at::cuda::getCurrentCUDAStream(device_.index()).stream();
    const std::size_t bytes = format_.bytes(), ranks = payloads.size();
    try {
      check(out, "out");
      if (ranks == 0) sidco::throw_error("payloads: none");
      for (const at::Tensor& p : payloads) {
        check_cuda_tensor("payload", p, device_);
        if (p.scalar_type() != at::kByte) sidco::throw_error("payload: dtype ", p.scalar_type(), " is not uint8");
        if (std::size_t(p.numel()) != bytes)
          sidco::throw_error("payload: ", p.numel(), " bytes, the format takes ", bytes);
      }
    } catch (...) {
      // A bad argument on this rank: what it sent still waits in its residual.
      if (residual) return_own_entries(reinterpret_cast<T*>(residual->data_ptr()), current);
      throw;
    }
    if (std::size_t(gathered_.numel()) < ranks * bytes)
      gathered_ = at::empty({std::int64_t(ranks * bytes)}, at::TensorOptions().dtype(at::kByte).pinned_memory(true));
    auto* host = reinterpret_cast<std::byte*>(gathered_.data_ptr());
    for (std::size_t r = 0; r < ranks; ++r)
      SIDCO_CUDA(cudaMemcpyAsync(host + r * bytes, payloads[r].data_ptr(), bytes, cudaMemcpyDeviceToHost, current));
    SIDCO_CUDA(cudaStreamSynchronize(current));
    std::vector<std::span<const std::byte>> views;
    for (std::size_t r = 0; r < ranks; ++r) views.emplace_back(host + r * bytes, bytes);
    try {
      report_.exchange = agreed(views);
    } catch (...) {
      // The exchange failed on every rank alike: what this rank sent waits in its residual
      // for the next step instead of being lost.
      if (residual) return_own_entries(reinterpret_cast<T*>(residual->data_ptr()), current);
      throw;
    }
    T* dense = reinterpret_cast<T*>(out.data_ptr());
    A* sum = nullptr;
    if constexpr (std::is_same_v<A, T>) {
      sum = dense;
    } else {
      if (std::size_t(accumulator_.numel()) != size_)
        accumulator_ = at::empty({std::int64_t(size_)}, at::TensorOptions().dtype(at::kFloat).device(device_));
      sum = reinterpret_cast<A*>(accumulator_.data_ptr());
    }
    SIDCO_CUDA(cudaMemsetAsync(sum, 0, size_ * sizeof(A), current));
    for (std::size_t r = 0; r < ranks; ++r) {
      const std::size_t count = std::size_t(sidco::comm::header_of(views[r]).count);
      if (count == 0) continue;
      const auto* base = static_cast<const std::byte*>(payloads[r].data_ptr());
      codec_kernels::accumulate<<<codec_kernels::grid(count), codec_kernels::block_threads, 0, current>>>(
          reinterpret_cast<const Index*>(base + format_.indices_offset()),
          reinterpret_cast<const T*>(base + format_.values_offset()), count, sum);
      SIDCO_CUDA(cudaGetLastError());
    }
    const bool average = sidco::comm::header_of(views[0]).op == std::uint8_t(sidco::comm::reduction::average);
    if (!std::is_same_v<A, T> || average) {
      codec_kernels::finish<<<codec_kernels::grid(size_), codec_kernels::block_threads, 0, current>>>(
          sum, size_, average, A(double(ranks)), dense);
      SIDCO_CUDA(cudaGetLastError());
    }
  }

  std::vector<std::byte> save_layer(std::size_t i) const override { return engine_->save(i); }
  void load_layer(std::size_t i, std::span<const std::byte> bytes) override { engine_->load(i, bytes); }
  const codec_report& report() const override { return report_; }

 private:
  void check(const at::Tensor& t, const char* what) const {
    check_cuda_tensor(what, t, device_);
    if (t.scalar_type() != settings_.dtype)
      sidco::throw_error(what, ": dtype ", t.scalar_type(), " is not the codec's ", settings_.dtype);
    if (std::size_t(t.numel()) != size_)
      sidco::throw_error(what, ": ", t.numel(), " values, the codec's layers add up to ", size_);
  }

  // The selection to host_sent_ (one host wait).
  void fetch_selection() {
    host_sent_.clear(size_);
    host_sent_.resize(sent_.size());
    if (!sent_.empty()) {
      SIDCO_CUDA(cudaMemcpyAsync(host_sent_.index_data(), sent_.indices().data(), sent_.size() * sizeof(Index),
                                 cudaMemcpyDeviceToHost, stream_));
      SIDCO_CUDA(cudaMemcpyAsync(host_sent_.value_data(), sent_.values().data(), sent_.size() * sizeof(T),
                                 cudaMemcpyDeviceToHost, stream_));
    }
    SIDCO_CUDA(cudaStreamSynchronize(stream_));
  }

  // Each layer's entries trimmed to its capacity, as on the CPU; what is trimmed goes back
  // into the device residual (when there is one). Returns how many were trimmed.
  std::size_t trim(T* residual) {
    if (host_sent_.size() <= plan_.total && settings_.layout.size() == 1) return 0;
    before_ = host_sent_;
    const std::size_t trimmed = sidco::comm::trim_to_capacity(host_sent_, settings_.layout, plan_, std::span<T>());
    if (trimmed == 0 || residual == nullptr) return trimmed;
    // Both ascending: what before_ has and host_sent_ lacks is what was trimmed.
    std::vector<Index> indices;
    std::vector<T> values;
    const auto kept = host_sent_.indices();
    std::size_t k = 0;
    for (std::size_t j = 0; j < before_.size(); ++j) {
      const Index i = before_.indices()[j];
      while (k < kept.size() && kept[k] < i) ++k;
      if (k < kept.size() && kept[k] == i) continue;
      indices.push_back(i);
      values.push_back(before_.values()[j]);
    }
    returned_.put(residual, indices.data(), values.data(), indices.size(), stream_);
    return trimmed;
  }

  // After a failed exchange: this rank's sent entries (still in host_payload_) back into
  // the residual, as sidco::comm::return_to_residual does on the host.
  void return_own_entries(T* residual, cudaStream_t stream) {
    const auto own = bytes_of(host_payload_);
    const auto h = sidco::comm::header_of(own);
    if (h.status != std::uint8_t(sidco::comm::wire_status::ok) || h.count == 0) return;
    returned_.put(residual, reinterpret_cast<const Index*>(own.data() + format_.indices_offset()),
                  reinterpret_cast<const T*>(own.data() + format_.values_offset()), std::size_t(h.count), stream);
  }

  // The payloads' agreement (sidco::comm::agree: throws the same error on every rank) and
  // what they carry.
  sidco::comm::exchange_report agreed(std::span<const std::span<const std::byte>> views) const {
    sidco::comm::agree<T, Index>(views, format_);
    sidco::comm::exchange_report report;
    report.ranks = int(views.size());
    report.bytes = format_.bytes();
    std::vector<Index> all;
    for (const auto& v : views) {
      const auto h = sidco::comm::header_of(v);
      report.entries += std::size_t(h.count);
      report.trimmed += std::size_t(h.trimmed);
      const std::size_t start = all.size();
      all.resize(start + std::size_t(h.count));
      std::memcpy(all.data() + start, v.data() + format_.indices_offset(), std::size_t(h.count) * sizeof(Index));
    }
    std::sort(all.begin(), all.end());
    report.distinct = std::size_t(std::unique(all.begin(), all.end()) - all.begin());
    return report;
  }

  // host_payload_ to payload_ on stream; uploaded_ marks when host_payload_ is free again.
  void upload(cudaStream_t stream) {
    SIDCO_CUDA(cudaMemcpyAsync(payload_.data_ptr(), host_payload_.data_ptr(), format_.bytes(), cudaMemcpyHostToDevice,
                               stream));
    SIDCO_CUDA(cudaEventRecord(uploaded_, stream));
  }

  codec_settings settings_;
  sidco::comm::wire_format format_;
  sidco::comm::capacity_plan plan_;
  at::Device device_;
  std::size_t size_;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t uploaded_ = nullptr;
  std::unique_ptr<event> ready_;
  std::unique_ptr<engine<T, Index, memory>> engine_;
  sidco::sparse_vector<T, Index, memory> sent_;
  sidco::sparse_vector<T, Index> host_sent_, before_;
  entry_writer<T, Index> returned_;
  at::Tensor host_payload_, payload_, gathered_, accumulator_;
  codec_report report_;
};

}  // namespace sidco_torch
