// The ops' CPU kernels (dispatch key CPU), on sidco's backend::cpu: compress, encode and
// decode of a bucket (library.cpp: the Codec picks its CPU side), scatter-add and decompress.
#include <torch/library.h>

#include <ATen/ATen.h>

#include <array>
#include <cstdint>
#include <cstring>
#include <exception>
#include <memory>
#include <optional>
#include <span>
#include <tuple>
#include <vector>

#include <sidco/backend/host/scatter_add.hpp>
#include <sidco/comm/capacity.hpp>
#include <sidco/comm/wire.hpp>

#include "../binding.hpp"
#include "../classes.hpp"
#include "../reduce_codec.hpp"
#include "../registration.hpp"

namespace sidco_torch {
namespace {

std::tuple<at::Tensor, at::Tensor> compress(const at::Tensor& given, double density,
                                            std::vector<std::int64_t> layer_sizes,
                                            const c10::optional<at::Tensor>& residual,
                                            const c10::intrusive_ptr<Compressor>& compressor) {
  return translated([&] {
    // Read only: a view (a transposed weight's gradient) is compressed in its flattened order.
    const at::Tensor gradient = given.contiguous();
    check_cpu_tensor("gradient", gradient);
    if (residual) {
      check_cpu_tensor("residual", *residual);
      if (residual->scalar_type() != gradient.scalar_type())
        sidco::throw_error("residual: dtype ", residual->scalar_type(), " differs from the gradient's ",
                            gradient.scalar_type());
      sidco::check::same_size("residual", std::size_t(residual->numel()), std::size_t(gradient.numel()));
    }
    return compressor->compress(gradient, density, layer_sizes, residual);
  });
}

// dense[indices[j]] += scale values[j] (rounded once), every index checked first.
at::Tensor scatter_add_(at::Tensor dense, const at::Tensor& indices, const at::Tensor& values, double scale) {
  return translated([&] {
    check_cpu_tensor("dense", dense);
    if (indices.scalar_type() != at::kLong) sidco::throw_error("indices: dtype ", indices.scalar_type(), " is not int64");
    if (values.scalar_type() != dense.scalar_type())
      sidco::throw_error("values: dtype ", values.scalar_type(), " differs from dense's ", dense.scalar_type());
    if (indices.numel() != values.numel())
      sidco::throw_error("indices: ", indices.numel(), " entries, values: ", values.numel());
    const auto idx = indices.contiguous();
    const auto val = values.contiguous();
    const std::int64_t* i = idx.data_ptr<std::int64_t>();
    const std::size_t n = std::size_t(idx.numel());
    with_value_type(dense.scalar_type(), "dense", [&](auto tag) {
      using T = typename decltype(tag)::type;
      sidco::backend::host::check_scatter("sparse tensor", std::size_t(dense.numel()), i, n, std::size_t(dense.numel()));
      sidco::backend::host::add_checked(i, span_of<const T>(val).data(), n, span_of<T>(dense).data(), T(scale));
      return 0;
    });
    return dense;
  });
}

at::Tensor decompress(const at::Tensor& indices, const at::Tensor& values, std::int64_t size) {
  if (size < 0) TORCH_CHECK_VALUE(false, "sidco: size = ", size, " is negative");
  return scatter_add_(at::zeros({size}, values.options()), indices, values, 1.0);
}

}  // namespace

std::unique_ptr<codec_impl> make_cpu_codec(const codec_settings& settings, const sidco::comm::wire_format& format,
                                           const sidco::comm::capacity_plan& plan) {
  return with_value_type(settings.dtype, "bucket", [&](auto tag) {
    return make_cpu_codec_of<typename decltype(tag)::type>(settings, format, plan);
  });
}

std::unique_ptr<compressor_impl> make_cpu_compressor(const std::string& method, const sidco::methods::options& options) {
  return std::make_unique<compressors_by_type>([method, options](at::ScalarType dtype) {
    return with_value_type(dtype, "gradient", [&](auto tag) {
      return make_cpu_compressor_of<typename decltype(tag)::type>(method, options);
    });
  });
}

void register_cpu_kernels(torch::Library& m) {
  const auto cpu = [](auto kernel) { return torch::dispatch(c10::DispatchKey::CPU, kernel); };
  m.impl("compress", cpu(compress));
  m.impl("encode", cpu(codec_encode));
  m.impl("encode_failure", cpu(codec_encode_failure));
  m.impl("decode", cpu(codec_decode));
  m.impl("scatter_add_", cpu(scatter_add_));
  m.impl("decompress", cpu(decompress));
  m.impl("reduce_encode", cpu(reduce_encode));
  m.impl("reduce_encode_failure", cpu(reduce_encode_failure));
  m.impl("reduce_select", cpu(reduce_select));
  m.impl("reduce_decode", cpu(reduce_decode));
}

}  // namespace sidco_torch
