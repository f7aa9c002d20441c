// The CUDA side's makers per element type: defined in kernels.cuh and instantiated in a file
// of their own per type (float32.cu, ...), so that the types' many preset instantiations
// compile side by side; ops.cu picks one by the tensor's dtype.
#pragma once

// Before ATen: nvcc needs c10::IValue complete where ATen's lists use it.
#include <torch/custom_class.h>

#include <ATen/ATen.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "../classes.hpp"
#include "../reduce_codec.hpp"

namespace sidco_torch {

// One element type's CUDA side: its members are defined in kernels.cuh and instantiated by
// `template struct cuda_side<T>;` in the type's own file.
template <class T>
struct cuda_side {
  static std::unique_ptr<compressor_impl> compressor(const std::string& method, const sidco::methods::options& options,
                                                     const at::Device& device);
  static std::unique_ptr<codec_impl> codec(const codec_settings& settings, const sidco::comm::wire_format& format,
                                           const sidco::comm::capacity_plan& plan, const at::Device& device);
  static std::unique_ptr<reduce_codec_impl> reduce_codec(const codec_settings& settings,
                                                         const std::vector<std::int64_t>& order, std::size_t ranks,
                                                         std::size_t rank, const std::string& owner,
                                                         const at::Device& device);
};

}  // namespace sidco_torch
