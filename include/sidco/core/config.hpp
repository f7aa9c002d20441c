// Build configuration shared by host and device code.
#pragma once

#define SIDCO_VERSION_MAJOR 0
#define SIDCO_VERSION_MINOR 1
#define SIDCO_VERSION_PATCH 0

// Functions marked SIDCO_HOST_DEVICE are compiled for the GPU too when nvcc sees them:
// they must not throw, allocate or call host-only libraries.
#if defined(__CUDACC__)
#define SIDCO_HOST_DEVICE __host__ __device__
#else
#define SIDCO_HOST_DEVICE
#endif
