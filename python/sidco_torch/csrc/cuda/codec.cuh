// The hook's all-gather codec for a CUDA bucket. Compress runs on backend::cuda with the
// residual in device memory; the selection (about δ N entries) comes to the host, where the
// exchange core (sidco/comm/allgather/core.hpp) trims and packs it exactly as on the CPU,
// and the payload goes back to device memory, which NCCL gathers. Decode reads the gathered
// payloads on the host and runs the core's decode there (the same agreement and the same
// sum rule as the CPU's: the same bits, the same errors on every rank); the update's entries
// (at most the union of the selections) go to the device in one upload.
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
#include <sidco/backend/cuda/entries.cuh>
#include <sidco/backend/cuda/half.cuh>
#include <sidco/comm/allgather/core.hpp>
#include <sidco/comm/residual_sink.hpp>

#include "../binding.hpp"
#include "../classes.hpp"
#include "../engine.hpp"
#include "device_support.cuh"

namespace sidco_torch {

// to[indices[j]] = values[j] for entries held on the host (what goes back into a residual,
// an update's entries): sidco's one entry writer, on the codec's stream.
template <class T, class Index>
using entry_writer = sidco::backend::cuda_detail::entry_writer<T, Index>;

// H: the host type of T's bits, on which the exchange core runs (the CPU codec's code).
template <class T, class H = sidco::host_value_t<T>>
class cuda_codec final : public codec_impl {
  using Index = std::uint32_t;
  using memory = sidco::memory::device;
  static_assert(sizeof(H) == sizeof(T) && std::is_trivially_copyable_v<H> && std::is_trivially_copyable_v<T>);

 public:
  cuda_codec(const codec_settings& settings, const sidco::comm::wire_format&, const sidco::comm::capacity_plan&,
             const at::Device& device)
      : settings_(settings),
        core_(settings.layout, settings.capacity_density, settings.slack, settings.coding),
        device_(device) {
    const c10::cuda::CUDAGuard guard(device_);
    SIDCO_CUDA(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    ready_ = std::make_unique<event>();
    SIDCO_CUDA(cudaEventCreateWithFlags(&uploaded_, cudaEventDisableTiming));
    const cudaStream_t stream = stream_;
    engine_ = make_engine<T, Index, sidco::backend::cuda>(settings.method, settings.options, settings.layout,
                                                          layer_budget::per_layer,
                                                          [stream] { return sidco::backend::cuda(stream); });
    const auto bytes = std::int64_t(core_.format().bytes());
    host_payload_ = at::zeros({bytes}, at::TensorOptions().dtype(at::kByte).pinned_memory(true));
    payload_ = at::zeros({bytes}, at::TensorOptions().dtype(at::kByte).device(device_));
  }
  cuda_codec(const cuda_codec&) = delete;
  cuda_codec& operator=(const cuda_codec&) = delete;
  ~cuda_codec() override {
    // The buffers go back to torch's caching allocator, which reuses them for this stream's
    // next allocation at once: the stream's work is waited for first, so that a stream
    // created later at the same address never gets a buffer still being written.
    if (stream_) cudaStreamSynchronize(stream_);
    engine_.reset();
    sent_ = {};
    writer_.release();
    if (uploaded_) cudaEventDestroy(uploaded_);
    if (stream_) cudaStreamDestroy(stream_);
  }

  at::Tensor encode(const at::Tensor& gradient, const c10::optional<at::Tensor>& residual,
                    const sidco::comm::wire_fields& fields) override {
    report_ = {};
    const c10::cuda::CUDAGuard guard(device_);
    const cudaStream_t current = current_stream();
    SIDCO_CUDA(cudaEventSynchronize(uploaded_));  // the last upload has left host_payload_
    residual_ = nullptr;
    staged_.clear();
    // Whatever fails here fails on this rank alone: the payload carries the error to every
    // rank, and the residual is as it was (compress changes nothing when it throws; after it,
    // the core gives back what it cannot send).
    try {
      check(gradient, "bucket");
      T* r = nullptr;
      if (residual) {
        check(*residual, "residual");
        r = reinterpret_cast<T*>(residual->data_ptr());
      }
      ready_->order(current, stream_);
      report_.compress = engine_->compress({reinterpret_cast<const T*>(gradient.data_ptr()), core_.size()},
                                           settings_.density, r ? memory::view<T>{r, core_.size()} : memory::view<T>{},
                                           sent_);
      fetch_selection();
      residual_ = r;
    } catch (const std::exception& e) {
      report_.failed = true;
      core_.encode_failure(e, fields, bytes_of(host_payload_));
      upload(current);
      return payload_;
    }
    report_.trimmed = core_.encode(host_sent_, staged_, fields, bytes_of(host_payload_));
    report_.used_bytes = core_.used_bytes();
    report_.failed = sidco::comm::header_of(bytes_of(host_payload_)).status != std::uint8_t(sidco::comm::wire_status::ok);
    report_.compress.selected = host_sent_.size();
    report_.compress.density = double(host_sent_.size()) / double(core_.size());
    write_staged(stream_);
    upload(current);
    return payload_;
  }

  at::Tensor encode_failure(const std::string& message, const sidco::comm::wire_fields& fields) override {
    report_ = {};
    report_.failed = true;
    const c10::cuda::CUDAGuard guard(device_);
    SIDCO_CUDA(cudaEventSynchronize(uploaded_));
    residual_ = nullptr;
    core_.encode_failure(sidco::runtime_error(message), fields, bytes_of(host_payload_));
    upload(current_stream());
    return payload_;
  }

  // The payloads to the host, the core's decode there (the CPU codec's bits and errors),
  // the update's entries to the device. The residual given back into is encode's.
  void decode(const std::vector<at::Tensor>& payloads, const at::Tensor& out, const c10::optional<at::Tensor>&) override {
    const c10::cuda::CUDAGuard guard(device_);
    check(out, "out");
    const cudaStream_t current = current_stream();
    const std::size_t bytes = core_.format().bytes(), ranks = payloads.size();
    if (ranks == 0) sidco::throw_error("payloads: none");
    for (const at::Tensor& p : payloads) {
      check_cuda_tensor("payload", p, device_);
      if (p.scalar_type() != at::kByte) sidco::throw_error("payload: dtype ", p.scalar_type(), " is not uint8");
      if (std::size_t(p.numel()) != bytes) sidco::throw_error("payload: ", p.numel(), " bytes, the format takes ", bytes);
    }
    if (std::size_t(gathered_.numel()) < ranks * bytes)
      gathered_ = at::empty({std::int64_t(ranks * bytes)}, at::TensorOptions().dtype(at::kByte).pinned_memory(true));
    auto* host = reinterpret_cast<std::byte*>(gathered_.data_ptr());
    for (std::size_t r = 0; r < ranks; ++r)
      SIDCO_CUDA(cudaMemcpyAsync(host + r * bytes, payloads[r].data_ptr(), bytes, cudaMemcpyDeviceToHost, current));
    SIDCO_CUDA(cudaStreamSynchronize(current));
    std::vector<std::span<const std::byte>> views;
    for (std::size_t r = 0; r < ranks; ++r) views.emplace_back(host + r * bytes, bytes);
    staged_.clear();
    try {
      report_.exchange = core_.decode_into(views, update_indices_, update_values_, staged_);
    } catch (...) {
      write_staged(current);  // a failed exchange: what this rank sent back into its residual
      throw;
    }
    SIDCO_CUDA(cudaMemsetAsync(out.data_ptr(), 0, core_.size() * sizeof(T), current));
    writer_.write(reinterpret_cast<T*>(out.data_ptr()), update_indices_.data(), update_values_.data(),
                  update_indices_.size(), current);
  }

  std::vector<std::byte> save_layer(std::size_t i) const override { return engine_->save(i); }
  void load_layer(std::size_t i, std::span<const std::byte> bytes) override { engine_->load(i, bytes); }
  const codec_report& report() const override { return report_; }

 private:
  cudaStream_t current_stream() const { return at::cuda::getCurrentCUDAStream(device_.index()).stream(); }

  void check(const at::Tensor& t, const char* what) const {
    check_cuda_tensor(what, t, device_);
    if (t.scalar_type() != settings_.dtype)
      sidco::throw_error(what, ": dtype ", t.scalar_type(), " is not the codec's ", settings_.dtype);
    if (std::size_t(t.numel()) != core_.size())
      sidco::throw_error(what, ": ", t.numel(), " values, the codec's layers add up to ", core_.size());
  }

  // The selection to host_sent_ (one host wait).
  void fetch_selection() {
    host_sent_.clear(core_.size());
    host_sent_.resize(sent_.size());
    if (!sent_.empty()) {
      SIDCO_CUDA(cudaMemcpyAsync(host_sent_.index_data(), sent_.indices().data(), sent_.size() * sizeof(Index),
                                 cudaMemcpyDeviceToHost, stream_));
      SIDCO_CUDA(cudaMemcpyAsync(host_sent_.value_data(), sent_.values().data(), sent_.size() * sizeof(T),
                                 cudaMemcpyDeviceToHost, stream_));
    }
    SIDCO_CUDA(cudaStreamSynchronize(stream_));
  }

  // What the core gave back, into the device residual in one go.
  void write_staged(cudaStream_t stream) {
    writer_.write(residual_, staged_.indices.data(), staged_.values.data(), staged_.size(), stream);
    staged_.clear();
  }

  // host_payload_ to payload_ on stream; uploaded_ marks when host_payload_ is free again.
  void upload(cudaStream_t stream) {
    SIDCO_CUDA(cudaMemcpyAsync(payload_.data_ptr(), host_payload_.data_ptr(), core_.format().bytes(),
                               cudaMemcpyHostToDevice, stream));
    SIDCO_CUDA(cudaEventRecord(uploaded_, stream));
  }

  codec_settings settings_;
  sidco::comm::allgather_core<H, Index> core_;
  at::Device device_;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t uploaded_ = nullptr;
  std::unique_ptr<event> ready_;
  std::unique_ptr<engine<T, Index, memory>> engine_;
  sidco::sparse_vector<T, Index, memory> sent_;
  sidco::sparse_vector<H, Index> host_sent_;
  sidco::comm::staged_residual<H, Index> staged_;  // what goes back into the residual
  std::vector<Index> update_indices_;
  std::vector<H> update_values_;
  T* residual_ = nullptr;  // this step's, given to encode
  entry_writer<T, Index> writer_;
  at::Tensor host_payload_, payload_, gathered_;
  codec_report report_;
};

}  // namespace sidco_torch
