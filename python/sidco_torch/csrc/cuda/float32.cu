// The CUDA compressor and codecs for float32 tensors (one file per element type, so that
// their many preset instantiations compile side by side).
#include "kernels.cuh"

template struct sidco_torch::cuda_side<float>;
