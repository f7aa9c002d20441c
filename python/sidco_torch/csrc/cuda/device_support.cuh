// What the CUDA ops share: the CUDA type behind a dtype, the device checks, and an event
// that orders one stream after another.
#pragma once

#include <ATen/ATen.h>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <sidco/backend/cuda/check.cuh>
#include <sidco/core/error.hpp>

#include "../binding.hpp"

namespace sidco_torch {

// The CUDA type behind each dtype (c10::Half and c10::BFloat16 share __half's and
// __nv_bfloat16's layout).
template <class F>
decltype(auto) with_device_type(at::ScalarType dtype, const char* what, F&& f) {
  switch (dtype) {
    case at::kFloat: return f(type_tag<float>{});
    case at::kDouble: return f(type_tag<double>{});
    case at::kHalf: return f(type_tag<__half>{});
    case at::kBFloat16: return f(type_tag<__nv_bfloat16>{});
    default: sidco::throw_error(what, ": dtype ", dtype, " is not float32, float64, float16 or bfloat16");
  }
}

inline void check_cuda_tensor(const char* what, const at::Tensor& t, const at::Device& device) {
  if (t.device() != device) sidco::throw_error(what, ": device ", t.device(), " is not ", device);
  if (!t.is_contiguous()) sidco::throw_error(what, ": tensor is not contiguous");
}

// A CUDA event that lives as long as its owner.
class event {
 public:
  event() { SIDCO_CUDA(cudaEventCreateWithFlags(&e_, cudaEventDisableTiming)); }
  event(const event&) = delete;
  event& operator=(const event&) = delete;
  ~event() { cudaEventDestroy(e_); }
  // Work queued on to after this call waits for what is queued on from now.
  void order(cudaStream_t from, cudaStream_t to) {
    SIDCO_CUDA(cudaEventRecord(e_, from));
    SIDCO_CUDA(cudaStreamWaitEvent(to, e_, 0));
  }

 private:
  cudaEvent_t e_ = nullptr;
};

}  // namespace sidco_torch
