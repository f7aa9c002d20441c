// The CUDA side of the classes for one element type: a tensor's compressor (below), a
// bucket's all-gather codec (codec.cuh) and its reduce-scatter codec (reduce_codec.cuh), all on
// sidco's backend::cuda. Each element type is compiled in a file of its own (float32.cu, ...),
// which instantiates cuda_side<T> (factories.hpp).
//
// Streams: each compressor runs on a stream of its own and is ordered against torch's
// current stream at every call by events (the current stream's work before compress, the
// outputs' copies after it, and the next call after those copies), so a gradient written on
// any stream just before the call is what gets compressed, and torch's caching allocator
// sees every output tensor used on the stream it was allocated for.
#pragma once

// Before ATen: nvcc needs c10::IValue complete where ATen's lists use it.
#include <torch/custom_class.h>

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include <sidco/backend/cuda.cuh>

#include "../binding.hpp"
#include "../classes.hpp"
#include "../engine.hpp"
#include "codec.cuh"
#include "device_support.cuh"
#include "factories.hpp"
#include "reduce_codec.cuh"

namespace sidco_torch {

using index32 = std::uint32_t;

// One element type's compressor on one device: a whole-tensor engine and the last per-layer
// one, on the compressor's own stream.
template <class T>
class cuda_compressor final : public compressor_impl {
 public:
  using memory = sidco::memory::device;

  cuda_compressor(const std::string& method, const sidco::methods::options& options, at::Device device)
      : method_(method), options_(options), device_(device) {
    const c10::cuda::CUDAGuard guard(device_);
    SIDCO_CUDA(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    ready_ = std::make_unique<event>();
    done_ = std::make_unique<event>();
    consumed_ = std::make_unique<event>();
    whole_ = make_on_stream({});
  }
  cuda_compressor(const cuda_compressor&) = delete;
  cuda_compressor& operator=(const cuda_compressor&) = delete;
  ~cuda_compressor() override {
    // The buffers go back to torch's caching allocator, which reuses them for this stream's
    // next allocation at once: the stream's work is waited for first, so that a stream
    // created later at the same address never gets a buffer still being written.
    if (stream_) cudaStreamSynchronize(stream_);
    whole_.reset();
    layered_.reset();
    out_ = {};
    if (stream_) cudaStreamDestroy(stream_);
  }

  std::tuple<at::Tensor, at::Tensor> compress(const at::Tensor& gradient, double density,
                                              const std::vector<std::int64_t>& layers,
                                              const c10::optional<at::Tensor>& residual) override {
    const c10::cuda::CUDAGuard guard(device_);
    const std::size_t n = std::size_t(gradient.numel());
    if (n > std::size_t(std::numeric_limits<index32>::max()) + 1)
      sidco::throw_error("gradient: ", n, " values; sidco_torch addresses 2^32 (32-bit indices)");
    auto* e = whole_.get();
    if (!layers.empty()) {
      if (!layered_ || layers != layer_sizes_) {
        layered_ = make_on_stream(layout_of(layers, n));
        layer_sizes_ = layers;
      }
      e = layered_.get();
    }
    const cudaStream_t current = at::cuda::getCurrentCUDAStream(device_.index()).stream();
    // Our stream waits for the gradient and the residual as the current stream leaves them.
    ready_->order(current, stream_);
    const auto* g = reinterpret_cast<const T*>(gradient.data_ptr());
    typename engine<T, index32, memory>::residual_view r{};
    if (residual) r = {reinterpret_cast<T*>(residual->data_ptr()), n};
    last_ = e->compress({g, n}, density, r, out_);
    // The outputs are copied on the current stream, after compress; the next call waits
    // for those copies before it writes out_ again.
    done_->order(stream_, current);
    const auto count = std::int64_t(out_.size());
    const auto on_device = at::TensorOptions().device(device_);
    auto indices = at::from_blob(const_cast<index32*>(out_.indices().data()), {count}, on_device.dtype(at::kInt))
                       .to(at::kLong);  // reads as signed: indices < 2^31 here; see below
    if (n > std::size_t(std::numeric_limits<std::int32_t>::max()))
      indices = indices.bitwise_and(std::int64_t(0xffffffff));  // undo the sign of indices >= 2^31
    auto values = at::from_blob(const_cast<T*>(out_.values().data()), {count}, on_device.dtype(gradient.scalar_type()))
                      .clone();
    consumed_->order(current, stream_);
    return {indices, values};
  }

  const sidco::compress_report& report() const override { return last_; }
  // The compressors' state lives on the host; the stream is waited for so that no call in
  // flight still changes it.
  void save(std::vector<saved_engine>& into) const override {
    SIDCO_CUDA(cudaStreamSynchronize(stream_));
    save_engine(*whole_, {}, into);
    if (layered_) save_engine(*layered_, layer_sizes_, into);
  }
  void load(const saved_engine& saved) override {
    const c10::cuda::CUDAGuard guard(device_);
    SIDCO_CUDA(cudaStreamSynchronize(stream_));
    if (saved.layer_sizes.empty()) return load_engine(*whole_, saved);
    auto layered = make_on_stream(saved_layout(saved));
    load_engine(*layered, saved);
    layered_ = std::move(layered);
    layer_sizes_ = saved.layer_sizes;
  }

 private:
  std::unique_ptr<engine<T, index32, memory>> make_on_stream(std::vector<sidco::segment> layout) {
    const cudaStream_t stream = stream_;
    return make_engine<T, index32, sidco::backend::cuda>(method_, options_, std::move(layout), layer_budget::shared,
                                                         [stream] { return sidco::backend::cuda(stream); });
  }

  std::string method_;
  sidco::methods::options options_;
  at::Device device_;
  cudaStream_t stream_ = nullptr;
  std::unique_ptr<event> ready_, done_, consumed_;
  std::unique_ptr<engine<T, index32, memory>> whole_, layered_;
  std::vector<std::int64_t> layer_sizes_;
  sidco::sparse_vector<T, index32, memory> out_;
  sidco::compress_report last_;
};

template <class T>
std::unique_ptr<compressor_impl> cuda_side<T>::compressor(const std::string& method,
                                                          const sidco::methods::options& options,
                                                          const at::Device& device) {
  return std::make_unique<cuda_compressor<T>>(method, options, device);
}

template <class T>
std::unique_ptr<codec_impl> cuda_side<T>::codec(const codec_settings& settings, const sidco::comm::wire_format& format,
                                                const sidco::comm::capacity_plan& plan, const at::Device& device) {
  return std::make_unique<cuda_codec<T>>(settings, format, plan, device);
}

template <class T>
std::unique_ptr<reduce_codec_impl> cuda_side<T>::reduce_codec(const codec_settings& settings,
                                                              const std::vector<std::int64_t>& order,
                                                              std::size_t ranks, std::size_t rank,
                                                              const std::string& owner, const at::Device& device) {
  return std::make_unique<cuda_reduce_codec<T>>(settings, order, ranks, rank, owner, device);
}

}  // namespace sidco_torch
