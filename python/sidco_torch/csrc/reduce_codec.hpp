// sidco_torch.ReduceCodec: one CPU bucket's side of the reduce-scatter exchange
// (sidco/comm/reduce_scatter.hpp): its compressors per layer, its regions and owner policy,
// its blocks and selection. The work is in cpu/reduce.cpp; every entry point holds the
// codec's lock, as Codec's do.
#pragma once

#include <torch/custom_class.h>

#include <ATen/ATen.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include <sidco/comm/reduce_scatter.hpp>

#include "classes.hpp"

namespace sidco_torch {

class reduce_codec_impl {
 public:
  virtual ~reduce_codec_impl() = default;
  virtual at::Tensor encode(const at::Tensor& gradient, const c10::optional<at::Tensor>& residual,
                            const sidco::comm::wire_fields& fields) = 0;
  virtual at::Tensor encode_failure(const std::string& message, const sidco::comm::wire_fields& fields) = 0;
  virtual at::Tensor select(const at::Tensor& received) = 0;
  virtual void decode(const std::vector<at::Tensor>& selections, const at::Tensor& out,
                      const c10::optional<at::Tensor>& residual) = 0;
  virtual std::vector<std::byte> save_layer(std::size_t i) const = 0;
  virtual void load_layer(std::size_t i, std::span<const std::byte> bytes) = 0;
  virtual std::vector<std::byte> save_exchange() const = 0;
  virtual void load_exchange(std::span<const std::byte> bytes) = 0;
  virtual std::vector<std::int64_t> bounds() const = 0;
  virtual const sidco::comm::reduce_report& report() const = 0;
  virtual const sidco::compress_report& compress_report() const = 0;
  virtual bool failed() const = 0;
};

std::unique_ptr<reduce_codec_impl> make_reduce_codec(const codec_settings& settings, const sidco::comm::reduce_plan& plan,
                                                     std::size_t rank, const std::string& owner);

class ReduceCodec : public torch::CustomClassHolder {
 public:
  /// ranks and rank: the process group's; owner: "sidco-e" (default) or "top-k";
  /// capacity_density: as Codec's.
  ReduceCodec(std::string method, c10::Dict<std::string, double> options, std::vector<std::int64_t> layer_sizes,
              std::string dtype, double density, double slack, std::int64_t ranks, std::int64_t rank,
              std::string owner, double capacity_density);

  std::int64_t block_bytes() const { return std::int64_t(plan_.format.bytes()); }
  std::int64_t capacity() const { return std::int64_t(plan_.capacity); }
  std::int64_t target() const { return std::int64_t(plan_.target); }
  std::vector<std::int64_t> bounds() const;
  c10::Dict<std::string, double> report() const;
  at::Tensor layer_state(std::int64_t layer) const;
  void load_layer_state(std::int64_t layer, const at::Tensor& state);
  at::Tensor exchange_state() const;
  void load_exchange_state(const at::Tensor& state);

  reduce_codec_impl& impl() const { return *impl_; }
  const codec_settings& settings() const { return settings_; }
  std::unique_lock<std::mutex> lock() const { return std::unique_lock<std::mutex>(mutex_); }

 private:
  std::size_t layer_index(std::int64_t layer) const;

  codec_settings settings_;
  sidco::comm::reduce_plan plan_;
  std::unique_ptr<reduce_codec_impl> impl_;
  mutable std::mutex mutex_;
};

/// The ops (CPU dispatch key, cpu/ops.cpp registers them).
at::Tensor reduce_encode(const at::Tensor& gradient, const c10::optional<at::Tensor>& residual,
                         const c10::intrusive_ptr<ReduceCodec>& codec, std::int64_t tag, std::int64_t sequence);
at::Tensor reduce_encode_failure(const at::Tensor& gradient, const c10::intrusive_ptr<ReduceCodec>& codec,
                                 std::string message, std::int64_t tag, std::int64_t sequence);
at::Tensor reduce_select(const at::Tensor& received, const c10::intrusive_ptr<ReduceCodec>& codec);
at::Tensor reduce_decode(const std::vector<at::Tensor>& selections, const at::Tensor& out,
                         const c10::optional<at::Tensor>& residual, const c10::intrusive_ptr<ReduceCodec>& codec);

}  // namespace sidco_torch
