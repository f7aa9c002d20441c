// CUDA failures as sidco::runtime_error naming the call.
#pragma once

#include <cuda_runtime.h>

#include "sidco/core/error.hpp"

namespace sidco::backend::cuda_detail {

inline void check(cudaError_t status, const char* call) {
  if (status != cudaSuccess)
    sidco::detail::fail_at_run_time("CUDA: ", call, " failed: ", cudaGetErrorString(status), " (", cudaGetErrorName(status), ")");
}

}  // namespace sidco::backend::cuda_detail

/// Runs a CUDA runtime call; a failure throws sidco::runtime_error naming it.
#define SIDCO_CUDA(call) ::sidco::backend::cuda_detail::check((call), #call)
