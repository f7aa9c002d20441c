// How many CUDA devices this machine has; the tests exit 77 (skipped) when it has none.
#pragma once

#include <cuda_runtime.h>

namespace sidco::test {

inline int cuda_device_count() {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess) devices = 0;
  cudaGetLastError();  // clears the error a machine without a driver leaves
  return devices;
}

inline bool cuda_device_present() { return cuda_device_count() > 0; }

}  // namespace sidco::test
