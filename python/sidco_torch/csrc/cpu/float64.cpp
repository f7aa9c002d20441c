// The CPU codec and compressor for float64 tensors (one file per element type, so that
// their many preset instantiations compile side by side).
#include "kernels.hpp"

namespace sidco_torch {

template std::unique_ptr<codec_impl> make_cpu_codec_of<double>(const codec_settings&, const sidco::comm::wire_format&,
                                                            const sidco::comm::capacity_plan&);
template std::unique_ptr<engine<double, std::uint32_t>> make_cpu_engine<double>(const std::string&,
                                                                          const sidco::methods::options&,
                                                                          std::vector<sidco::segment>, layer_budget);
template std::unique_ptr<compressor_impl> make_cpu_compressor_of<double>(const std::string&,
                                                                     const sidco::methods::options&);

}  // namespace sidco_torch
