// The CUDA compressor and codecs for bfloat16 tensors (one file per element type, so that
// their many preset instantiations compile side by side).
#include "kernels.cuh"

template struct sidco_torch::cuda_side<__nv_bfloat16>;
