// The reduce-scatter exchange's codec for a CUDA bucket (cpu/reduce.cpp's, on the device).
// Compress runs on backend::cuda with the residual in device memory; its selection (about
// δ N entries) comes to the host, where the exchange core (sidco/comm/reduce/core.hpp) runs
// the CPU codec's code on the same bits; the device gets the blocks and the selection (which
// the process group moves), the update's entries and what goes back into the residual,
// never a dense vector's copy.
//
// Streams: compress runs on the codec's own stream, ordered after torch's current stream;
// uploads, downloads and the update run on the current stream (after the collectives, which
// the hook's waits and futures order). Each op waits for the host once or twice.
#pragma once

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include <sidco/backend/cuda.cuh>
#include <sidco/comm/reduce_scatter.hpp>

#include "../binding.hpp"
#include "../classes.hpp"
#include "../engine.hpp"
#include "../reduce_codec.hpp"
#include "codec.cuh"
#include "device_support.cuh"

namespace sidco_torch {

// H: the CPU codec's value type (the same host code, so the same bits).
template <class T, class Index = std::uint32_t, class H = sidco::host_value_t<T>>
class cuda_reduce_codec final : public reduce_codec_base<engine<T, Index, sidco::memory::device>, H, Index> {
  using memory = sidco::memory::device;
  using base = reduce_codec_base<engine<T, Index, memory>, H, Index>;
  using base::compress_, base::engine_, base::exchange_sent_, base::failed_, base::order_, base::settings_;
  static_assert(sizeof(H) == sizeof(T) && std::is_trivially_copyable_v<H> && std::is_trivially_copyable_v<T>);

 public:
  cuda_reduce_codec(const codec_settings& settings, const std::vector<std::int64_t>& order, std::size_t ranks,
                    std::size_t rank, const std::string& owner, const at::Device& device)
      : base(settings, order, ranks, rank, owner), device_(device) {
    const c10::cuda::CUDAGuard guard(device_);
    SIDCO_CUDA(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    ready_ = std::make_unique<event>();
    SIDCO_CUDA(cudaEventCreateWithFlags(&blocks_uploaded_, cudaEventDisableTiming));
    SIDCO_CUDA(cudaEventCreateWithFlags(&selection_uploaded_, cudaEventDisableTiming));
    const cudaStream_t stream = stream_;
    engine_ = make_engine<T, Index, sidco::backend::cuda>(settings.method, settings.options, settings.layout,
                                                          layer_budget::per_layer,
                                                          [stream] { return sidco::backend::cuda(stream); });
    const auto bytes = std::int64_t(this->block_bytes()), count = std::int64_t(ranks);
    const auto pinned = at::TensorOptions().dtype(at::kByte).pinned_memory(true);
    const auto on_device = at::TensorOptions().dtype(at::kByte).device(device_);
    host_blocks_ = at::zeros({bytes * count}, pinned);
    host_received_ = at::zeros({bytes * count}, pinned);
    host_selection_ = at::zeros({bytes}, pinned);
    host_selections_ = at::zeros({bytes * count}, pinned);
    blocks_ = at::zeros({bytes * count}, on_device);
    selection_ = at::zeros({bytes}, on_device);
  }
  cuda_reduce_codec(const cuda_reduce_codec&) = delete;
  cuda_reduce_codec& operator=(const cuda_reduce_codec&) = delete;
  ~cuda_reduce_codec() override {
    // As cuda_codec's: the stream's work is waited for before its buffers go back to torch.
    if (stream_) cudaStreamSynchronize(stream_);
    engine_.reset();
    sent_ = {};
    writer_.release();
    if (blocks_uploaded_) cudaEventDestroy(blocks_uploaded_);
    if (selection_uploaded_) cudaEventDestroy(selection_uploaded_);
    if (stream_) cudaStreamDestroy(stream_);
  }

  at::Tensor encode(const at::Tensor& gradient, const c10::optional<at::Tensor>& residual,
                    const sidco::comm::wire_fields& fields) override {
    compress_ = {};
    failed_ = false;
    const c10::cuda::CUDAGuard guard(device_);
    const cudaStream_t current = current_stream();
    SIDCO_CUDA(cudaEventSynchronize(blocks_uploaded_));  // the last upload has left host_blocks_
    residual_ = nullptr;
    staged_.clear();
    // What fails here fails on this rank alone: the blocks carry the error to every rank,
    // and the residual is as it was (compress changes nothing when it throws).
    try {
      check(gradient, "bucket");
      T* r = nullptr;
      if (residual) {
        check(*residual, "residual");
        r = reinterpret_cast<T*>(residual->data_ptr());
      }
      ready_->order(current, stream_);
      compress_ = engine_->compress({reinterpret_cast<const T*>(gradient.data_ptr()), this->size()}, settings_.density,
                                    r ? memory::view<T>{r, this->size()} : memory::view<T>{}, sent_);
      fetch_selection();
      residual_ = r;
    } catch (const std::exception& e) {
      failed_ = true;
      this->with_core([&](auto& core) { core.pack_failure(e, fields, bytes_of(host_blocks_)); });
      upload(host_blocks_, blocks_, current, blocks_uploaded_);
      return blocks_;
    }
    this->to_exchange(host_sent_);
    bucket_sink<sidco::comm::staged_residual<H, Index>> sink{order_, staged_};
    this->with_core([&](auto& core) { failed_ = !core.pack(exchange_sent_, sink, fields, bytes_of(host_blocks_)); });
    write_staged(stream_);
    upload(host_blocks_, blocks_, current, blocks_uploaded_);
    return blocks_;
  }

  at::Tensor encode_failure(const std::string& message, const sidco::comm::wire_fields& fields) override {
    compress_ = {};
    failed_ = true;
    const c10::cuda::CUDAGuard guard(device_);
    SIDCO_CUDA(cudaEventSynchronize(blocks_uploaded_));
    residual_ = nullptr;
    this->with_core(
        [&](auto& core) { core.pack_failure(sidco::runtime_error(message), fields, bytes_of(host_blocks_)); });
    upload(host_blocks_, blocks_, current_stream(), blocks_uploaded_);
    return blocks_;
  }

  at::Tensor select(const at::Tensor& received, const at::Tensor& out, const c10::optional<at::Tensor>& residual) override {
    const c10::cuda::CUDAGuard guard(device_);
    check_cuda_tensor("received", received, device_);
    const std::size_t bytes = this->block_bytes(), ranks = this->ranks();
    if (received.scalar_type() != at::kByte || std::size_t(received.numel()) != bytes * ranks)
      sidco::throw_error("received: ", received.numel(), " ", received.scalar_type(), " values, the exchange takes ",
                         bytes * ranks, " bytes");
    const cudaStream_t current = current_stream();
    SIDCO_CUDA(cudaEventSynchronize(selection_uploaded_));
    download(received, host_received_, 0, bytes * ranks, current);
    SIDCO_CUDA(cudaStreamSynchronize(current));
    const auto all = bytes_of(host_received_);
    std::vector<std::span<const std::byte>> views;
    for (std::size_t r = 0; r < ranks; ++r) views.push_back(all.subspan(r * bytes, bytes));
    this->select_or_refuse(views, bytes_of(host_selection_), out, residual);
    upload(host_selection_, selection_, current, selection_uploaded_);
    return selection_;
  }

  // out and the residual (encode's) were checked by select, before round 2.
  void decode(const std::vector<at::Tensor>& selections, const at::Tensor& out, const c10::optional<at::Tensor>&) override {
    const c10::cuda::CUDAGuard guard(device_);
    const cudaStream_t current = current_stream();
    const std::size_t bytes = this->block_bytes(), ranks = this->ranks();
    try {
      if (selections.size() != ranks)
        sidco::throw_error("selections: ", selections.size(), " tensors, the exchange has ", ranks, " ranks");
      for (const at::Tensor& p : selections) {
        check_cuda_tensor("selection", p, device_);
        if (p.scalar_type() != at::kByte) sidco::throw_error("selection: dtype ", p.scalar_type(), " is not uint8");
        if (std::size_t(p.numel()) != bytes)
          sidco::throw_error("selection: ", p.numel(), " bytes, the exchange's format takes ", bytes);
      }
    } catch (...) {
      this->with_core([](auto& core) { core.abandon(); });  // a caller's mistake: the next step still works
      throw;
    }
    for (std::size_t j = 0; j < selections.size(); ++j)
      download(selections[j], host_selections_, j * bytes, bytes, current);
    SIDCO_CUDA(cudaStreamSynchronize(current));
    const auto all = bytes_of(host_selections_);
    std::vector<std::span<const std::byte>> views;
    for (std::size_t j = 0; j < ranks; ++j) views.push_back(all.subspan(j * bytes, bytes));
    bucket_sink<sidco::comm::staged_residual<H, Index>> sink{order_, staged_};
    try {
      this->with_core([&](auto& core) {
        core.apply(views, sink);
        update_indices_.clear();
        for (const Index i : core.global_selection()) update_indices_.push_back(Index(order_.to_bucket(std::size_t(i))));
        update_values_.assign(core.updates().begin(), core.updates().end());
      });
    } catch (...) {
      write_staged(current);  // every rank raises this: every entry this rank sent goes back
      throw;
    }
    write_staged(current);
    SIDCO_CUDA(cudaMemsetAsync(out.data_ptr(), 0, this->size() * sizeof(T), current));
    writer_.write(reinterpret_cast<T*>(out.data_ptr()), update_indices_.data(), update_values_.data(),
                  update_indices_.size(), current);
  }

  // The compact coding's transport (the hook's all-to-all at split sizes): framed on the
  // host, as the CPU codec frames, so the messages have its bytes; the payloads come down and
  // the messages go up (O(k) bytes each way), on the current stream.
  std::vector<at::Tensor> frames(const at::Tensor& payloads, bool selection) override {
    const c10::cuda::CUDAGuard guard(device_);
    check_cuda_tensor("payloads", payloads, device_);
    const std::size_t count = this->payload_count(payloads, selection);
    const cudaStream_t current = current_stream();
    const std::span<std::byte> host = staging(this->block_bytes() * count);
    download(payloads, host_frames_, 0, host.size(), current);
    SIDCO_CUDA(cudaStreamSynchronize(current));
    std::vector<std::byte> out;
    const std::vector<std::int64_t> sizes = this->frame_payloads(host, count, selection, out);
    at::Tensor messages = at::empty({std::int64_t(out.size())}, at::TensorOptions().dtype(at::kByte).device(device_));
    // From pageable memory: the call returns once out is copied out, so out may go.
    if (!out.empty())
      SIDCO_CUDA(cudaMemcpyAsync(messages.data_ptr(), out.data(), out.size(), cudaMemcpyHostToDevice, current));
    return {messages, at::tensor(sizes, at::kLong).to(device_)};
  }

  // The messages come down, are read on the host into the payloads they carry (a message
  // that cannot be read becomes a failure naming its sender, as on the CPU), which go up
  // into slots.
  void unframe(const at::Tensor& bytes, const std::vector<std::int64_t>& sizes, const std::vector<at::Tensor>& slots,
               bool selection) override {
    const c10::cuda::CUDAGuard guard(device_);
    check_cuda_tensor("frames", bytes, device_);
    if (bytes.scalar_type() != at::kByte) sidco::throw_error("frames: dtype ", bytes.scalar_type(), " is not uint8");
    this->check_unframe(sizes, slots.size());
    for (std::size_t r = 0; r < slots.size(); ++r) {
      check_cuda_tensor("slot", slots[r], device_);
      this->check_slot_bytes(slots[r], r);
    }
    const std::size_t payload = this->block_bytes();
    const cudaStream_t current = current_stream();
    const std::span<std::byte> host = staging(std::size_t(bytes.numel()));
    download(bytes, host_frames_, 0, host.size(), current);
    SIDCO_CUDA(cudaStreamSynchronize(current));
    // Pinned rooms for the payloads (selections: decode's; blocks: select's), free between ops.
    const at::Tensor& rooms = selection ? host_selections_ : host_received_;
    const std::span<std::byte> all = bytes_of(rooms);
    this->unframe_payloads(host, sizes, selection, [&](std::size_t r) { return all.subspan(r * payload, payload); });
    for (std::size_t r = 0; r < slots.size(); ++r)
      SIDCO_CUDA(cudaMemcpyAsync(slots[r].data_ptr(), all.data() + r * payload, payload, cudaMemcpyHostToDevice,
                                 current));
    SIDCO_CUDA(cudaStreamSynchronize(current));  // the rooms are free again when this returns
  }

 private:
  cudaStream_t current_stream() const { return at::cuda::getCurrentCUDAStream(device_.index()).stream(); }

  void check(const at::Tensor& t, const char* what) const override {
    check_cuda_tensor(what, t, device_);
    if (t.scalar_type() != settings_.dtype)
      sidco::throw_error(what, ": dtype ", t.scalar_type(), " is not the codec's ", settings_.dtype);
    if (std::size_t(t.numel()) != this->size())
      sidco::throw_error(what, ": ", t.numel(), " values, the codec's layers add up to ", this->size());
  }

  // What the core gave back, into the device residual in one go.
  void write_staged(cudaStream_t stream) {
    writer_.write(residual_, staged_.indices.data(), staged_.values.data(), staged_.size(), stream);
    staged_.clear();
  }

  // The compressor's selection to host_sent_ (one host wait).
  void fetch_selection() {
    host_sent_.clear(this->size());
    host_sent_.resize(sent_.size());
    if (!sent_.empty()) {
      SIDCO_CUDA(cudaMemcpyAsync(host_sent_.index_data(), sent_.indices().data(), sent_.size() * sizeof(Index),
                                 cudaMemcpyDeviceToHost, stream_));
      SIDCO_CUDA(cudaMemcpyAsync(host_sent_.value_data(), sent_.values().data(), sent_.size() * sizeof(H),
                                 cudaMemcpyDeviceToHost, stream_));
    }
    SIDCO_CUDA(cudaStreamSynchronize(stream_));
  }

  // host_frames_'s first bytes (pinned), grown as needed; no copy uses it between ops.
  std::span<std::byte> staging(std::size_t bytes) {
    if (!host_frames_.defined() || std::size_t(host_frames_.numel()) < bytes)
      host_frames_ = at::empty({std::int64_t(std::max<std::size_t>(bytes, 1))},
                               at::TensorOptions().dtype(at::kByte).pinned_memory(true));
    return bytes_of(host_frames_).first(bytes);
  }

  // from (device, bytes long) into host (pinned) at offset, on stream.
  static void download(const at::Tensor& from, const at::Tensor& host, std::size_t offset, std::size_t bytes,
                       cudaStream_t stream) {
    SIDCO_CUDA(cudaMemcpyAsync(static_cast<std::byte*>(host.data_ptr()) + offset, from.data_ptr(), bytes,
                               cudaMemcpyDeviceToHost, stream));
  }

  // host (pinned) to device on stream; uploaded marks when host is free again.
  static void upload(const at::Tensor& host, const at::Tensor& device, cudaStream_t stream, cudaEvent_t uploaded) {
    SIDCO_CUDA(cudaMemcpyAsync(device.data_ptr(), host.data_ptr(), std::size_t(host.numel()), cudaMemcpyHostToDevice,
                               stream));
    SIDCO_CUDA(cudaEventRecord(uploaded, stream));
  }

  at::Device device_;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t blocks_uploaded_ = nullptr, selection_uploaded_ = nullptr;
  std::unique_ptr<event> ready_;
  sidco::sparse_vector<T, Index, memory> sent_;
  sidco::sparse_vector<H, Index> host_sent_;        // the compressor's selection, in the bucket's order
  sidco::comm::staged_residual<H, Index> staged_;  // what goes back into the residual (bucket indices)
  std::vector<Index> update_indices_;               // the update's entries (bucket indices)
  std::vector<H> update_values_;
  T* residual_ = nullptr;  // this step's, given to encode
  entry_writer<T, Index> writer_;
  at::Tensor host_blocks_, host_received_, host_selection_, host_selections_, blocks_, selection_;
  at::Tensor host_frames_;  // the compact coding's messages, staged (frames, unframe)
};

}  // namespace sidco_torch
