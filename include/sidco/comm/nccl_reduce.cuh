// The reduce-scatter exchange (comm/reduce/core.hpp) of device buffers over NCCL: bytes per
// rank about 2 slack 8k per step whatever the number of ranks, where nccl_allreducer's
// all-gather moves (P - 1) of every rank's selection.
//
// Round 1 is a grouped ncclSend/ncclRecv of fixed-size blocks (one to each owner), round 2
// one ncclAllGather of the owners' selections: both of fixed size, so no count exchange
// comes first. In the compact codings (exchange_options::coding), or with
// exchange_options::exact_sizes, both rounds move messages of their own size instead
// (comm/reduce/frames.hpp: values narrowed, indices gap-coded, round 1's led by the step's
// digest, as the MPI two-hop and hook transports send them): each round's sizes go first
// (round 1: one word to each owner; round 2: one all-gathered word), then the messages
// (round 2's at the longest one's size, zeros after each).
// The steps between them are the exchange core's host code, the one the MPI
// and gloo transports run, on copies of O(k) bytes through page-locked memory; the device
// keeps the dense vectors and gets only the update's k entries and the entries going back
// into its residual. So every rank's update has the same bits as those transports' (the
// core is tested without a GPU in tests/wire_test.cpp; this transport in
// tests/cuda/nccl_reduce_test.cu, which only runs where a GPU is).
//
// Failures: a rank's problem (arguments, a compress that threw) travels in its blocks and is
// relayed by the owners, so every rank raises the same sidco::runtime_error after round 2,
// with every entry it sent back in its residual and the exchange as before the step. A
// runtime failure (a CUDA or NCCL call, a peer that died, no progress within the timeout)
// aborts the communicator (comm/nccl_link.cuh); create a new communicator and exchange on
// every rank.
#pragma once

#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <span>
#include <stdexcept>
#include <type_traits>
#include <utility>
#include <vector>

#include "sidco/backend/cuda/check.cuh"
#include "sidco/backend/cuda/half.cuh"
#include "sidco/comm/collective_wait.hpp"
#include "sidco/comm/nccl_link.cuh"
#include "sidco/comm/nccl_stage.cuh"
#include "sidco/comm/options.hpp"
#include "sidco/comm/reduce/core.hpp"
#include "sidco/comm/reduce/frames.hpp"
#include "sidco/comm/residual_sink.hpp"
#include "sidco/comm/setup.hpp"
#include "sidco/core/error.hpp"
#include "sidco/core/sparse_vector.hpp"
#include "sidco/core/state_io.hpp"
#include "sidco/memory/device.cuh"

namespace sidco::comm {

/// One tensor's (or one buffer of tensors') reduce-scatter exchange over NCCL, reused every
/// step; T is float, double, __half or __nv_bfloat16 (the host code runs on the host type of
/// the same bits, host_value_t<T>: the CPU transports' own code).
///
///   nccl_reduce_exchange<float> exchange(comm, layout, delta);   // collective
///   try {
///     compressor.compress(gradient, delta, sent, residual);      // backend::cuda
///   } catch (const std::exception& e) {
///     exchange.exchange_failed(e, step);                          // throws, as every rank does
///   }
///   exchange.exchange(sent, residual.values(), dense, step);      // dense: the same bits everywhere
///
/// Construction is collective and agrees on the payload's size (every rank throws the same
/// error otherwise). Every rank calls exchange (or exchange_failed) the same number of times.
/// sent is only read: the entries its blocks could not hold, and those the global selection
/// left out, are written back into residual (when given), so that per rank, bit for bit,
/// residual + applied contribution = gradient + old residual. With options.coding =
/// entry_coding::compact the values a rank sends are rounded to half their width
/// (compact8: to 8-bit codes; what rounding takes off goes into residual), each owner's
/// updates too (the rest in its carry, which save_state keeps), and both rounds move
/// messages of their own size (top of this file), as they do with options.exact_sizes in
/// the plain coding. Not thread-safe.
template <class T, class Index = std::uint32_t, class Policy = owner_sidco_e>
class nccl_reduce_exchange {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double> || std::is_same_v<T, __half> ||
                    std::is_same_v<T, __nv_bfloat16>,
                "nccl_reduce_exchange: float, double, __half or __nv_bfloat16 values");
  static_assert(requires { sizeof(Policy); },
                "nccl_reduce_exchange: the default owner policy, owner_sidco_e, is defined in <sidco/owners.hpp> "
                "(or <sidco/sidco.hpp>): include it, or name an owner policy of comm/owner.hpp");
  using H = host_value_t<T>;
  static_assert(sizeof(H) == sizeof(T));

 public:
  /// timeout: how long a host wait may see no completion before the communicator is
  /// aborted (zero: no limit; asynchronous NCCL errors abort it either way).
  nccl_reduce_exchange(ncclComm_t comm, std::vector<segment> layout, double delta, exchange_options options = {},
                       Policy policy = {}, cudaStream_t stream = nullptr,
                       std::chrono::milliseconds timeout = default_collective_timeout)
      : link_(comm, stream, timeout, "nccl_reduce_exchange") {
    for (auto* buffer : {&blocks_device_, &received_device_, &selection_device_, &selections_device_})
      buffer->use_stream(link_.stream());
    sizes_device_.use_stream(link_.stream());
    const std::size_t ranks = std::size_t(link_.ranks());
    exchange_setup mine{};
    try {
      core_ = reduce_core<H, Index, Policy>(layout, delta, ranks, std::size_t(link_.rank()), options, std::move(policy));
      const std::size_t bytes = core_.block_bytes();
      blocks_.resize(bytes * ranks);
      received_.resize(bytes * ranks);
      selection_.resize(bytes);
      selections_.resize(bytes * ranks);
      blocks_device_.resize(bytes * ranks);
      received_device_.resize(bytes * ranks);
      selection_device_.resize(bytes);
      selections_device_.resize(bytes * ranks);
      mine = setup_of<H, Index>(layout, core_.plan().format, core_.fields(0), options.slack);
      mine.coding = std::uint8_t(options.coding);
      mine.exact_sizes = options.exact_sizes;
      framed_ = options.exact_sizes || is_compact(options.coding);
    } catch (const std::exception& e) {
      mine = failed_setup(e, options.tag);
    }
    nccl_detail::agree_setup(link_, mine, remedy);
  }

  /// One tensor of size values.
  nccl_reduce_exchange(ncclComm_t comm, std::size_t size, double delta, exchange_options options = {},
                       Policy policy = {}, cudaStream_t stream = nullptr,
                       std::chrono::milliseconds timeout = default_collective_timeout)
      : nccl_reduce_exchange(comm, std::vector<segment>{{0, size}}, delta, options, std::move(policy), stream, timeout) {}

  nccl_reduce_exchange(const nccl_reduce_exchange&) = delete;
  nccl_reduce_exchange& operator=(const nccl_reduce_exchange&) = delete;

  int ranks() const { return link_.ranks(); }
  int rank() const { return link_.rank(); }
  const reduce_plan& plan() const { return core_.plan(); }
  /// The last global selection's indices, ascending (the same on every rank).
  std::span<const Index> global_selection() const { return core_.global_selection(); }
  Policy& policy() { return core_.policy(); }
  /// Whether a runtime failure aborted the communicator (see the top of this file).
  bool aborted() const { return link_.aborted(); }

  /// One step: sent (device memory, as the compressor left it) split into blocks, both
  /// rounds, dense (device memory, overwritten) = the global selection's updates, complete
  /// on the stream when this returns. residual (device memory, the exchange's size, or empty
  /// to drop what is not applied) gets back what of sent was not applied. On any rank's
  /// failure it throws sidco::runtime_error, the same on every rank, having written nothing
  /// to dense, every entry of sent back into residual, and the exchange as before the step.
  reduce_report exchange(const sparse_vector<T, Index, memory::device>& sent, memory::device::view<T> residual,
                         memory::device::view<T> dense, std::uint64_t step) {
    begin(step);
    const std::size_t size = core_.plan().size;
    // A buffer of the wrong size fails the step on every rank (it travels in the blocks);
    // a residual of the wrong size gets nothing back.
    const bool fits = dense.size() == size && (residual.empty() || residual.size() == size);
    residual_ = fits ? residual : memory::device::view<T>{};
    if (!fits) {
      const sidco::error wrong(sidco::detail::message("nccl_reduce_exchange: dense (", dense.size(), ") or residual (",
                                                      residual.size(), "): not the exchange's size ", size));
      core_.pack_failure(wrong, core_.fields(step), std::span<std::byte>(blocks_));
    } else {
      aborting_on_failure([&] { stage_.fetch(link_, sent, sent_); });
      core_.pack(sent_, staged_, core_.fields(step), std::span<std::byte>(blocks_));
    }
    return finish(dense);
  }

  /// For a rank whose compress threw: joins the rounds the others are in, so that none
  /// hangs, and throws (as every rank does) the error naming this rank and reason.
  [[noreturn]] void exchange_failed(const std::exception& reason, std::uint64_t step) {
    begin(step);
    residual_ = {};
    core_.pack_failure(reason, core_.fields(step), std::span<std::byte>(blocks_));
    finish({});
    sidco::detail::fail("nccl_reduce_exchange: rank ", rank(), " failed: ", reason.what());  // not reached
  }

  /// What a checkpoint needs to resume bit for bit: the owner policy's
  /// state (comm/reduce/state.hpp; the local compressor and residual are the caller's).
  void save_state(state_writer& out) const { core_.save_state(out); }
  void load_state(state_reader& in) { core_.load_state(in); }

 private:
  static constexpr const char* remedy = "create a new communicator and exchange on every rank";

  template <class F>
  void aborting_on_failure(F&& f) {
    try {
      link_.aborting_on_failure(f, remedy);
    } catch (const sidco::runtime_error&) {
      if (link_.aborted()) core_.abandon();
      throw;
    }
  }

  void begin(std::uint64_t step) {
    if (link_.aborted())
      sidco::detail::fail_at_run_time("nccl_reduce_exchange: the NCCL communicator was aborted by an earlier failure; ",
                                      remedy);
    staged_.clear();
    sent_.clear(core_.plan().size);
    step_fields_ = core_.fields(step);
  }

  // Each payload as a message of its own size (the compact coding, or exact_sizes).
  bool framed() const { return framed_; }

  // Both rounds, then the update; blocks_ holds this rank's blocks.
  reduce_report finish(memory::device::view<T> dense) {
    const std::size_t bytes = core_.block_bytes(), ranks = std::size_t(link_.ranks()), me = std::size_t(link_.rank());
    aborting_on_failure([&] { framed() ? all_to_all_framed(bytes, ranks, me) : all_to_all(bytes, ranks, me); });
    core_.select(views_of(received_, bytes, ranks), std::span<std::byte>(selection_));
    aborting_on_failure([&] { framed() ? all_gather_framed(bytes, ranks) : all_gather(bytes, ranks); });
    try {
      core_.apply(views_of(selections_, bytes, ranks), staged_);
    } catch (...) {
      aborting_on_failure([&] { write_staged(); });
      throw;
    }
    aborting_on_failure([&] {
      write_staged();
      SIDCO_CUDA(cudaMemsetAsync(dense.data(), 0, dense.size() * sizeof(T), link_.stream()));
      stage_.write(link_, core_.global_selection(), core_.updates(), dense);
    });
    reduce_report report = core_.report();
    if (framed()) report.bytes_sent = framed_sent_, report.bytes_received = framed_received_;
    return report;
  }

  static std::vector<std::span<const std::byte>> views_of(const std::vector<std::byte>& all, std::size_t bytes,
                                                          std::size_t ranks) {
    std::vector<std::span<const std::byte>> views(ranks);
    for (std::size_t r = 0; r < ranks; ++r) views[r] = std::span<const std::byte>(all).subspan(r * bytes, bytes);
    return views;
  }

  // Round 1: block r to rank r (this rank's own by a device copy), one from each rank.
  void all_to_all(std::size_t bytes, std::size_t ranks, std::size_t me) {
    link_.to_device(blocks_device_.data(), blocks_.data(), bytes * ranks);
    SIDCO_CUDA(cudaMemcpyAsync(received_device_.data() + me * bytes, blocks_device_.data() + me * bytes, bytes,
                               cudaMemcpyDeviceToDevice, link_.stream()));
    if (ranks > 1) {
      nccl_detail::link::group open_group;
      for (std::size_t r = 0; r < ranks; ++r) {
        if (r == me) continue;
        SIDCO_NCCL(ncclSend(blocks_device_.data() + r * bytes, bytes, ncclUint8, int(r), link_.comm(), link_.stream()));
        SIDCO_NCCL(ncclRecv(received_device_.data() + r * bytes, bytes, ncclUint8, int(r), link_.comm(), link_.stream()));
      }
      open_group.close();
    }
    link_.to_host(received_.data(), received_device_.data(), bytes * ranks);
  }

  // Round 2: every owner's selection to every rank.
  void all_gather(std::size_t bytes, std::size_t ranks) {
    link_.to_device(selection_device_.data(), selection_.data(), bytes);
    SIDCO_NCCL(ncclAllGather(selection_device_.data(), selections_device_.data(), bytes, ncclUint8, link_.comm(),
                             link_.stream()));
    link_.to_host(selections_.data(), selections_device_.data(), bytes * ranks);
  }

  // Round 1, framed: block r as a message (led by the step's digest, which its owner checks)
  // to rank r; the sizes first, one word to each owner. A message that cannot be read
  // becomes a failure payload naming its sender, which the owner relays (read_message).
  void all_to_all_framed(std::size_t bytes, std::size_t ranks, std::size_t me) {
    const wire_format& format = core_.plan().format;
    const std::uint64_t digest = fields_digest<H, Index>(step_fields_, core_.plan().size, format);
    messages_.clear();
    const std::vector<std::size_t> lengths = append_messages<H, Index>(blocks_, ranks, format,
                                                                       frame_kind_for(false, core_.coding()), &digest,
                                                                       messages_);
    std::vector<std::uint64_t> out_sizes(lengths.begin(), lengths.end()), out_at(ranks), in_sizes(ranks), in_at(ranks);
    for (std::size_t r = 1; r < ranks; ++r) out_at[r] = out_at[r - 1] + out_sizes[r - 1];
    sizes_device_.resize(2 * ranks);
    link_.to_device(sizes_device_.data(), out_sizes.data(), ranks * sizeof(std::uint64_t));
    if (ranks > 1) {
      nccl_detail::link::group open_group;
      for (std::size_t r = 0; r < ranks; ++r) {
        if (r == me) continue;
        SIDCO_NCCL(ncclSend(sizes_device_.data() + r, 1, ncclUint64, int(r), link_.comm(), link_.stream()));
        SIDCO_NCCL(ncclRecv(sizes_device_.data() + ranks + r, 1, ncclUint64, int(r), link_.comm(), link_.stream()));
      }
      open_group.close();
    }
    link_.to_host(in_sizes.data(), sizes_device_.data() + ranks, ranks * sizeof(std::uint64_t));
    in_sizes[me] = out_sizes[me];
    std::uint64_t total = 0;
    for (std::size_t r = 0; r < ranks; ++r) {
      // Beyond any message of this format: not this sidco's (the communicator is aborted).
      if (in_sizes[r] > sizeof digest + max_frame_bytes(format))
        throw std::runtime_error(sidco::detail::message("rank ", r, " announced a message of ", in_sizes[r],
                                                        " bytes, longer than any of this exchange's"));
      in_at[r] = total;
      total += in_sizes[r];
    }
    blocks_device_.resize(std::max<std::size_t>(messages_.size(), bytes * ranks));
    received_device_.resize(std::max<std::size_t>(total, bytes * ranks));
    link_.to_device(blocks_device_.data(), messages_.data(), messages_.size());
    SIDCO_CUDA(cudaMemcpyAsync(received_device_.data() + in_at[me], blocks_device_.data() + out_at[me],
                               out_sizes[me], cudaMemcpyDeviceToDevice, link_.stream()));
    if (ranks > 1) {
      nccl_detail::link::group open_group;
      for (std::size_t r = 0; r < ranks; ++r) {
        if (r == me) continue;
        SIDCO_NCCL(ncclSend(blocks_device_.data() + out_at[r], out_sizes[r], ncclUint8, int(r), link_.comm(),
                            link_.stream()));
        SIDCO_NCCL(ncclRecv(received_device_.data() + in_at[r], in_sizes[r], ncclUint8, int(r), link_.comm(),
                            link_.stream()));
      }
      open_group.close();
    }
    inbox_.resize(total);
    link_.to_host(inbox_.data(), received_device_.data(), total);
    framed_sent_ = messages_.size() - out_sizes[me] + (ranks - 1) * sizeof(std::uint64_t);
    framed_received_ = std::size_t(total - in_sizes[me]) + (ranks - 1) * sizeof(std::uint64_t);
    std::vector<std::span<const std::byte>> received(ranks);
    for (std::size_t r = 0; r < ranks; ++r)
      received[r] = std::span<const std::byte>(inbox_).subspan(in_at[r], in_sizes[r]);
    read_messages<H, Index>(received, detail::header_for<H, Index>(step_fields_, core_.plan().size, format), format,
                            frame_kind_for(false, core_.coding()), &digest, slots_of(received_, bytes));
  }

  // Round 2, framed: every owner's selection as a message, all-gathered at the longest one's
  // size (the sizes first, one word each); each read at its own size.
  void all_gather_framed(std::size_t bytes, std::size_t ranks) {
    const wire_format& format = core_.plan().format;
    messages_.clear();
    append_messages<H, Index>(selection_, 1, format, frame_kind_for(true, core_.coding()), nullptr, messages_);
    const std::vector<std::uint64_t> sizes = nccl_detail::all_gather_word(link_, sizes_device_, messages_.size());
    std::uint64_t longest = 0;
    for (std::size_t r = 0; r < ranks; ++r) {
      if (sizes[r] > max_frame_bytes(format))
        throw std::runtime_error(sidco::detail::message("rank ", r, " announced a selection of ", sizes[r],
                                                        " bytes, longer than any of this exchange's"));
      longest = std::max(longest, sizes[r]);
    }
    messages_.resize(longest, std::byte{0});
    selection_device_.resize(std::max<std::size_t>(longest, bytes));
    selections_device_.resize(std::max<std::size_t>(longest * ranks, bytes * ranks));
    link_.to_device(selection_device_.data(), messages_.data(), longest);
    SIDCO_NCCL(ncclAllGather(selection_device_.data(), selections_device_.data(), longest, ncclUint8, link_.comm(),
                             link_.stream()));
    inbox_.resize(longest * ranks);
    link_.to_host(inbox_.data(), selections_device_.data(), longest * ranks);
    framed_sent_ += (ranks - 1) * (longest + sizeof(std::uint64_t));  // a ring's share: P - 1 chunks a rank
    framed_received_ += (ranks - 1) * (longest + sizeof(std::uint64_t));
    std::vector<std::span<const std::byte>> received(ranks);
    for (std::size_t r = 0; r < ranks; ++r)
      received[r] = std::span<const std::byte>(inbox_).subspan(r * longest, sizes[r]);
    read_messages<H, Index>(received, detail::header_for<H, Index>(step_fields_, core_.plan().size, format), format,
                            frame_kind_for(true, core_.coding()), nullptr, slots_of(selections_, bytes));
  }

  // Slot r of all (payloads of bytes each), for read_messages.
  static auto slots_of(std::vector<std::byte>& all, std::size_t bytes) {
    return [&all, bytes](std::size_t r) { return std::span<std::byte>(all).subspan(r * bytes, bytes); };
  }

  // What goes back into the residual, in one go.
  void write_staged() {
    stage_.write(link_, std::span<const Index>(staged_.indices), std::span<const H>(staged_.values), residual_);
  }

  nccl_detail::link link_;
  reduce_core<H, Index, Policy> core_;
  std::vector<std::byte> blocks_, received_, selection_, selections_;
  std::vector<std::byte> messages_, inbox_;  // framed: this round's messages out and in
  wire_fields step_fields_{};
  bool framed_ = false;
  std::size_t framed_sent_ = 0, framed_received_ = 0;  // framed: this step's bytes on the wire
  memory::device_buffer<unsigned char> blocks_device_, received_device_, selection_device_, selections_device_;
  memory::device_buffer<std::uint64_t> sizes_device_;  // framed: the messages' sizes
  sparse_vector<H, Index> sent_;           // this step's sent entries, on the host
  staged_residual<H, Index> staged_;       // what goes back into the residual, this step
  memory::device::view<T> residual_;
  nccl_detail::host_stage<T, Index> stage_;
};

}  // namespace sidco::comm
