// The hook's reduce-scatter exchange (sidco/comm/reduce_scatter.hpp) for CPU buckets: a
// ReduceCodec's CPU side and the three ops the hook calls around its two collectives:
//   reduce_encode   compress the bucket per tensor, split by region into P blocks;
//   reduce_select   this rank's region: the blocks it received, reduced and selected;
//   reduce_decode   every owner's selection into the bucket, what was not kept back into
//                   the residual, the regions balanced for the next step.
#include <torch/custom_class.h>
#include <torch/library.h>

#include <ATen/ATen.h>

#include <cstdint>
#include <cstring>
#include <exception>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include <sidco/comm/reduce_scatter.hpp>
#include <sidco/core/half.hpp>

#include "../binding.hpp"
#include "../classes.hpp"
#include "../engine.hpp"
#include "../reduce_codec.hpp"

namespace sidco_torch {
namespace {

using index32 = std::uint32_t;

template <class T>
class reduce_impl final : public reduce_codec_base<engine<T, index32>, T, index32> {
  using base = reduce_codec_base<engine<T, index32>, T, index32>;
  using base::compress_, base::engine_, base::failed_, base::fields_, base::global_, base::plan_, base::regions_,
      base::report_, base::settings_;

 public:
  reduce_impl(const codec_settings& settings, const sidco::comm::reduce_plan& plan, std::size_t rank,
              const std::string& owner)
      : base(settings, plan, rank, owner),
        blocks_(at::zeros({std::int64_t(plan.format.bytes() * plan.ranks)}, at::kByte)),
        selection_(at::zeros({std::int64_t(plan.format.bytes())}, at::kByte)) {
    engine_ = make_engine<T, index32>(settings.method, settings.options, settings.layout, layer_budget::per_layer);
  }

  at::Tensor encode(const at::Tensor& gradient, const c10::optional<at::Tensor>& residual,
                    const sidco::comm::wire_fields& fields) override {
    report_ = {};
    fields_ = fields;
    sent_.clear(plan_.size);
    residual_ = {};
    bool compressed = false;
    try {
      check(gradient, "bucket");
      if (residual) {
        check(*residual, "residual");
        residual_ = span_of<T>(*residual);
      }
      compress_ = engine_->compress(span_of<const T>(gradient), settings_.density, residual_, sent_);
      compressed = true;
      report_.trimmed = sidco::comm::pack_blocks(sent_, regions_, plan_, fields, residual_, bytes_of(blocks_));
      report_.sent = sent_.size();
    } catch (const std::exception& e) {
      failed_ = true;
      if (compressed) sidco::comm::return_entries(sent_, residual_);
      sent_.clear(plan_.size);
      sidco::comm::pack_failed_blocks<T, index32>(e, plan_, fields, bytes_of(blocks_));
      return blocks_;
    }
    failed_ = false;
    return blocks_;
  }

  at::Tensor encode_failure(const std::string& message, const sidco::comm::wire_fields& fields) override {
    report_ = {};
    fields_ = fields;
    failed_ = true;
    sent_.clear(plan_.size);
    residual_ = {};
    sidco::comm::pack_failed_blocks<T, index32>(sidco::runtime_error(message), plan_, fields, bytes_of(blocks_));
    return blocks_;
  }

  at::Tensor select(const at::Tensor& received) override {
    check_cpu_tensor("received", received);
    const std::size_t bytes = plan_.format.bytes();
    if (received.scalar_type() != at::kByte || std::size_t(received.numel()) != bytes * plan_.ranks)
      sidco::throw_error("received: ", received.numel(), " ", received.scalar_type(), " values, the exchange takes ",
                         bytes * plan_.ranks, " bytes");
    const auto all = bytes_of(received);
    std::vector<std::span<const std::byte>> views;
    for (std::size_t r = 0; r < plan_.ranks; ++r) views.push_back(all.subspan(r * bytes, bytes));
    this->select_owned(views, bytes_of(selection_));
    return selection_;
  }

  void decode(const std::vector<at::Tensor>& selections, const at::Tensor& out,
              const c10::optional<at::Tensor>& residual) override {
    std::span<T> r;
    if (residual) {
      check(*residual, "residual");
      r = span_of<T>(*residual);
    }
    std::vector<std::span<const std::byte>> views;
    try {
      check(out, "out");
      for (const at::Tensor& p : selections) {
        check_cpu_tensor("selection", p);
        if (p.scalar_type() != at::kByte) sidco::throw_error("selection: dtype ", p.scalar_type(), " is not uint8");
        views.push_back(bytes_of(p));
      }
    } catch (...) {
      sidco::comm::return_entries(sent_, r);
      throw;
    }
    this->report_exchange();
    sidco::comm::apply_selections<T, index32>(views, regions_, plan_, sent_, r, span_of<T>(out), global_, report_);
    this->rebalance();
  }

 private:
  void check(const at::Tensor& t, const char* what) const {
    check_cpu_tensor(what, t);
    if (t.scalar_type() != settings_.dtype)
      sidco::throw_error(what, ": dtype ", t.scalar_type(), " is not the codec's ", settings_.dtype);
    if (std::size_t(t.numel()) != plan_.size)
      sidco::throw_error(what, ": ", t.numel(), " values, the codec's layers add up to ", plan_.size);
  }

  at::Tensor blocks_, selection_;
  sidco::sparse_vector<T, index32> sent_;
  std::span<T> residual_;
};

}  // namespace

std::unique_ptr<reduce_codec_impl> make_reduce_codec(const codec_settings& settings, const sidco::comm::reduce_plan& plan,
                                                     std::size_t rank, const std::string& owner) {
  return with_value_type(settings.dtype, "bucket", [&](auto tag) -> std::unique_ptr<reduce_codec_impl> {
    return std::make_unique<reduce_impl<typename decltype(tag)::type>>(settings, plan, rank, owner);
  });
}

}  // namespace sidco_torch
