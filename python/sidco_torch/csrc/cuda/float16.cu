// The CUDA compressor and codecs for float16 tensors (one file per element type, so that
// their many preset instantiations compile side by side).
#include "kernels.cuh"

namespace sidco_torch {

template std::unique_ptr<compressor_impl> make_cuda_compressor_of<__half>(
    const std::string&, const sidco::methods::options&, const at::Device&);
template std::unique_ptr<codec_impl> make_cuda_codec_of<__half>(
    const codec_settings&, const sidco::comm::wire_format&, const sidco::comm::capacity_plan&, const at::Device&);
template std::unique_ptr<reduce_codec_impl> make_cuda_reduce_codec_of<__half>(
    const codec_settings&, const std::vector<std::int64_t>&, std::size_t, std::size_t, const std::string&,
    const at::Device&);

}  // namespace sidco_torch
