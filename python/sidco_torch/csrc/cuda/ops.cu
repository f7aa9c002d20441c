// The ops' CUDA kernels (dispatch key CUDA): compress on sidco's backend::cuda, the hook's
// encode and decode (codec.cuh) and its reduce-scatter exchange's (reduce_codec.cuh),
// scatter-add and decompress through ATen. Built with nvcc when the torch found has CUDA;
// registered when the library loads, with the factories Compressor, Codec and ReduceCodec
// use for CUDA devices.
//
// Streams: each compressor runs on a stream of its own and is ordered against torch's
// current stream at every call by events (the current stream's work before compress, the
// outputs' copies after it, and the next call after those copies), so a gradient written on
// any stream just before the call is what gets compressed, and torch's caching allocator
// sees every output tensor used on the stream it was allocated for.

#include <torch/library.h>

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <array>
#include <cstdint>
#include <limits>
#include <memory>
#include <tuple>
#include <vector>

#include <sidco/backend/cuda.cuh>

#include "../binding.hpp"
#include "../classes.hpp"
#include "../engine.hpp"
#include "../registration.hpp"
#include "../reduce_codec.hpp"
#include "codec.cuh"
#include "device_support.cuh"
#include "reduce_codec.cuh"

namespace sidco_torch {
namespace {

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

std::tuple<at::Tensor, at::Tensor> compress(const at::Tensor& gradient, double density,
                                            std::vector<std::int64_t> layer_sizes,
                                            const c10::optional<at::Tensor>& residual,
                                            const c10::intrusive_ptr<Compressor>& compressor) {
  return translated([&] {
    check_cuda_tensor("gradient", gradient, gradient.device());
    if (residual) {
      check_cuda_tensor("residual", *residual, gradient.device());
      if (residual->scalar_type() != gradient.scalar_type())
        sidco::throw_error("residual: dtype ", residual->scalar_type(), " differs from the gradient's ",
                           gradient.scalar_type());
      sidco::check::same_size("residual", std::size_t(residual->numel()), std::size_t(gradient.numel()));
    }
    return compressor->compress(gradient, density, layer_sizes, residual);
  });
}

// dense[indices[j]] += scale values[j], every index checked first (one host wait). Unlike
// the CPU op, scale × value and the add round separately, and repeated indices accumulate
// in no fixed order (index_put_ with accumulate).
at::Tensor scatter_add_(at::Tensor dense, const at::Tensor& indices, const at::Tensor& values, double scale) {
  return translated([&] {
    check_cuda_tensor("dense", dense, dense.device());
    check_cuda_tensor("indices", indices, dense.device());
    check_cuda_tensor("values", values, dense.device());
    if (indices.scalar_type() != at::kLong) sidco::throw_error("indices: dtype ", indices.scalar_type(), " is not int64");
    if (values.scalar_type() != dense.scalar_type())
      sidco::throw_error("values: dtype ", values.scalar_type(), " differs from dense's ", dense.scalar_type());
    if (indices.numel() != values.numel())
      sidco::throw_error("indices: ", indices.numel(), " entries, values: ", values.numel());
    if (indices.numel() == 0) return dense;
    const c10::cuda::CUDAGuard guard(dense.device());
    const auto range = at::stack({indices.min(), indices.max()}).cpu();
    const std::int64_t low = range[0].item<std::int64_t>(), high = range[1].item<std::int64_t>();
    if (low < 0 || high >= dense.numel())
      sidco::throw_error("sparse tensor: index ", low < 0 ? low : high, " is out of range for dense size ",
                         dense.numel());
    dense.index_put_({indices}, scale == 1.0 ? values : values * scale, /*accumulate=*/true);
    return dense;
  });
}

at::Tensor decompress(const at::Tensor& indices, const at::Tensor& values, std::int64_t size) {
  if (size < 0) TORCH_CHECK_VALUE(false, "sidco: size = ", size, " is negative");
  return scatter_add_(at::zeros({size}, values.options()), indices, values, 1.0);
}

std::unique_ptr<compressor_impl> make_cuda_compressor(const std::string& method, const sidco::methods::options& options,
                                                      const at::Device& device) {
  return std::make_unique<compressors_by_type>([method, options, device](at::ScalarType dtype) {
    return with_device_type(dtype, "gradient", [&](auto tag) -> std::unique_ptr<compressor_impl> {
      return std::make_unique<cuda_compressor<typename decltype(tag)::type>>(method, options, device);
    });
  });
}

std::unique_ptr<codec_impl> make_cuda_codec(const codec_settings& settings, const sidco::comm::wire_format& format,
                                            const sidco::comm::capacity_plan& plan, const at::Device& device) {
  return with_device_type(settings.dtype, "bucket", [&](auto tag) -> std::unique_ptr<codec_impl> {
    return std::make_unique<cuda_codec<typename decltype(tag)::type>>(settings, format, plan, device);
  });
}

std::unique_ptr<reduce_codec_impl> make_cuda_reduce_codec(const codec_settings& settings,
                                                          const std::vector<std::int64_t>& order, std::size_t ranks,
                                                          std::size_t rank, const std::string& owner,
                                                          const at::Device& device) {
  return with_device_type(settings.dtype, "bucket", [&](auto tag) -> std::unique_ptr<reduce_codec_impl> {
    return std::make_unique<cuda_reduce_codec<typename decltype(tag)::type>>(settings, order, ranks, rank, owner,
                                                                             device);
  });
}

// The ops' device scratch (every stream-ordered sidco buffer) from torch's caching allocator
// on the compressor's stream: torch.cuda.memory_allocated() counts it, running out is
// torch's OutOfMemoryError, and no cudaMallocAsync pool grows beside torch's. Buffers are
// allocated under the op's device guard (the allocator takes the current device).
const sidco::memory::device_allocator torch_caching_allocator{
    [](std::size_t bytes, cudaStream_t stream) -> void* {
      return c10::cuda::CUDACachingAllocator::raw_alloc_with_stream(bytes, stream);
    },
    [](void* storage, cudaStream_t) noexcept {
      try {
        c10::cuda::CUDACachingAllocator::raw_delete(storage);
      } catch (...) {  // a destructor's release: nothing to report to
      }
    }};

// Compressor::on, Codec::on and ReduceCodec find the CUDA sides through these, set when the
// library loads.
const bool registered = (register_cuda_compressor(&make_cuda_compressor), register_cuda_codec(&make_cuda_codec),
                         register_cuda_reduce_codec(&make_cuda_reduce_codec),
                         sidco::memory::install_device_allocator(torch_caching_allocator), true);

}  // namespace

void register_cuda_kernels(torch::Library& m) {
  const auto cuda = [](auto kernel) { return torch::dispatch(c10::DispatchKey::CUDA, kernel); };
  m.impl("compress", cuda(compress));
  m.impl("encode", cuda(codec_encode));
  m.impl("encode_failure", cuda(codec_encode_failure));
  m.impl("decode", cuda(codec_decode));
  m.impl("scatter_add_", cuda(scatter_add_));
  m.impl("decompress", cuda(decompress));
  m.impl("reduce_encode", cuda(reduce_encode));
  m.impl("reduce_encode_failure", cuda(reduce_encode_failure));
  m.impl("reduce_select", cuda(reduce_select));
  m.impl("reduce_decode", cuda(reduce_decode));
}

}  // namespace sidco_torch
