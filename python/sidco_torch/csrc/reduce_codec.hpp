// sidco_torch.ReduceCodec: one bucket's side of the reduce-scatter exchange
// (sidco/comm/reduce/core.hpp): its compressors per layer and the exchange core (owner
// policy, blocks, selection), on the bucket's device. The hook calls its three ops
// around its two collectives; the work is in cpu/reduce.cpp and, for CUDA buckets,
// cuda/reduce_codec.cuh. Every entry point holds the codec's lock, as Codec's do.
#pragma once

#include <torch/custom_class.h>

#include <ATen/ATen.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <tuple>
#include <utility>
#include <variant>
#include <vector>

#include <sidco/comm/reduce/frames.hpp>
#include <sidco/comm/reduce/hops.hpp>
#include <sidco/comm/reduce_scatter.hpp>
#include <sidco/core/state_io.hpp>
#include <sidco/owners.hpp>

#include "binding.hpp"
#include "classes.hpp"
#include "layer_order.hpp"

namespace sidco_torch {

/// One phase of the two-hop schedule as the hook posts it: the peers (group ranks) to send
/// to, the messages (uint8, one each), the peers to receive from, the most bytes each sends.
using hop_messages = std::tuple<std::vector<std::int64_t>, std::vector<at::Tensor>, std::vector<std::int64_t>,
                                std::vector<std::int64_t>>;

class reduce_codec_impl {
 public:
  virtual ~reduce_codec_impl() = default;
  virtual at::Tensor encode(const at::Tensor& gradient, const c10::optional<at::Tensor>& residual,
                            const sidco::comm::wire_fields& fields) = 0;
  virtual at::Tensor encode_failure(const std::string& message, const sidco::comm::wire_fields& fields) = 0;
  /// Round 2; out and residual are checked here, before the all-gather, so that a problem
  /// with them travels to every rank instead of failing this one alone.
  virtual at::Tensor select(const at::Tensor& received, const at::Tensor& out,
                            const c10::optional<at::Tensor>& residual) = 0;
  virtual void decode(const std::vector<at::Tensor>& selections, const at::Tensor& out,
                      const c10::optional<at::Tensor>& residual) = 0;
  virtual std::vector<std::byte> save_layer(std::size_t i) const = 0;
  virtual void load_layer(std::size_t i, std::span<const std::byte> bytes) = 0;
  virtual std::vector<std::byte> save_exchange() const = 0;
  virtual void load_exchange(std::span<const std::byte> bytes) = 0;
  virtual const sidco::comm::reduce_report& report() const = 0;
  virtual const sidco::compress_report& compress_report() const = 0;
  virtual bool failed() const = 0;
  /// This step's payloads as messages of their own size (comm/reduce/frames.hpp), for a
  /// transport that moves each at the size it uses: the P blocks (each led by the digest of
  /// the step's fields) or the selection (one, without). Returns the messages, one after
  /// another (uint8), and their sizes (int64), on the payloads' device (a CUDA codec frames
  /// on the host: the messages go through it).
  virtual std::vector<at::Tensor> frames(const at::Tensor& payloads, bool selection) = 0;
  /// Writes each message (sizes: one after another in bytes) back into its slot as the
  /// payload it carries; a message that cannot be read, or (blocks) at another digest,
  /// becomes a failure payload naming its sender. Selections may be followed by zeros.
  /// bytes and slots on the codec's device.
  virtual void unframe(const at::Tensor& bytes, const std::vector<std::int64_t>& sizes,
                       const std::vector<at::Tensor>& slots, bool selection) = 0;
  /// The two-hop schedule (comm/reduce/hops.hpp) over a transport the hook drives (gloo's
  /// send/recv): hops_first gives phase 1's messages for the P blocks (personal) or the
  /// selection (one for all), hops_second phase 2's from phase 1's received buffers (zeroed
  /// before the receive: a message lies at the front), and hops_finish writes every rank's
  /// payload for this rank into slots and returns the round's bytes [sent, received]. A
  /// message that cannot be read (cut short, at another digest) becomes a failure payload
  /// naming its sender. CPU payloads only.
  virtual hop_messages hops_first(const at::Tensor& payloads, bool selection) = 0;
  virtual hop_messages hops_second(const std::vector<at::Tensor>& received, bool selection) = 0;
  virtual std::vector<std::int64_t> hops_finish(const std::vector<at::Tensor>& received,
                                                const std::vector<at::Tensor>& slots, bool selection) = 0;
  /// The step's header fields, as encode was given them (what a frame leaves out).
  void set_step(const sidco::comm::wire_fields& fields) { step_fields_ = fields; }

 protected:
  sidco::comm::wire_fields step_fields_;
};

/// The owners a bucket may choose, by their registry names.
inline constexpr const char* owner_names = "sidco-e-exact or top-k";

/// What the CPU and CUDA reduce codecs hold and answer alike: the exchange core (on values
/// H, the host type of the bucket's), the layers' order, the local compressors (Engine).
template <class Engine, class H, class Index>
class reduce_codec_base : public reduce_codec_impl {
 protected:
  using sidco_e_core = sidco::comm::reduce_core<H, Index, sidco::comm::owner_sidco_e>;
  using top_k_core = sidco::comm::reduce_core<H, Index, sidco::comm::owner_top_k>;

 public:
  reduce_codec_base(const codec_settings& settings, const std::vector<std::int64_t>& order, std::size_t ranks,
                    std::size_t rank, const std::string& owner)
      : settings_(settings), order_(settings.layout, order), rank_(rank) {
    const auto& layout = order_.canonical_layout();
    sidco::comm::exchange_options options{settings.slack, sidco::comm::reduction::average, 0};
    options.coding = settings.coding;  // compact: values rounded at pack, narrowed in frames
    if (owner == sidco::comm::owner_top_k::name)
      core_.template emplace<top_k_core>(layout, settings.capacity_density, ranks, rank, options);
    else
      core_.template emplace<sidco_e_core>(layout, settings.capacity_density, ranks, rank, options);
  }

  std::vector<std::byte> save_layer(std::size_t i) const override { return engine_->save(i); }
  void load_layer(std::size_t i, std::span<const std::byte> bytes) override { engine_->load(i, bytes); }
  std::vector<std::byte> save_exchange() const override {
    return std::visit([](const auto& core) { return sidco::saved_state(core); }, core_);
  }
  void load_exchange(std::span<const std::byte> bytes) override {
    std::visit([&](auto& core) { sidco::load_whole_state(core, bytes); }, core_);
  }
  const sidco::comm::reduce_report& report() const override {
    return std::visit([](const auto& core) -> const auto& { return core.report(); }, core_);
  }

  std::vector<at::Tensor> frames(const at::Tensor& payloads, bool selection) override {
    const std::size_t count = check_payloads(payloads, selection);
    std::vector<std::byte> out;
    const std::vector<std::int64_t> sizes = frame_payloads(bytes_of(payloads), count, selection, out);
    at::Tensor messages = at::empty({std::int64_t(out.size())}, at::kByte);
    if (!out.empty()) std::memcpy(messages.data_ptr(), out.data(), out.size());
    return {messages, at::tensor(sizes, at::kLong)};
  }

  void unframe(const at::Tensor& bytes, const std::vector<std::int64_t>& sizes, const std::vector<at::Tensor>& slots,
               bool selection) override {
    check_cpu_tensor("frames", bytes);
    if (bytes.scalar_type() != at::kByte) sidco::throw_error("frames: dtype ", bytes.scalar_type(), " is not uint8");
    check_unframe(sizes, slots.size());
    for (std::size_t r = 0; r < slots.size(); ++r) check_slot(slots[r], r);
    unframe_payloads(bytes_of(bytes), sizes, selection, [&](std::size_t r) { return bytes_of(slots[r]); });
  }

  hop_messages hops_first(const at::Tensor& payloads, bool selection) override {
    const std::size_t count = check_payloads(payloads, selection);
    if (!hops_) hops_.emplace(ranks(), rank_, sidco::comm::max_frame_bytes(plan().format), false);
    sidco::comm::append_frames<H, Index>(bytes_of(payloads), count, plan().format, kind_of(selection), hop_frames_,
                                         hop_spans_);
    const std::uint64_t digest = sidco::comm::fields_digest<H, Index>(step_fields_, size(), plan().format);
    // Selections: round 1 compared every rank's digest (see two_hop_router::first).
    const auto& out = hops_->first(hop_spans_, !selection, digest, !selection);
    return messages(out, hops_->first_receives());
  }

  hop_messages hops_second(const std::vector<at::Tensor>& received, bool selection) override {
    if (!hops_) sidco::throw_error("hops_second: no phase 1 (hops_first) before it");
    hop_inbox_ = received;  // phase 2 forwards from these: kept until hops_finish
    const auto& out = hops_->second(spans_of(hop_inbox_, hops_->first_receives().size()), plan().format,
                                    kind_of(selection), failure_writer());
    return messages(out, hops_->second_receives());
  }

  std::vector<std::int64_t> hops_finish(const std::vector<at::Tensor>& received, const std::vector<at::Tensor>& slots,
                                        bool selection) override {
    if (!hops_) sidco::throw_error("hops_finish: no phase 1 (hops_first) before it");
    if (slots.size() != ranks()) sidco::throw_error("hops_finish: ", slots.size(), " slots for ", ranks(), " ranks");
    for (std::size_t r = 0; r < slots.size(); ++r) check_slot(slots[r], r);
    const auto frames = hops_->finish(spans_of(received, hops_->second_receives().size()), plan().format,
                                      kind_of(selection), failure_writer());
    sidco::comm::read_frames<H, Index>(frames, sidco::comm::detail::header_for<H, Index>(step_fields_, size(), plan().format),
                                       plan().format, kind_of(selection),
                                       [&](std::size_t s) { return bytes_of(slots[s]); });
    hop_inbox_.clear();
    return {std::int64_t(hops_->bytes_sent()), std::int64_t(hops_->bytes_received())};
  }

  const sidco::compress_report& compress_report() const override { return compress_; }
  bool failed() const override { return failed_; }

 protected:
  /// f(core) on the exchange core, whichever owner it has.
  template <class F>
  decltype(auto) with_core(F&& f) {
    return std::visit(std::forward<F>(f), core_);
  }
  const sidco::comm::reduce_plan& plan() const {
    return std::visit([](const auto& core) -> const auto& { return core.plan(); }, core_);
  }
  /// What a frame carries: blocks their values narrowed in the compact coding, selections
  /// their trimmed counts (comm/reduce/frames.hpp).
  sidco::comm::frame_kind kind_of(bool selection) const {
    return sidco::comm::frame_kind_for(selection, std::visit([](const auto& core) { return core.coding(); }, core_));
  }
  std::size_t size() const { return plan().size; }
  std::size_t block_bytes() const { return plan().format.bytes(); }
  std::size_t ranks() const { return plan().ranks; }

  /// count payloads (host bytes, one after another) as messages of their own size into out
  /// (round 1's blocks each led by the step's digest); returns their sizes.
  std::vector<std::int64_t> frame_payloads(std::span<const std::byte> payloads, std::size_t count, bool selection,
                                           std::vector<std::byte>& out) const {
    const std::uint64_t digest = sidco::comm::fields_digest<H, Index>(step_fields_, size(), plan().format);
    const auto sizes = sidco::comm::append_messages<H, Index>(payloads, count, plan().format, kind_of(selection),
                                                              selection ? nullptr : &digest, out);
    return std::vector<std::int64_t>(sizes.begin(), sizes.end());
  }

  /// The messages in bytes (host, sizes[r] bytes from rank r, one after another) into
  /// slot(r), a payload's host bytes.
  template <class Slot>
  void unframe_payloads(std::span<const std::byte> bytes, const std::vector<std::int64_t>& sizes, bool selection,
                        Slot&& slot) const {
    std::vector<std::span<const std::byte>> messages;
    std::size_t at = 0;
    for (std::size_t r = 0; r < sizes.size(); ++r) {
      if (sizes[r] < 0 || at + std::size_t(sizes[r]) > bytes.size())
        sidco::throw_error("unframe: message ", r, " of ", sizes[r], " bytes runs past the ", bytes.size(),
                           " received");
      messages.push_back(bytes.subspan(at, std::size_t(sizes[r])));
      at += std::size_t(sizes[r]);
    }
    const std::uint64_t digest = sidco::comm::fields_digest<H, Index>(step_fields_, size(), plan().format);
    const auto header = sidco::comm::detail::header_for<H, Index>(step_fields_, size(), plan().format);
    sidco::comm::read_messages<H, Index>(messages, header, plan().format, kind_of(selection),
                                         selection ? nullptr : &digest, slot);
  }

  // Throws unless there are a size and a slot for each rank.
  void check_unframe(const std::vector<std::int64_t>& sizes, std::size_t slots) const {
    if (sizes.size() != slots || slots != ranks())
      sidco::throw_error("unframe: ", sizes.size(), " sizes and ", slots, " slots for ", ranks(), " ranks");
  }

  // A frame saying that rank `sender`'s message could not be read.
  sidco::comm::two_hop_router::failure_writer failure_writer() {
    return sidco::comm::message_failure<H, Index>(rank_, size(), step_fields_, plan().format, failure_scratch_);
  }

  // How many payloads `payloads` holds (P blocks, or one selection): throws when it is not that.
  std::size_t check_payloads(const at::Tensor& payloads, bool selection) const {
    check_cpu_tensor("payloads", payloads);
    return payload_count(payloads, selection);
  }

  // As check_payloads, on any device (the caller checks that).
  std::size_t payload_count(const at::Tensor& payloads, bool selection) const {
    const std::size_t bytes = block_bytes(), count = selection ? 1 : ranks();
    if (payloads.scalar_type() != at::kByte || std::size_t(payloads.numel()) != bytes * count)
      sidco::throw_error("payloads: ", payloads.numel(), " ", payloads.scalar_type(), " values, ", count,
                         " payloads take ", bytes * count, " bytes");
    return count;
  }

  // Throws unless slot (rank r's) is a CPU payload's room: contiguous uint8 of block_bytes().
  void check_slot(const at::Tensor& slot, std::size_t r) const {
    check_cpu_tensor("slot", slot);
    check_slot_bytes(slot, r);
  }

  // As check_slot, on any device (the caller checks that).
  void check_slot_bytes(const at::Tensor& slot, std::size_t r) const {
    const std::size_t payload = block_bytes();
    if (slot.scalar_type() != at::kByte || std::size_t(slot.numel()) != payload || !slot.is_contiguous())
      sidco::throw_error("slot ", r, ": ", slot.numel(), " ", slot.scalar_type(), " values, a payload takes ", payload,
                         " contiguous bytes");
  }

  static std::vector<std::span<const std::byte>> spans_of(const std::vector<at::Tensor>& received, std::size_t count) {
    if (received.size() != count) sidco::throw_error("hops: ", received.size(), " messages received, ", count, " posted");
    std::vector<std::span<const std::byte>> out;
    for (const at::Tensor& t : received) {
      check_cpu_tensor("received", t);
      if (t.scalar_type() != at::kByte || !t.is_contiguous())
        sidco::throw_error("received: a ", t.scalar_type(), " tensor, not contiguous uint8");
      out.push_back(bytes_of(t));
    }
    return out;
  }

  static hop_messages messages(const std::vector<sidco::comm::two_hop_router::outgoing>& out,
                               const std::vector<sidco::comm::two_hop_router::incoming>& in) {
    hop_messages result;
    for (const auto& m : out) {
      std::get<0>(result).push_back(std::int64_t(m.peer));
      at::Tensor t = at::empty({std::int64_t(m.bytes.size())}, at::kByte);
      if (!m.bytes.empty()) std::memcpy(t.data_ptr(), m.bytes.data(), m.bytes.size());
      std::get<1>(result).push_back(t);
    }
    for (const auto& r : in) {
      std::get<2>(result).push_back(std::int64_t(r.peer));
      std::get<3>(result).push_back(std::int64_t(r.most));
    }
    return result;
  }

  /// Whether t is a tensor this codec takes as what (dtype, size, device): throws otherwise.
  virtual void check(const at::Tensor& t, const char* what) const = 0;

  /// Round 2 into selection from the blocks received (rank order), or, when out or the
  /// residual is wrong on this rank, that problem in its place (every rank raises it).
  void select_or_refuse(std::span<const std::span<const std::byte>> received, std::span<std::byte> selection,
                        const at::Tensor& out, const c10::optional<at::Tensor>& residual) {
    std::string problem;
    try {
      check(out, "out");
      if (residual) check(*residual, "residual");
    } catch (const std::exception& e) {
      problem = e.what();
    }
    const sidco::error local(problem);
    with_core([&](auto& core) { core.select(received, selection, problem.empty() ? nullptr : &local); });
  }

  /// The bucket's selection (bucket indices) as the exchange orders it: into exchange_sent_.
  void to_exchange(const sidco::sparse_vector<H, Index>& bucket_sent) {
    if (order_.identity()) exchange_sent_ = bucket_sent;
    else order_.to_exchange(bucket_sent, exchange_sent_);
  }

  codec_settings settings_;
  layer_order order_;
  std::size_t rank_ = 0;
  std::variant<sidco_e_core, top_k_core> core_;
  // The two-hop schedule's router and this round's frames (kept until the round ends).
  std::optional<sidco::comm::two_hop_router> hops_;
  std::vector<std::byte> hop_frames_, failure_scratch_;
  std::vector<std::span<const std::byte>> hop_spans_;
  std::vector<at::Tensor> hop_inbox_;
  std::unique_ptr<Engine> engine_;
  sidco::sparse_vector<H, Index> exchange_sent_;  // this step's selection, in the exchange's order
  sidco::compress_report compress_;
  bool failed_ = false;
};

std::unique_ptr<reduce_codec_impl> make_reduce_codec(const codec_settings& settings, const std::vector<std::int64_t>& order,
                                                     std::size_t ranks, std::size_t rank, const std::string& owner);

/// Made by cuda/ops.cu, which registers it when the library is built with CUDA.
using cuda_reduce_codec_factory = std::unique_ptr<reduce_codec_impl> (*)(const codec_settings& settings,
                                                                         const std::vector<std::int64_t>& order,
                                                                         std::size_t ranks, std::size_t rank,
                                                                         const std::string& owner,
                                                                         const at::Device& device);
void register_cuda_reduce_codec(cuda_reduce_codec_factory factory);

class ReduceCodec : public torch::CustomClassHolder {
 public:
  /// layer_sizes: the bucket's layers as the bucket holds them; order: the exchange's order
  /// of them (order[c] is the layer at position c; empty: the bucket's order); ranks and
  /// rank: the process group's; owner: "sidco-e-exact" or "top-k"; capacity_density: as
  /// Codec's; device: the bucket's ("cpu", "cuda:0", ...); wire: "plain", "compact"
  /// (values rounded to half their width, the rest kept in the residual, and sent narrowed
  /// in the frames of both rounds; a CUDA codec frames on the host) or "compact8" (rounded
  /// to 8-bit codes, sent a byte each).
  ReduceCodec(std::string method, c10::Dict<std::string, double> options, std::vector<std::int64_t> layer_sizes,
              std::vector<std::int64_t> order, std::string dtype, double density, double slack, std::int64_t ranks,
              std::int64_t rank, std::string owner, double capacity_density, std::string device, std::string wire);

  std::int64_t block_bytes() const { return std::int64_t(plan_.format.bytes()); }
  std::int64_t capacity() const { return std::int64_t(plan_.capacity); }
  std::int64_t target() const { return std::int64_t(plan_.target); }
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
at::Tensor reduce_select(const at::Tensor& received, const at::Tensor& out, const c10::optional<at::Tensor>& residual,
                         const c10::intrusive_ptr<ReduceCodec>& codec);
at::Tensor reduce_decode(const std::vector<at::Tensor>& selections, const at::Tensor& out,
                         const c10::optional<at::Tensor>& residual, const c10::intrusive_ptr<ReduceCodec>& codec);

}  // namespace sidco_torch
