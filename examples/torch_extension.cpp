// A PyTorch extension of one's own on sidco's headers: compressors composed from policies at
// compile time, as TorchScript classes with error feedback kept in a tensor the caller owns,
// and added as methods that sidco_torch's Compressor, State and DDP hook take by name.
// examples/torch_extension.py builds it with torch.utils.cpp_extension and
// sidco_torch.extension_args(), and runs it on a bundled real gradient.
#include <ATen/ATen.h>
#include <torch/custom_class.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>
#include <span>
#include <string>
#include <tuple>

#include <sidco/sidco.hpp>
#include <sidco_torch/csrc/added_methods.hpp>

namespace my_ext {

// SIDCo-E as sidco_torch's "sidco-e" (the same bits), and a composition of one's own: a gamma
// fit of |g|, generalized-Pareto fits of the excesses, two fixed stages.
using sidco_e = sidco::presets::sidco_e<sidco::backend::cpu>;
using gamma_gp_two_stages =
    sidco::presets::sidco_with<sidco::models::gamma, sidco::models::generalized_pareto, sidco::stages::fixed<2>,
                               sidco::fit::zero_aware, sidco::select::above_threshold, sidco::backend::cpu>;

std::span<float> floats(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.device().is_cpu() && t.scalar_type() == at::kFloat && t.is_contiguous(), name,
              ": a contiguous CPU float32 tensor is needed, not ", t.scalar_type(), " on ", t.device());
  return {t.data_ptr<float>(), std::size_t(t.numel())};
}

// One compressor per tensor: it keeps the adaptive state between calls.
template <class Compressor>
class compressor : public torch::CustomClassHolder {
 public:
  // (indices int64, values) of gradient (+ residual, which keeps in place what is not sent).
  std::tuple<at::Tensor, at::Tensor> compress(const at::Tensor& gradient, double density,
                                              const c10::optional<at::Tensor>& residual) {
    const std::span<const float> g = floats(gradient, "gradient");
    try {
      if (residual) {
        TORCH_CHECK(residual->numel() == gradient.numel(), "residual: ", residual->numel(),
                    " values for a gradient of ", gradient.numel());
        sidco::feedback::residual<float> kept(floats(*residual, "residual"));
        report_ = compressor_.compress(g, density, out_, kept);
      } else {
        report_ = compressor_.compress(g, density, out_);
      }
    } catch (const sidco::error& e) {  // a bad argument: Python's ValueError, sidco's message
      TORCH_CHECK_VALUE(false, e.what());
    }
    const auto n = std::int64_t(out_.size());
    at::Tensor indices = at::empty({n}, at::kLong);
    at::Tensor values = at::empty({n}, at::kFloat);
    std::copy(out_.indices().begin(), out_.indices().end(), indices.data_ptr<std::int64_t>());
    std::copy(out_.values().begin(), out_.values().end(), values.data_ptr<float>());
    return {indices, values};
  }
  // The last call's threshold (-1: none) and its fitted stages.
  double threshold() const { return report_.threshold; }
  std::int64_t stages() const { return report_.stages; }

 private:
  Compressor compressor_;
  sidco::sparse_vector<float> out_;
  sidco::compress_report report_{};
};

template <class Compressor>
void define(torch::Library& m, const char* name) {
  m.class_<compressor<Compressor>>(name)
      .def(torch::init<>())
      .def("compress", &compressor<Compressor>::compress)
      .def("threshold", &compressor<Compressor>::threshold)
      .def("stages", &compressor<Compressor>::stages);
}

// Both compressors as methods of sidco_torch (CPU tensors, every element type), by the names
// given. Called once per process, after the library loads: a name can be added once.
void add_methods(const std::string& sidco_e_name, const std::string& gamma_gp_name) {
  try {
    sidco_torch::add_method<sidco_e>(sidco_e_name, "SIDCo-E from an extension of one's own");
    sidco_torch::add_method<gamma_gp_two_stages>(gamma_gp_name, "gamma fit, generalized-Pareto tails, two fixed stages");
  } catch (const sidco::error& e) {
    TORCH_CHECK_VALUE(false, e.what());
  }
}

}  // namespace my_ext

TORCH_LIBRARY(my_sidco, m) {
  my_ext::define<my_ext::sidco_e>(m, "SidcoE");
  my_ext::define<my_ext::gamma_gp_two_stages>(m, "GammaGPTwoStages");
  m.def("add_methods(str sidco_e_name='my-sidco-e', str gamma_gp_name='gamma-gp-two-stages') -> ()",
        my_ext::add_methods);
}
