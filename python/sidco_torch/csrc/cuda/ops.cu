// The ops' CUDA kernels (dispatch key CUDA): compress through a compressor of the tensor's
// element type (kernels.cuh, on sidco's backend::cuda), the hook's encode and decode
// (codec.cuh) and its reduce-scatter exchange's (reduce_codec.cuh), scatter-add and
// decompress through ATen. Built with nvcc when the torch found has CUDA; registered when
// the library loads, with the factories Compressor, Codec and ReduceCodec use for CUDA
// devices. The element types' classes are compiled in float32.cu, float64.cu, float16.cu and
// bfloat16.cu, side by side; this file only picks one by dtype.

#include <torch/library.h>

#include <ATen/ATen.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include <sidco/memory/device_allocator.cuh>

#include "../binding.hpp"
#include "../classes.hpp"
#include "../reduce_codec.hpp"
#include "../registration.hpp"
#include "device_support.cuh"
#include "factories.hpp"

namespace sidco_torch {
namespace {

std::tuple<at::Tensor, at::Tensor> compress(const at::Tensor& given, double density,
                                            std::vector<std::int64_t> layer_sizes,
                                            const c10::optional<at::Tensor>& residual,
                                            const c10::intrusive_ptr<Compressor>& compressor) {
  return translated([&] {
    // Read only: a view (a transposed weight's gradient) is compressed in its flattened order.
    const at::Tensor gradient = given.contiguous();
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
      return cuda_side<typename decltype(tag)::type>::compressor(method, options, device);
    });
  });
}

std::unique_ptr<codec_impl> make_cuda_codec(const codec_settings& settings, const sidco::comm::wire_format& format,
                                            const sidco::comm::capacity_plan& plan, const at::Device& device) {
  return with_device_type(settings.dtype, "bucket", [&](auto tag) -> std::unique_ptr<codec_impl> {
    return cuda_side<typename decltype(tag)::type>::codec(settings, format, plan, device);
  });
}

std::unique_ptr<reduce_codec_impl> make_cuda_reduce_codec(const codec_settings& settings,
                                                          const std::vector<std::int64_t>& order, std::size_t ranks,
                                                          std::size_t rank, const std::string& owner,
                                                          const at::Device& device) {
  return with_device_type(settings.dtype, "bucket", [&](auto tag) -> std::unique_ptr<reduce_codec_impl> {
    return cuda_side<typename decltype(tag)::type>::reduce_codec(settings, order, ranks, rank, owner, device);
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
