// The hook's reduce-scatter exchange (sidco/comm/reduce/core.hpp) for CPU buckets: a
// ReduceCodec's CPU side, the exchange core's three steps with the bucket's compress before:
//   reduce_encode   compress the bucket per tensor, split by owner into P blocks;
//   reduce_select   the indices this rank owns: the blocks it received, reduced and selected;
//   reduce_decode   every owner's selection into the bucket, what was not kept back into
//                   the residual.
#include <torch/custom_class.h>
#include <torch/library.h>

#include <ATen/ATen.h>

#include <algorithm>
#include <cstdint>
#include <exception>
#include <memory>
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
  using base::compress_, base::engine_, base::exchange_sent_, base::failed_, base::order_, base::settings_;

 public:
  reduce_impl(const codec_settings& settings, const std::vector<std::int64_t>& order, std::size_t ranks,
              std::size_t rank, const std::string& owner)
      : base(settings, order, ranks, rank, owner),
        blocks_(at::zeros({std::int64_t(this->block_bytes() * ranks)}, at::kByte)),
        selection_(at::zeros({std::int64_t(this->block_bytes())}, at::kByte)) {
    engine_ = make_cpu_engine<T>(settings.method, settings.options, settings.layout, layer_budget::per_layer);
  }

  at::Tensor encode(const at::Tensor& gradient, const c10::optional<at::Tensor>& residual,
                    const sidco::comm::wire_fields& fields) override {
    compress_ = {};
    failed_ = false;
    residual_ = {};
    sidco::comm::host_residual<T> bucket_residual;
    bucket_sink<sidco::comm::host_residual<T>> sink{order_, bucket_residual};
    try {
      check(gradient, "bucket");
      if (residual) {
        check(*residual, "residual");
        bucket_residual.values = span_of<T>(*residual);
      }
      compress_ = engine_->compress(span_of<const T>(gradient), settings_.density, bucket_residual.values, sent_);
    } catch (const std::exception& e) {
      // Compress changes nothing when it throws: the blocks carry the error to every rank.
      failed_ = true;
      this->with_core([&](auto& core) { core.pack_failure(e, fields, bytes_of(blocks_)); });
      return blocks_;
    }
    residual_ = bucket_residual.values;
    this->to_exchange(sent_);
    this->with_core([&](auto& core) { failed_ = !core.pack(exchange_sent_, sink, fields, bytes_of(blocks_)); });
    return blocks_;
  }

  at::Tensor encode_failure(const std::string& message, const sidco::comm::wire_fields& fields) override {
    compress_ = {};
    failed_ = true;
    residual_ = {};
    this->with_core([&](auto& core) { core.pack_failure(sidco::runtime_error(message), fields, bytes_of(blocks_)); });
    return blocks_;
  }

  at::Tensor select(const at::Tensor& received, const at::Tensor& out, const c10::optional<at::Tensor>& residual) override {
    check_cpu_tensor("received", received);
    const std::size_t bytes = this->block_bytes(), ranks = this->ranks();
    if (received.scalar_type() != at::kByte || std::size_t(received.numel()) != bytes * ranks)
      sidco::throw_error("received: ", received.numel(), " ", received.scalar_type(), " values, the exchange takes ",
                         bytes * ranks, " bytes");
    const auto all = bytes_of(received);
    std::vector<std::span<const std::byte>> views;
    for (std::size_t r = 0; r < ranks; ++r) views.push_back(all.subspan(r * bytes, bytes));
    this->select_or_refuse(views, bytes_of(selection_), out, residual);
    return selection_;
  }

  // out and the residual (the one given to encode) were checked by select, before round 2.
  void decode(const std::vector<at::Tensor>& selections, const at::Tensor& out, const c10::optional<at::Tensor>&) override {
    std::vector<std::span<const std::byte>> views;
    try {
      for (const at::Tensor& p : selections) {
        check_cpu_tensor("selection", p);
        if (p.scalar_type() != at::kByte) sidco::throw_error("selection: dtype ", p.scalar_type(), " is not uint8");
        views.push_back(bytes_of(p));
      }
    } catch (...) {
      this->with_core([](auto& core) { core.abandon(); });  // a caller's mistake: the next step still works
      throw;
    }
    sidco::comm::host_residual<T> bucket_residual{residual_};
    bucket_sink<sidco::comm::host_residual<T>> sink{order_, bucket_residual};
    this->with_core([&](auto& core) {
      core.apply(views, sink);
      const auto dense = span_of<T>(out);
      std::fill(dense.begin(), dense.end(), T(0));
      const auto global = core.global_selection();
      const auto updates = core.updates();
      for (std::size_t j = 0; j < global.size(); ++j) dense[order_.to_bucket(std::size_t(global[j]))] = updates[j];
    });
  }

 private:
  void check(const at::Tensor& t, const char* what) const override {
    check_cpu_tensor(what, t);
    if (t.scalar_type() != settings_.dtype)
      sidco::throw_error(what, ": dtype ", t.scalar_type(), " is not the codec's ", settings_.dtype);
    if (std::size_t(t.numel()) != this->size())
      sidco::throw_error(what, ": ", t.numel(), " values, the codec's layers add up to ", this->size());
  }

  at::Tensor blocks_, selection_;
  sidco::sparse_vector<T, index32> sent_;  // as compressed, in the bucket's order
  std::span<T> residual_;                  // this step's, given to encode
};

}  // namespace

std::unique_ptr<reduce_codec_impl> make_reduce_codec(const codec_settings& settings, const std::vector<std::int64_t>& order,
                                                     std::size_t ranks, std::size_t rank, const std::string& owner) {
  return with_value_type(settings.dtype, "bucket", [&](auto tag) -> std::unique_ptr<reduce_codec_impl> {
    return std::make_unique<reduce_impl<typename decltype(tag)::type>>(settings, order, ranks, rank, owner);
  });
}

}  // namespace sidco_torch
