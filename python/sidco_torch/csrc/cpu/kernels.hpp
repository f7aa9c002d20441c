// The CPU side of the classes for one element type: a bucket's codec (compress, trim,
// pack; decode) and a tensor's compressor, on sidco's backend::cpu. Each element type is
// compiled in a file of its own (float32.cpp, ...), which instantiates make_cpu_*_of<T>.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <exception>
#include <limits>
#include <memory>
#include <span>
#include <string>
#include <tuple>
#include <vector>

#include <sidco/comm/allgather/core.hpp>
#include <sidco/comm/residual_sink.hpp>
#include <sidco/core/half.hpp>

#include "../added_methods.hpp"
#include "../binding.hpp"
#include "../classes.hpp"
#include "../engine.hpp"

namespace sidco_torch {

using index32 = std::uint32_t;

template <class T>
class cpu_codec final : public codec_impl {
 public:
  cpu_codec(const codec_settings& settings, const sidco::comm::wire_format&, const sidco::comm::capacity_plan&)
      : settings_(settings),
        core_(settings.layout, settings.capacity_density, settings.slack, settings.coding),
        engine_(make_cpu_engine<T>(settings.method, settings.options, settings.layout, layer_budget::per_layer)),
        payload_(at::zeros({std::int64_t(core_.format().bytes())}, at::kByte)) {}

  at::Tensor encode(const at::Tensor& gradient, const c10::optional<at::Tensor>& residual,
                    const sidco::comm::wire_fields& fields) override {
    report_ = {};
    // Whatever fails here fails on this rank alone: the payload carries the error to every
    // rank, and the residual is as it was (compress changes nothing when it throws; after
    // it, the core gives back what it cannot send).
    residual_ = {};
    try {
      check(gradient, "bucket");
      if (residual) {
        check(*residual, "residual");
        residual_.values = span_of<T>(*residual);
      }
      report_.compress = engine_->compress(span_of<const T>(gradient), settings_.density, residual_.values, sent_);
    } catch (const std::exception& e) {
      report_.failed = true;
      core_.encode_failure(e, fields, bytes_of(payload_));
      return payload_;
    }
    report_.trimmed = core_.encode(sent_, residual_, fields, bytes_of(payload_));
    report_.used_bytes = core_.used_bytes();
    report_.failed = sidco::comm::header_of(bytes_of(payload_)).status != std::uint8_t(sidco::comm::wire_status::ok);
    report_.compress.selected = sent_.size();
    report_.compress.density = double(sent_.size()) / double(core_.size());
    return payload_;
  }

  at::Tensor encode_failure(const std::string& message, const sidco::comm::wire_fields& fields) override {
    report_ = {};
    report_.failed = true;
    residual_ = {};
    core_.encode_failure(sidco::runtime_error(message), fields, bytes_of(payload_));
    return payload_;
  }

  // The residual given back into is the one encode was given (the hook passes the same).
  void decode(const std::vector<at::Tensor>& payloads, const at::Tensor& out, const c10::optional<at::Tensor>&) override {
    check(out, "out");
    std::vector<std::span<const std::byte>> views;
    views.reserve(payloads.size());
    for (const at::Tensor& p : payloads) {
      check_cpu_tensor("payload", p);
      if (p.scalar_type() != at::kByte) sidco::throw_error("payload: dtype ", p.scalar_type(), " is not uint8");
      views.push_back(bytes_of(p));
    }
    report_.exchange = core_.decode(views, span_of<T>(out), residual_);
  }

  std::vector<std::byte> save_layer(std::size_t i) const override { return engine_->save(i); }
  void load_layer(std::size_t i, std::span<const std::byte> bytes) override { engine_->load(i, bytes); }
  const codec_report& report() const override { return report_; }

 private:
  void check(const at::Tensor& t, const char* what) const {
    check_cpu_tensor(what, t);
    if (t.scalar_type() != settings_.dtype)
      sidco::throw_error(what, ": dtype ", t.scalar_type(), " is not the codec's ", settings_.dtype);
    if (std::size_t(t.numel()) != core_.size())
      sidco::throw_error(what, ": ", t.numel(), " values, the codec's layers add up to ", core_.size());
  }

  codec_settings settings_;
  sidco::comm::allgather_core<T, index32> core_;
  std::unique_ptr<engine<T, index32>> engine_;
  sidco::sparse_vector<T, index32> sent_;
  sidco::comm::host_residual<T> residual_;  // this step's, given to encode
  at::Tensor payload_;
  codec_report report_;
};

template <class T>
class cpu_compressor final : public compressor_impl {
 public:
  cpu_compressor(std::string method, sidco::methods::options options)
      : method_(std::move(method)), options_(options),
        whole_(make_cpu_engine<T>(method_, options_, {}, layer_budget::shared)) {}

  std::tuple<at::Tensor, at::Tensor> compress(const at::Tensor& gradient, double density,
                                              const std::vector<std::int64_t>& layers,
                                              const c10::optional<at::Tensor>& residual) override {
    const std::size_t n = std::size_t(gradient.numel());
    if (n > std::size_t(std::numeric_limits<index32>::max()) + 1)
      sidco::throw_error("gradient: ", n, " values; sidco_torch addresses 2^32 (32-bit indices)");
    engine<T, index32>* e = whole_.get();
    if (!layers.empty()) {
      if (!layered_ || layers != layer_sizes_) {
        layered_ = make_cpu_engine<T>(method_, options_, layout_of(layers, n), layer_budget::shared);
        layer_sizes_ = layers;
      }
      e = layered_.get();
    }
    last_ = e->compress(span_of<const T>(gradient), density, residual ? span_of<T>(*residual) : std::span<T>(), out_);
    auto indices = at::empty({std::int64_t(out_.size())}, at::kLong);
    auto values = at::empty({std::int64_t(out_.size())}, gradient.options());
    std::copy(out_.indices().begin(), out_.indices().end(), indices.data_ptr<std::int64_t>());
    std::copy(out_.values().begin(), out_.values().end(), span_of<T>(values).data());
    return {indices, values};
  }

  const sidco::compress_report& report() const override { return last_; }
  void save(std::vector<saved_engine>& into) const override {
    save_engine(*whole_, {}, into);
    if (layered_) save_engine(*layered_, layer_sizes_, into);
  }
  void load(const saved_engine& saved) override {
    if (saved.layer_sizes.empty()) return load_engine(*whole_, saved);
    auto layered = make_cpu_engine<T>(method_, options_, saved_layout(saved), layer_budget::shared);
    load_engine(*layered, saved);
    layered_ = std::move(layered);
    layer_sizes_ = saved.layer_sizes;
  }

 private:
  std::string method_;
  sidco::methods::options options_;
  std::unique_ptr<engine<T, index32>> whole_, layered_;
  std::vector<std::int64_t> layer_sizes_;
  sidco::sparse_vector<T, index32> out_;
  sidco::compress_report last_;
};

template <class T>
std::unique_ptr<engine<T, std::uint32_t>> make_cpu_engine(const std::string& method,
                                                          const sidco::methods::options& options,
                                                          std::vector<sidco::segment> layout, layer_budget budget) {
  if (const added_method* added = find_added_method(method))
    return added->template factory<T>()(options, std::move(layout), budget);
  return make_engine<T, std::uint32_t>(method, options, std::move(layout), budget);
}

template <class T>
std::unique_ptr<codec_impl> make_cpu_codec_of(const codec_settings& settings, const sidco::comm::wire_format& format,
                                              const sidco::comm::capacity_plan& plan) {
  return std::make_unique<cpu_codec<T>>(settings, format, plan);
}

template <class T>
std::unique_ptr<compressor_impl> make_cpu_compressor_of(const std::string& method, const sidco::methods::options& options) {
  return std::make_unique<cpu_compressor<T>>(method, options);
}

}  // namespace sidco_torch
