// sidco as PyTorch custom ops (TORCH_LIBRARY: no pybind11): a per-tensor compressor as a
// TorchScript custom class, and decompress / scatter-add. The method is chosen by name at
// run time here, the one place where sidco dispatches at run time: a binding must. The
// error-feedback residual is a tensor the caller owns, wrapped in place (no copies in or
// out). sidco::error becomes a Python RuntimeError carrying the library's message.
//
// CPU tensors (float32, float64) run on backend::cpu. Debian's torch is CPU-only, so
// this build has no CUDA path: device tensors are refused with a clear error.
#include <torch/custom_class.h>
#include <torch/library.h>

#include <ATen/ATen.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <tuple>
#include <vector>

#include <sidco/sidco.hpp>

namespace {

using sidco::compress_report;
using sidco::segment;
template <class T>
using sparse = sidco::sparse_vector<T, std::uint64_t>;

// One tensor's compressor, whole or per layer, whatever its type.
template <class T>
struct engine {
  virtual ~engine() = default;
  virtual compress_report run(std::span<const T> gradient, double density, const std::vector<std::int64_t>& layers,
                              T* residual, sparse<T>& out) = 0;
};

template <class T, class Compressor>
class engine_of final : public engine<T> {
 public:
  explicit engine_of(Compressor prototype) : whole_(prototype), prototype_(prototype) {}

  compress_report run(std::span<const T> gradient, double density, const std::vector<std::int64_t>& layers,
                      T* residual, sparse<T>& out) override {
    std::optional<sidco::feedback::residual<T>> state;
    if (residual) state.emplace(std::span<T>(residual, gradient.size()));
    if (layers.empty()) {
      return state ? whole_.template compress<T>(gradient, density, out, *state)
                   : whole_.template compress<T>(gradient, density, out);
    }
    if (!layered_ || layers != layer_sizes_) {
      std::vector<segment> layout;
      std::size_t offset = 0;
      for (std::int64_t size : layers) {
        if (size <= 0) sidco::detail::fail("layer_sizes: size ", size, " is not positive");
        layout.push_back({offset, std::size_t(size)});
        offset += std::size_t(size);
      }
      layered_.emplace(std::move(layout), prototype_);
      layer_sizes_ = layers;
    }
    return state ? layered_->template compress<T>(gradient, density, out, *state)
                 : layered_->template compress<T>(gradient, density, out);
  }

 private:
  Compressor whole_;
  Compressor prototype_;
  std::optional<sidco::segmented<Compressor>> layered_;
  std::vector<std::int64_t> layer_sizes_;
};

template <class T>
std::unique_ptr<engine<T>> make_engine(const std::string& method, std::uint64_t seed) {
  using namespace sidco::presets;
  auto with = [](auto prototype) -> std::unique_ptr<engine<T>> {
    return std::make_unique<engine_of<T, decltype(prototype)>>(prototype);
  };
  if (method == "sidco-e") return with(sidco_e<>{});
  if (method == "sidco-gp") return with(sidco_gp<>{});
  if (method == "sidco-gamma-gp") return with(sidco_gamma_gp<>{});
  if (method == "sidco-e-single") return with(sidco_e_single<>{});
  if (method == "sidco-e-exact") return with(sidco_e_exact<>{});
  if (method == "top-k") return with(top_k<>{});
  if (method == "random-k") return with(random_k<>(sidco::estimate::none{}, sidco::select::random_k{seed}));
  if (method == "dgc") return with(dgc<>{});
  if (method == "gaussian-k") return with(gaussian_k<>{});
  if (method == "redsync") return with(redsync<>{});
  sidco::detail::fail("method '", method,
                      "' is not one of sidco-e, sidco-gp, sidco-gamma-gp, sidco-e-single, sidco-e-exact, top-k, "
                      "random-k, dgc, gaussian-k, redsync");
}

// sidco::error (and anything else) as a c10::Error: a RuntimeError in Python.
template <class F>
auto translated(F&& f) {
  try {
    return f();
  } catch (const sidco::error& e) {
    TORCH_CHECK(false, e.what());
  }
}

class Compressor : public torch::CustomClassHolder {
 public:
  Compressor(std::string method, c10::Dict<std::string, double> options) : method_(std::move(method)) {
    translated([&] {
      std::uint64_t seed = 0x51dc0;
      for (const auto& entry : options) {
        if (entry.key() == "seed")
          seed = std::uint64_t(entry.value());
        else
          sidco::detail::fail("option '", entry.key(), "' is not known (known: seed)");
      }
      float_ = make_engine<float>(method_, seed);
      double_ = make_engine<double>(method_, seed);
      return 0;
    });
  }

  /// (indices int64, values) of gradient compressed at density; per layer when
  /// layer_sizes is not empty (they must add up to the gradient's size); residual (same
  /// size and type, contiguous) is the error-feedback state, read and written in place.
  std::tuple<at::Tensor, at::Tensor> compress(const at::Tensor& gradient, double density,
                                              std::vector<std::int64_t> layer_sizes,
                                              c10::optional<at::Tensor> residual) {
    return translated([&] {
      check_tensor("gradient", gradient);
      if (residual) {
        check_tensor("residual", *residual);
        if (residual->scalar_type() != gradient.scalar_type())
          sidco::detail::fail("residual: dtype ", residual->scalar_type(), " differs from the gradient's ",
                              gradient.scalar_type());
        sidco::check::same_size("residual", std::size_t(residual->numel()), std::size_t(gradient.numel()));
      }
      if (gradient.scalar_type() == at::kFloat) return run<float>(*float_, gradient, density, layer_sizes, residual);
      if (gradient.scalar_type() == at::kDouble) return run<double>(*double_, gradient, density, layer_sizes, residual);
      sidco::detail::fail("gradient: dtype ", gradient.scalar_type(), " is not float32 or float64");
    });
  }

  /// What the last compress did.
  c10::Dict<std::string, double> report() const {
    c10::Dict<std::string, double> d;
    d.insert("threshold", last_.threshold);
    d.insert("selected", double(last_.selected));
    d.insert("candidates", double(last_.candidates));
    d.insert("size", double(last_.size));
    d.insert("zeros", double(last_.zeros));
    d.insert("target_density", last_.target_density);
    d.insert("density", last_.density);
    d.insert("stages", double(last_.stages));
    d.insert("passes", double(last_.passes));
    d.insert("rescans", double(last_.rescans));
    return d;
  }

  std::string method() const { return method_; }

 private:
  static void check_tensor(const char* what, const at::Tensor& t) {
    if (!t.device().is_cpu())
      sidco::detail::fail(what, ": device ", t.device(), " is not the CPU (this build of sidco_torch is CPU-only)");
    if (!t.is_contiguous()) sidco::detail::fail(what, ": tensor is not contiguous");
  }

  template <class T>
  std::tuple<at::Tensor, at::Tensor> run(engine<T>& e, const at::Tensor& gradient, double density,
                                         const std::vector<std::int64_t>& layers,
                                         const c10::optional<at::Tensor>& residual) {
    const std::span<const T> g(gradient.data_ptr<T>(), std::size_t(gradient.numel()));
    last_ = e.run(g, density, layers, residual ? residual->data_ptr<T>() : nullptr, out_<T>());
    const auto& out = out_<T>();
    auto indices = at::empty({std::int64_t(out.size())}, at::kLong);
    auto values = at::empty({std::int64_t(out.size())}, gradient.options());
    std::copy(out.indices().begin(), out.indices().end(), reinterpret_cast<std::uint64_t*>(indices.data_ptr<std::int64_t>()));
    std::copy(out.values().begin(), out.values().end(), values.data_ptr<T>());
    return {indices, values};
  }

  template <class T>
  sparse<T>& out_() {
    if constexpr (std::is_same_v<T, float>)
      return out_float_;
    else
      return out_double_;
  }

  std::string method_;
  std::unique_ptr<engine<float>> float_;
  std::unique_ptr<engine<double>> double_;
  sparse<float> out_float_;
  sparse<double> out_double_;
  compress_report last_;
};

// dense[indices[j]] += scale values[j] (rounded once), every index checked first.
at::Tensor scatter_add_(at::Tensor dense, const at::Tensor& indices, const at::Tensor& values, double scale) {
  return translated([&] {
    if (!dense.device().is_cpu() || !dense.is_contiguous()) sidco::detail::fail("dense: not a contiguous CPU tensor");
    if (indices.scalar_type() != at::kLong) sidco::detail::fail("indices: dtype ", indices.scalar_type(), " is not int64");
    if (values.scalar_type() != dense.scalar_type())
      sidco::detail::fail("values: dtype ", values.scalar_type(), " differs from dense's ", dense.scalar_type());
    if (indices.numel() != values.numel())
      sidco::detail::fail("indices: ", indices.numel(), " entries, values: ", values.numel());
    const auto idx = indices.contiguous();
    const auto val = values.contiguous();
    const auto* i = reinterpret_cast<const std::uint64_t*>(idx.data_ptr<std::int64_t>());
    const std::size_t n = std::size_t(idx.numel());
    auto add = [&](auto* d, const auto* v) {
      using T = std::remove_pointer_t<decltype(d)>;
      sidco::backend::host::check_scatter("sparse tensor", std::size_t(dense.numel()), i, n, std::size_t(dense.numel()));
      sidco::backend::host::add_checked(i, v, n, d, T(scale));
    };
    if (dense.scalar_type() == at::kFloat)
      add(dense.data_ptr<float>(), val.data_ptr<float>());
    else if (dense.scalar_type() == at::kDouble)
      add(dense.data_ptr<double>(), val.data_ptr<double>());
    else
      sidco::detail::fail("dense: dtype ", dense.scalar_type(), " is not float32 or float64");
    return dense;
  });
}

at::Tensor decompress(const at::Tensor& indices, const at::Tensor& values, std::int64_t size) {
  if (size < 0) TORCH_CHECK(false, "sidco: size = ", size, " is negative");
  return scatter_add_(at::zeros({size}, values.options()), indices, values, 1.0);
}

}  // namespace

TORCH_LIBRARY(sidco, m) {
  m.class_<Compressor>("Compressor")
      .def(torch::init<std::string, c10::Dict<std::string, double>>())
      .def("compress", &Compressor::compress)
      .def("report", &Compressor::report)
      .def("method", &Compressor::method);
  m.def("scatter_add_(Tensor(a!) dense, Tensor indices, Tensor values, float scale=1.0) -> Tensor(a!)", scatter_add_);
  m.def("decompress(Tensor indices, Tensor values, int size) -> Tensor", decompress);
}
