// The state the ops keep between calls, as TorchScript custom classes: Compressor (one
// tensor's compressor, for sidco_torch.compress) and Codec (one DDP bucket's compressor,
// capacity and payload, for the communication hook). The element work is in the ops
// registered per dispatch key (cpu/ops.cpp); the classes hold what those ops need, per
// device, created on first use.
#pragma once

#include <torch/custom_class.h>

#include <ATen/ATen.h>

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <sidco/comm/allgather/core.hpp>
#include <sidco/comm/capacity.hpp>
#include <sidco/comm/wire.hpp>
#include <sidco/core/segment.hpp>
#include <sidco/methods.hpp>

#include "binding.hpp"

#include "engine.hpp"

namespace sidco_torch {

/// What a Codec is: the method and its options, the bucket's layers, the element type, the
/// density and the capacity's slack.
struct codec_settings {
  std::string method;
  sidco::methods::options options;
  std::vector<sidco::segment> layout;  // the bucket's tensors, in order
  at::ScalarType dtype = at::kFloat;
  double density = 0.01;
  double slack = 1.25;
  double capacity_density = 0.01;  // what capacities are planned for (the density every rank last agreed on)
  sidco::comm::entry_coding coding = sidco::comm::entry_coding::plain;  // the all-gather's payload (wire=)
};

/// What the last encode and decode did, for State.stats().
struct codec_report {
  sidco::compress_report compress;  // of the whole bucket (threshold: -1 when per layer)
  std::size_t trimmed = 0;          // entries over capacity, returned to the residual
  bool failed = false;              // the compress threw (the payload carries its message)
  std::size_t used_bytes = 0;       // the payload's bytes a receiver needs (0: all of them)
  sidco::comm::exchange_report exchange;
};

/// One device's side of a Codec: encode a bucket into the payload, decode every rank's
/// payloads into the bucket.
class codec_impl {
 public:
  virtual ~codec_impl() = default;
  virtual at::Tensor encode(const at::Tensor& gradient, const c10::optional<at::Tensor>& residual,
                            const sidco::comm::wire_fields& fields) = 0;
  /// A payload that reports this rank's failure (message) to every rank.
  virtual at::Tensor encode_failure(const std::string& message, const sidco::comm::wire_fields& fields) = 0;
  virtual void decode(const std::vector<at::Tensor>& payloads, const at::Tensor& out,
                      const c10::optional<at::Tensor>& residual) = 0;
  virtual std::vector<std::byte> save_layer(std::size_t i) const = 0;
  virtual void load_layer(std::size_t i, std::span<const std::byte> bytes) = 0;
  virtual const codec_report& report() const = 0;
};

/// The CPU side (cpu/ops.cpp), and per element type (cpu/kernels.hpp, one file each).
std::unique_ptr<codec_impl> make_cpu_codec(const codec_settings& settings, const sidco::comm::wire_format& format,
                                           const sidco::comm::capacity_plan& plan);
template <class T>
std::unique_ptr<codec_impl> make_cpu_codec_of(const codec_settings& settings, const sidco::comm::wire_format& format,
                                              const sidco::comm::capacity_plan& plan);

/// One DDP bucket's compressors, capacity and payload. Every entry point (the ops and the
/// methods) holds the Codec's lock while it runs: the ops release the GIL, so two Python
/// threads sharing one Codec are served in turn instead of racing on its buffers.
class Codec : public torch::CustomClassHolder {
 public:
  /// capacity_density: the density the payload's capacity is planned for (the one every
  /// rank last agreed on; density itself while it does not change).
  /// wire: "plain", "compact" or "compact8" (comm/compact.hpp).
  Codec(std::string method, c10::Dict<std::string, double> options, std::vector<std::int64_t> layer_sizes,
        std::string dtype, double density, double slack, double capacity_density, std::string wire);

  const codec_settings& settings() const { return settings_; }
  const sidco::comm::wire_format& format() const { return format_; }
  /// The implementation for device (created on first use, with the compressors' state of
  /// the one used last).
  codec_impl& on(const at::Device& device) const;
  /// The one used last (the CPU's before any).
  codec_impl& current() const;
  /// Held by every entry point while it runs (not re-entrant: on() and current() take none).
  std::unique_lock<std::mutex> lock() const { return std::unique_lock<std::mutex>(mutex_); }

  std::int64_t payload_bytes() const { return std::int64_t(format_.bytes()); }
  std::int64_t capacity() const { return std::int64_t(format_.capacity); }
  std::vector<std::int64_t> layer_capacities() const;
  c10::Dict<std::string, double> report() const;
  at::Tensor layer_state(std::int64_t layer) const;
  void load_layer_state(std::int64_t layer, const at::Tensor& state);

 private:
  std::size_t layer_index(std::int64_t layer) const;

  codec_settings settings_;
  sidco::comm::capacity_plan plan_;
  sidco::comm::wire_format format_;
  mutable std::unique_ptr<codec_impl> cpu_;
  mutable std::vector<std::unique_ptr<codec_impl>> cuda_;  // per device index
  mutable codec_impl* current_ = nullptr;
  mutable std::mutex mutex_;
};

/// Made by cuda/ops.cu, which registers it when the library is built with CUDA.
using cuda_codec_factory = std::unique_ptr<codec_impl> (*)(const codec_settings& settings,
                                                           const sidco::comm::wire_format& format,
                                                           const sidco::comm::capacity_plan& plan,
                                                           const at::Device& device);
void register_cuda_codec(cuda_codec_factory factory);

/// The hook's ops, for every device (registered per dispatch key by cpu/ops.cpp and
/// cuda/ops.cu): each runs on the Codec's side for the tensor's device.
at::Tensor codec_encode(const at::Tensor& gradient, const c10::optional<at::Tensor>& residual,
                        const c10::intrusive_ptr<Codec>& codec, std::int64_t tag, std::int64_t sequence);
at::Tensor codec_encode_failure(const at::Tensor& gradient, const c10::intrusive_ptr<Codec>& codec,
                                std::string message, std::int64_t tag, std::int64_t sequence);
at::Tensor codec_decode(const std::vector<at::Tensor>& payloads, const at::Tensor& out,
                        const c10::optional<at::Tensor>& residual, const c10::intrusive_ptr<Codec>& codec);

/// One engine of a sidco_torch.Compressor as saved: its element type, its layer sizes (none:
/// the whole-tensor engine) and each layer's compressor state (one entry when whole).
struct saved_engine {
  at::ScalarType dtype = at::kFloat;
  std::vector<std::int64_t> layer_sizes;
  std::vector<std::vector<std::byte>> layers;
};

/// Appends engine e's state, saved as the engine of layer_sizes (its dtype is set by
/// compressors_by_type, which knows the slot).
template <class Engine>
void save_engine(const Engine& e, const std::vector<std::int64_t>& layer_sizes, std::vector<saved_engine>& into) {
  saved_engine saved{at::kFloat, layer_sizes, {}};
  for (std::size_t i = 0; i < e.layers(); ++i) saved.layers.push_back(e.save(i));
  into.push_back(std::move(saved));
}

/// Loads saved's layers into e, which has as many; e is new or whole (one layer, which
/// load_whole_state loads or leaves), so a refusal leaves no engine in use half loaded.
template <class Engine>
void load_engine(Engine& e, const saved_engine& saved) {
  if (saved.layers.size() != e.layers())
    sidco::throw_error("state: ", saved.layers.size(), " layer states for an engine of ", e.layers(), " layers");
  for (std::size_t i = 0; i < e.layers(); ++i) e.load(i, saved.layers[i]);
}

/// A saved per-layer engine's layout (parse_layout's checks, and 32-bit indices).
std::vector<sidco::segment> saved_layout(const saved_engine& saved);

/// sidco_torch.Compressor's state: per element type, a whole-tensor engine and the last
/// per-layer one (rebuilt when the layer sizes change).
class compressor_impl {
 public:
  virtual ~compressor_impl() = default;
  virtual std::tuple<at::Tensor, at::Tensor> compress(const at::Tensor& gradient, double density,
                                                      const std::vector<std::int64_t>& layers,
                                                      const c10::optional<at::Tensor>& residual) = 0;
  virtual const sidco::compress_report& report() const = 0;
  /// Appends every engine's state; load takes one of them back (its element type's engine).
  virtual void save(std::vector<saved_engine>& into) const = 0;
  virtual void load(const saved_engine& saved) = 0;
};

/// Every element type behind one compressor_impl, each made by make(dtype) on its first call
/// (the first call's type is not known in advance).
class compressors_by_type final : public compressor_impl {
 public:
  using factory = std::function<std::unique_ptr<compressor_impl>(at::ScalarType dtype)>;
  explicit compressors_by_type(factory make) : make_(std::move(make)) {}

  std::tuple<at::Tensor, at::Tensor> compress(const at::Tensor& gradient, double density,
                                              const std::vector<std::int64_t>& layers,
                                              const c10::optional<at::Tensor>& residual) override {
    const std::size_t slot = type_index(gradient.scalar_type());
    if (slot == value_types)
      sidco::throw_error("gradient: dtype ", gradient.scalar_type(), " is not float32, float64, float16 or bfloat16");
    if (!by_type_[slot]) by_type_[slot] = make_(gradient.scalar_type());
    last_ = by_type_[slot].get();
    return last_->compress(gradient, density, layers, residual);
  }
  const sidco::compress_report& report() const override { return last_ ? last_->report() : none_; }
  void save(std::vector<saved_engine>& into) const override {
    for (std::size_t slot = 0; slot < value_types; ++slot) {
      if (!by_type_[slot]) continue;
      const std::size_t first = into.size();
      by_type_[slot]->save(into);
      for (std::size_t i = first; i < into.size(); ++i) into[i].dtype = dtype_at(slot);
    }
  }
  void load(const saved_engine& saved) override {
    const std::size_t slot = type_index(saved.dtype);
    if (slot == value_types) sidco::throw_error("state: dtype ", saved.dtype, " is not float32, float64, float16 or bfloat16");
    if (!by_type_[slot]) by_type_[slot] = make_(saved.dtype);
    by_type_[slot]->load(saved);
  }

 private:
  factory make_;
  std::array<std::unique_ptr<compressor_impl>, value_types> by_type_;
  compressor_impl* last_ = nullptr;
  sidco::compress_report none_;
};

std::unique_ptr<compressor_impl> make_cpu_compressor(const std::string& method, const sidco::methods::options& options);
template <class T>
std::unique_ptr<compressor_impl> make_cpu_compressor_of(const std::string& method, const sidco::methods::options& options);

/// Made by cuda/ops.cu, which registers it when the library is built with CUDA.
using cuda_compressor_factory = std::unique_ptr<compressor_impl> (*)(const std::string& method,
                                                                     const sidco::methods::options& options,
                                                                     const at::Device& device);
void register_cuda_compressor(cuda_compressor_factory factory);

/// sidco_torch.Compressor: one compressor per device and element type. compress() and
/// report() hold its lock, so two Python threads sharing one are served in turn.
class Compressor : public torch::CustomClassHolder {
 public:
  Compressor(std::string method, c10::Dict<std::string, double> options);

  /// gradient (+ residual) compressed on its device's compressor, under the lock.
  std::tuple<at::Tensor, at::Tensor> compress(const at::Tensor& gradient, double density,
                                              const std::vector<std::int64_t>& layers,
                                              const c10::optional<at::Tensor>& residual);
  c10::Dict<std::string, double> report() const;
  std::string method() const { return method_; }

  /// Every engine's state as (dtype, layer sizes, one uint8 tensor per layer), and its
  /// restoration: all of it, or a sidco::error having changed nothing.
  using saved_form = std::vector<std::tuple<std::string, std::vector<std::int64_t>, std::vector<at::Tensor>>>;
  saved_form state() const;
  void load_state(const saved_form& state);

 private:
  std::string method_;
  sidco::methods::options options_;
  std::unique_ptr<compressor_impl> impl_;  // on device_: the state follows the gradient's device
  at::Device device_ = at::kCPU;
  mutable std::mutex mutex_;

  compressor_impl& on(const at::Device& device);
  std::unique_ptr<compressor_impl> made_for(const at::Device& device) const;
};

/// The options dictionary a method takes (known: seed).
sidco::methods::options parse_options(const c10::Dict<std::string, double>& options);

}  // namespace sidco_torch
