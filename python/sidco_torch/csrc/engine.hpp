// One tensor's compressor behind a run-time method name: where the binding turns sidco's
// compile-time presets (methods.hpp), and the compressors extensions add (added_methods.hpp),
// into an object chosen by a string, whole or per layer, for one element type and one backend
// (backend::cpu on host memory, or backend::cuda on device memory).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <sidco/core/error.hpp>
#include <sidco/core/state_io.hpp>
#include <sidco/methods.hpp>
#include <sidco/segmented.hpp>

namespace sidco_torch {

/// How a per-layer engine shares the density among layers.
enum class layer_budget {
  shared,     // sidco::segmented's default: in proportion, a sparse layer's surplus to the others
  per_layer,  // every layer at the density asked for: a layer's result depends on it alone
};

template <class T, class Index, class Memory = sidco::memory::host>
class engine {
 public:
  using gradient_view = typename Memory::template view<const T>;
  using residual_view = typename Memory::template view<T>;
  using output = sidco::sparse_vector<T, Index, Memory>;

  virtual ~engine() = default;
  /// gradient (+ residual, read and written in place, when it has values) at delta into out.
  virtual sidco::compress_report compress(gradient_view gradient, double delta, residual_view residual,
                                          output& out) = 0;
  /// Layers (1 when whole) and each one's report from the last call.
  virtual std::size_t layers() const = 0;
  virtual const sidco::compress_report& layer_report(std::size_t i) const = 0;
  /// Layer i's compressor state (sidco::compressor::save_state), and its restoration.
  virtual std::vector<std::byte> save(std::size_t i) const = 0;
  virtual void load(std::size_t i, std::span<const std::byte> bytes) = 0;
};

namespace detail {

template <class T, class Index, class Compressor>
class whole final : public engine<T, Index, typename Compressor::memory_space> {
  using base = engine<T, Index, typename Compressor::memory_space>;

 public:
  explicit whole(Compressor c) : compressor_(std::move(c)) {}

  sidco::compress_report compress(typename base::gradient_view gradient, double delta,
                                  typename base::residual_view residual, typename base::output& out) override {
    if (residual.size() > 0) {
      sidco::feedback::residual<T, typename Compressor::memory_space> state(residual);
      return last_ = compressor_.template compress<T>(gradient, delta, out, state);
    }
    return last_ = compressor_.template compress<T>(gradient, delta, out);
  }
  std::size_t layers() const override { return 1; }
  const sidco::compress_report& layer_report(std::size_t) const override { return last_; }
  std::vector<std::byte> save(std::size_t) const override { return sidco::saved_state(compressor_); }
  void load(std::size_t, std::span<const std::byte> bytes) override { sidco::load_whole_state(compressor_, bytes); }

 private:
  Compressor compressor_;
  sidco::compress_report last_;
};

template <class T, class Index, class Compressor>
class layered final : public engine<T, Index, typename Compressor::memory_space> {
  using base = engine<T, Index, typename Compressor::memory_space>;

 public:
  layered(std::vector<sidco::segment> layout, Compressor prototype, layer_budget budget)
      : compressor_(std::move(layout), std::move(prototype), budget_for(budget)) {}

  sidco::compress_report compress(typename base::gradient_view gradient, double delta,
                                  typename base::residual_view residual, typename base::output& out) override {
    if (residual.size() > 0) {
      sidco::feedback::residual<T, typename Compressor::memory_space> state(residual);
      return compressor_.template compress<T>(gradient, delta, out, state);
    }
    return compressor_.template compress<T>(gradient, delta, out);
  }
  std::size_t layers() const override { return compressor_.layout().size(); }
  const sidco::compress_report& layer_report(std::size_t i) const override {
    return compressor_.segment_reports().at(i);
  }
  std::vector<std::byte> save(std::size_t i) const override {
    sidco::state_writer out;
    compressor_.save_segment_state(i, out);
    return out.take();
  }
  void load(std::size_t i, std::span<const std::byte> bytes) override {
    sidco::load_whole_state(compressor_.segment_state(i), bytes);
  }

 private:
  using budget_policy = typename sidco::segmented<Compressor>::budget_policy;
  static budget_policy budget_for(layer_budget b) {
    if (b == layer_budget::shared) return {};
    return [](std::size_t, const sidco::segment&, double delta) { return delta; };
  }

  sidco::segmented<Compressor> compressor_;
};

}  // namespace detail

/// The layout of layer_sizes over a gradient of n values; the layers must tile it (sizes are
/// checked for overflow before they are added).
inline std::vector<sidco::segment> layout_of(const std::vector<std::int64_t>& layers, std::size_t n) {
  std::vector<sidco::segment> layout;
  std::size_t offset = 0;
  for (std::size_t i = 0; i < layers.size(); ++i) {
    if (layers[i] <= 0) sidco::throw_error("layer_sizes: size ", layers[i], " of layer ", i, " is not positive");
    if (std::uint64_t(layers[i]) > n - offset)
      sidco::throw_error("layer_sizes: layers 0..", i, " hold more than the gradient's ", n, " values");
    layout.push_back({offset, std::size_t(layers[i])});
    offset += std::size_t(layers[i]);
  }
  if (offset != n) sidco::throw_error("layer_sizes: the layers add up to ", offset, ", the gradient holds ", n);
  return layout;
}

/// An engine of prototype's compressor type: whole (layout empty) or per layer.
template <class T, class Index, class Compressor>
std::unique_ptr<engine<T, Index, typename Compressor::memory_space>> engine_of(Compressor prototype,
                                                                               std::vector<sidco::segment> layout,
                                                                               layer_budget budget) {
  if (layout.empty()) return std::make_unique<detail::whole<T, Index, Compressor>>(std::move(prototype));
  return std::make_unique<detail::layered<T, Index, Compressor>>(std::move(layout), std::move(prototype), budget);
}

/// The method called name on a Backend made by make_backend(), whole (layout empty) or
/// per layer.
template <class T, class Index, class Backend = sidco::backend::cpu, class MakeBackend>
std::unique_ptr<engine<T, Index, typename Backend::memory>> make_engine(
    const std::string& method, const sidco::methods::options& options, std::vector<sidco::segment> layout,
    layer_budget budget, MakeBackend&& make_backend) {
  using result = std::unique_ptr<engine<T, Index, typename Backend::memory>>;
  return sidco::methods::visit<Backend>(method, options, [&](auto prototype) -> result {
    prototype.backend() = make_backend();
    return engine_of<T, Index>(std::move(prototype), std::move(layout), budget);
  });
}

/// The host engine of T on backend::cpu: defined in cpu/kernels.hpp and instantiated once per
/// element type (cpu/float32.cpp, ...), so that other files (cpu/reduce.cpp) do not
/// instantiate every method again.
template <class T>
std::unique_ptr<engine<T, std::uint32_t>> make_cpu_engine(const std::string& method,
                                                          const sidco::methods::options& options,
                                                          std::vector<sidco::segment> layout, layer_budget budget);

/// The method called name on backend::cpu (default threads).
template <class T, class Index>
std::unique_ptr<engine<T, Index>> make_engine(const std::string& method, const sidco::methods::options& options,
                                              std::vector<sidco::segment> layout, layer_budget budget) {
  return make_engine<T, Index>(method, options, std::move(layout), budget, [] { return sidco::backend::cpu{}; });
}

}  // namespace sidco_torch
