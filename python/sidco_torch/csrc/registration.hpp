// The ops' kernels are registered from library.cpp's TORCH_LIBRARY block, after the classes
// their schemas name: a TORCH_LIBRARY_IMPL in another file would run in link order, and
// where it runs first (torch.utils.cpp_extension links library.cpp last) torch cannot infer
// a kernel's schema ("Type c10::intrusive_ptr<sidco_torch::Compressor> could not be
// converted to any of the known types", seen with torch 2.11).
#pragma once

#include <torch/library.h>

namespace sidco_torch {

/// The CPU kernels (cpu/ops.cpp, cpu/reduce.cpp).
void register_cpu_kernels(torch::Library& m);
/// The CUDA kernels (cuda/ops.cu), where the library was built with them: weak, so a build
/// without CUDA links and the address is null.
[[gnu::weak]] void register_cuda_kernels(torch::Library& m);

}  // namespace sidco_torch
