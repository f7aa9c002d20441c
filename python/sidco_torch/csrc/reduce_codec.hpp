// sidco_torch.ReduceCodec: one bucket's side of the reduce-scatter exchange
// (sidco/comm/reduce_scatter.hpp): its compressors per layer, its regions and owner policy,
// its blocks and selection, on the bucket's device. The work is in cpu/reduce.cpp and, for
// CUDA buckets, cuda/reduce_codec.cuh; every entry point holds the codec's lock, as Codec's do.
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
#include <sidco/core/state_io.hpp>

#include "classes.hpp"

namespace sidco_torch {

/// A reduce codec's exchange state (its regions and owner policy) as checkpoints carry it,
/// the same bytes on every device.
inline std::vector<std::byte> save_exchange_state(const sidco::comm::regions& regions,
                                                  const sidco::comm::owner_sidco_e& owner) {
  sidco::state_writer out;
  out.name("reduce_codec");
  out.word(regions.bounds().size());
  for (std::size_t b : regions.bounds()) out.word(b);
  owner.save_state(out);
  return out.take();
}

/// Reads what save_exchange_state wrote; regions and owner change only when all of it reads.
inline void load_exchange_state(std::span<const std::byte> bytes, const sidco::comm::reduce_plan& plan,
                                sidco::comm::regions& regions, sidco::comm::owner_sidco_e& owner) {
  sidco::state_reader in(bytes);
  in.expect("reduce_codec");
  const std::uint64_t count = in.word("reduce_codec: bounds");
  if (count != plan.ranks + 1)
    sidco::throw_error("reduce_codec: the state has ", count, " region bounds, this exchange ", plan.ranks + 1);
  std::vector<std::size_t> bounds(count);
  for (auto& b : bounds) b = std::size_t(in.word("reduce_codec: bound"));
  auto loaded = sidco::comm::regions::from_bounds(std::move(bounds), plan.size);
  auto loaded_owner = owner;
  loaded_owner.load_state(in);
  in.finish();
  regions = std::move(loaded);
  owner = std::move(loaded_owner);
}

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

/// What the CPU and CUDA reduce codecs hold and answer alike: the plan, this rank, the
/// owner policy and its workspace, the regions, the last step's reports and the local
/// compressors (Engine, on values H, the host type of the bucket's).
template <class Engine, class H, class Index>
class reduce_codec_base : public reduce_codec_impl {
 public:
  reduce_codec_base(const codec_settings& settings, const sidco::comm::reduce_plan& plan, std::size_t rank,
                    const std::string& owner)
      : settings_(settings),
        plan_(plan),
        rank_(rank),
        exact_owner_(owner == "top-k"),
        regions_(sidco::comm::regions::even(plan.size, plan.ranks)) {}

  std::vector<std::byte> save_layer(std::size_t i) const override { return engine_->save(i); }
  void load_layer(std::size_t i, std::span<const std::byte> bytes) override { engine_->load(i, bytes); }
  std::vector<std::byte> save_exchange() const override { return save_exchange_state(regions_, owner_); }
  void load_exchange(std::span<const std::byte> bytes) override { load_exchange_state(bytes, plan_, regions_, owner_); }
  std::vector<std::int64_t> bounds() const override { return {regions_.bounds().begin(), regions_.bounds().end()}; }
  const sidco::comm::reduce_report& report() const override { return report_; }
  const sidco::compress_report& compress_report() const override { return compress_; }
  bool failed() const override { return failed_; }

 protected:
  // The owner's selection of this rank's region from the blocks it received: by
  // owner_sidco_e (whose state goes on step to step) or, for owner "top-k", exact Top-k.
  void select_owned(std::span<const std::span<const std::byte>> blocks, std::span<std::byte> selection) {
    if (exact_owner_) {
      sidco::comm::owner_top_k top_k;
      sidco::comm::select_region<H, Index>(blocks, regions_, rank_, plan_, fields_, top_k, selection, report_, reduced_);
    } else {
      sidco::comm::select_region<H, Index>(blocks, regions_, rank_, plan_, fields_, owner_, selection, report_,
                                           reduced_);
    }
  }

  // A decode's totals in the report (before the global selection is read).
  void report_exchange() {
    report_.ranks = int(plan_.ranks);
    report_.target = plan_.target;
    report_.bytes_sent = report_.bytes_received = 2 * (plan_.ranks - 1) * plan_.format.bytes();
  }

  // The next step's regions, from this step's global selection.
  void rebalance() { regions_ = sidco::comm::regions::balanced<Index>(global_, plan_.size, plan_.ranks); }

  codec_settings settings_;
  sidco::comm::reduce_plan plan_;
  std::size_t rank_;
  bool exact_owner_;
  std::unique_ptr<Engine> engine_;
  sidco::comm::owner_sidco_e owner_;
  sidco::comm::regions regions_;
  sidco::comm::owner_workspace<H, Index> reduced_;  // the owner's workspace, kept from step to step
  std::vector<Index> global_;  // the last global selection's indices
  sidco::comm::wire_fields fields_;
  sidco::comm::reduce_report report_;
  sidco::compress_report compress_;
  bool failed_ = false;
};

std::unique_ptr<reduce_codec_impl> make_reduce_codec(const codec_settings& settings, const sidco::comm::reduce_plan& plan,
                                                     std::size_t rank, const std::string& owner);

/// Made by cuda/ops.cu, which registers it when the library is built with CUDA.
using cuda_reduce_codec_factory = std::unique_ptr<reduce_codec_impl> (*)(const codec_settings& settings,
                                                                         const sidco::comm::reduce_plan& plan,
                                                                         std::size_t rank, const std::string& owner,
                                                                         const at::Device& device);
void register_cuda_reduce_codec(cuda_reduce_codec_factory factory);

class ReduceCodec : public torch::CustomClassHolder {
 public:
  /// ranks and rank: the process group's; owner: "sidco-e" (default) or "top-k";
  /// capacity_density: as Codec's; device: the bucket's ("cpu", "cuda:0", ...).
  ReduceCodec(std::string method, c10::Dict<std::string, double> options, std::vector<std::int64_t> layer_sizes,
              std::string dtype, double density, double slack, std::int64_t ranks, std::int64_t rank,
              std::string owner, double capacity_density, std::string device);

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

/// The ops (registered per dispatch key by cpu/ops.cpp and cuda/ops.cu): each runs on the
/// codec's device, and a tensor on another device is an error naming it.
at::Tensor reduce_encode(const at::Tensor& gradient, const c10::optional<at::Tensor>& residual,
                         const c10::intrusive_ptr<ReduceCodec>& codec, std::int64_t tag, std::int64_t sequence);
at::Tensor reduce_encode_failure(const at::Tensor& gradient, const c10::intrusive_ptr<ReduceCodec>& codec,
                                 std::string message, std::int64_t tag, std::int64_t sequence);
at::Tensor reduce_select(const at::Tensor& received, const c10::intrusive_ptr<ReduceCodec>& codec);
at::Tensor reduce_decode(const std::vector<at::Tensor>& selections, const at::Tensor& out,
                         const c10::optional<at::Tensor>& residual, const c10::intrusive_ptr<ReduceCodec>& codec);

}  // namespace sidco_torch
