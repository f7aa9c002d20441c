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

#include <sidco/comm/capacity.hpp>
#include <sidco/comm/wire.hpp>
#include <sidco/core/half.hpp>

#include "../binding.hpp"
#include "../classes.hpp"
#include "../engine.hpp"

namespace sidco_torch {

using index32 = std::uint32_t;

template <class T>
class cpu_codec final : public codec_impl {
 public:
  cpu_codec(const codec_settings& settings, const sidco::comm::wire_format& format,
            const sidco::comm::capacity_plan& plan)
      : settings_(settings),
        format_(format),
        plan_(plan),
        engine_(make_engine<T, index32>(settings.method, settings.options, settings.layout, layer_budget::per_layer)),
        payload_(at::zeros({std::int64_t(format.bytes())}, at::kByte)),
        size_(settings.layout.back().end()) {}

  at::Tensor encode(const at::Tensor& gradient, const c10::optional<at::Tensor>& residual,
                    const sidco::comm::wire_fields& fields) override {
    report_ = {};
    // Whatever fails here fails on this rank alone: the payload carries the error to every
    // rank, and the residual is as it was (compress changes nothing when it throws; after
    // it, the selected entries go back).
    std::span<T> r;
    bool compressed = false;
    try {
      check(gradient, "bucket");
      if (residual) {
        check(*residual, "residual");
        r = span_of<T>(*residual);
      }
      report_.compress = engine_->compress(span_of<const T>(gradient), settings_.density, r, sent_);
      compressed = true;
      report_.trimmed = sidco::comm::trim_to_capacity(sent_, settings_.layout, plan_, r);
      report_.compress.selected = sent_.size();
      report_.compress.density = double(sent_.size()) / double(size_);
      sidco::comm::pack(sent_, report_.trimmed, fields, format_, bytes_of(payload_));
    } catch (const std::exception& e) {
      report_.failed = true;
      if (compressed) sidco::comm::return_entries(sent_, r);
      sidco::comm::pack_failure<T, index32>(e, size_, fields, format_, bytes_of(payload_));
    }
    return payload_;
  }

  at::Tensor encode_failure(const std::string& message, const sidco::comm::wire_fields& fields) override {
    report_ = {};
    report_.failed = true;
    sidco::comm::pack_failure<T, index32>(sidco::runtime_error(message), size_, fields, format_, bytes_of(payload_));
    return payload_;
  }

  void decode(const std::vector<at::Tensor>& payloads, const at::Tensor& out,
              const c10::optional<at::Tensor>& residual) override {
    if (residual) check(*residual, "residual");
    try {
      check(out, "out");
      std::vector<std::span<const std::byte>> views;
      views.reserve(payloads.size());
      for (const at::Tensor& p : payloads) {
        check_cpu_tensor("payload", p);
        if (p.scalar_type() != at::kByte) sidco::throw_error("payload: dtype ", p.scalar_type(), " is not uint8");
        views.push_back(bytes_of(p));
      }
      report_.exchange = sidco::comm::decode<T, index32>(views, format_, span_of<T>(out));
    } catch (...) {
      // The exchange failed (on every rank alike, or here alone: a bad argument): what this
      // rank sent waits in its residual for the next step instead of being lost.
      if (residual) sidco::comm::return_to_residual<T, index32>(bytes_of(payload_), format_, span_of<T>(*residual));
      throw;
    }
  }

  std::vector<std::byte> save_layer(std::size_t i) const override { return engine_->save(i); }
  void load_layer(std::size_t i, std::span<const std::byte> bytes) override { engine_->load(i, bytes); }
  const codec_report& report() const override { return report_; }

 private:
  void check(const at::Tensor& t, const char* what) const {
    check_cpu_tensor(what, t);
    if (t.scalar_type() != settings_.dtype)
      sidco::throw_error(what, ": dtype ", t.scalar_type(), " is not the codec's ", settings_.dtype);
    if (std::size_t(t.numel()) != size_)
      sidco::throw_error(what, ": ", t.numel(), " values, the codec's layers add up to ", size_);
  }

  codec_settings settings_;
  sidco::comm::wire_format format_;
  sidco::comm::capacity_plan plan_;
  std::unique_ptr<engine<T, index32>> engine_;
  sidco::sparse_vector<T, index32> sent_;
  at::Tensor payload_;
  std::size_t size_;
  codec_report report_;
};

template <class T>
class cpu_compressor final : public compressor_impl {
 public:
  cpu_compressor(std::string method, sidco::methods::options options)
      : method_(std::move(method)), options_(options),
        whole_(make_engine<T, index32>(method_, options_, {}, layer_budget::shared)) {}

  std::tuple<at::Tensor, at::Tensor> compress(const at::Tensor& gradient, double density,
                                              const std::vector<std::int64_t>& layers,
                                              const c10::optional<at::Tensor>& residual) override {
    const std::size_t n = std::size_t(gradient.numel());
    if (n > std::size_t(std::numeric_limits<index32>::max()) + 1)
      sidco::throw_error("gradient: ", n, " values; sidco_torch addresses 2^32 (32-bit indices)");
    engine<T, index32>* e = whole_.get();
    if (!layers.empty()) {
      if (!layered_ || layers != layer_sizes_) {
        layered_ = make_engine<T, index32>(method_, options_, layout_of(layers, n), layer_budget::shared);
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

 private:
  std::string method_;
  sidco::methods::options options_;
  std::unique_ptr<engine<T, index32>> whole_, layered_;
  std::vector<std::int64_t> layer_sizes_;
  sidco::sparse_vector<T, index32> out_;
  sidco::compress_report last_;
};

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
