// The all-gather exchange (comm/allgather/core.hpp) of device buffers over NCCL: every rank
// trims its selection to the agreed capacity (what does not fit goes back into its
// residual), packs it into a payload, one ncclAllGather moves every payload, and every rank
// adds them up in rank order: the MPI exchange's (comm/exchange.hpp) and the DDP hook's
// payloads and bits. With a compact coding (exchange_options::coding: bfloat16 or, compact8,
// 8-bit values, what rounding takes off back into the residual; indices in the shorter of two
// codes) or exact_sizes, the payloads travel at the head the longest one uses: every rank's
// size is all-gathered first (one word each), then the payloads at the longest one's size.
//
// The core runs on the host, as for every CUDA transport here (comm/nccl_stage.cuh): the
// selection (O(k) entries) comes to the host through page-locked memory, the payloads
// come back from the device after the gather, and the device gets the update's entries and
// what goes back into the residual, never a dense vector's copy. nccl_allreducer
// (comm/nccl.cuh) is the lighter alternative: no capacity, no residual, plain entries.
//
// Failures: a rank's problem (arguments, a compress that threw) travels in its payload, so
// every rank raises the same sidco::runtime_error after the gather, with what it sent back in
// its residual. A runtime failure (a CUDA or NCCL call, a peer that died, no progress within
// the timeout) aborts the communicator (comm/nccl_link.cuh); create a new communicator and
// exchange on every rank. Compiled here; tests/cuda/nccl_test.cu runs it where a GPU is.
#pragma once

#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <span>
#include <stdexcept>
#include <type_traits>
#include <vector>

#include "sidco/backend/cuda/check.cuh"
#include "sidco/backend/cuda/half.cuh"
#include "sidco/comm/allgather/core.hpp"
#include "sidco/comm/collective_wait.hpp"
#include "sidco/comm/nccl_link.cuh"
#include "sidco/comm/nccl_stage.cuh"
#include "sidco/comm/options.hpp"
#include "sidco/comm/residual_sink.hpp"
#include "sidco/comm/setup.hpp"
#include "sidco/core/error.hpp"
#include "sidco/core/segment.hpp"
#include "sidco/core/sparse_vector.hpp"
#include "sidco/memory/device.cuh"

namespace sidco::comm {

/// One tensor's (or one buffer of tensors') all-gather exchange over NCCL, reused every
/// step; T is float, double, __half or __nv_bfloat16 (the core runs on host_value_t<T>, the
/// same bits).
///
///   nccl_exchange<float> exchange(comm, layout, delta, options);   // collective
///   try {
///     compressor.compress(gradient, delta, sent, residual);        // backend::cuda
///   } catch (const std::exception& e) {
///     exchange.exchange_failed(e, step);                            // throws, as every rank does
///   }
///   exchange.exchange(sent, residual.values(), dense, step);        // dense: the same bits everywhere
///
/// Construction is collective and agrees on the payload's size and coding (every rank throws
/// the same error otherwise). Every rank calls exchange (or exchange_failed) the same number
/// of times. sent is only read: what the capacity could not hold (and, compact, what rounding
/// took off) is written into residual (when given), so that per rank, bit for bit, residual +
/// what was sent = gradient + old residual. Not thread-safe.
template <class T, class Index = std::uint32_t>
class nccl_exchange {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double> || std::is_same_v<T, __half> ||
                    std::is_same_v<T, __nv_bfloat16>,
                "nccl_exchange: float, double, __half or __nv_bfloat16 values");
  using H = host_value_t<T>;
  static_assert(sizeof(H) == sizeof(T));

 public:
  /// timeout: how long a host wait may see no completion before the communicator is
  /// aborted (zero: no limit; asynchronous NCCL errors abort it either way).
  nccl_exchange(ncclComm_t comm, std::vector<segment> layout, double delta, exchange_options options = {},
                cudaStream_t stream = nullptr, std::chrono::milliseconds timeout = default_collective_timeout)
      : link_(comm, stream, timeout, "nccl_exchange"), delta_(delta), options_(options) {
    for (auto* buffer : {&payload_device_, &gathered_device_}) buffer->use_stream(link_.stream());
    sizes_device_.use_stream(link_.stream());
    exchange_setup mine{};
    try {
      core_ = allgather_core<H, Index>(layout, delta, options.slack, options.coding, options.trim_limit);
      payload_.resize(core_.format().bytes());
      inbox_.resize(core_.format().bytes() * std::size_t(link_.ranks()));
      mine = setup_of<H, Index>(layout, core_.format(), fields(0), options.slack);
      mine.exact_sizes = options.exact_sizes;
    } catch (const std::exception& e) {
      mine = failed_setup(e, options.tag);
    }
    nccl_detail::agree_setup(link_, mine, remedy);
  }

  /// One tensor of size values.
  nccl_exchange(ncclComm_t comm, std::size_t size, double delta, exchange_options options = {},
                cudaStream_t stream = nullptr, std::chrono::milliseconds timeout = default_collective_timeout)
      : nccl_exchange(comm, std::vector<segment>{{0, size}}, delta, options, stream, timeout) {}

  nccl_exchange(const nccl_exchange&) = delete;
  nccl_exchange& operator=(const nccl_exchange&) = delete;

  int ranks() const { return link_.ranks(); }
  int rank() const { return link_.rank(); }
  const wire_format& format() const { return core_.format(); }
  const capacity_plan& capacities() const { return core_.capacities(); }
  /// Whether a runtime failure aborted the communicator (see the top of this file).
  bool aborted() const { return link_.aborted(); }

  /// One step: sent (device memory, as the compressor left it) trimmed and packed, every
  /// rank's payload gathered, dense (device memory, overwritten) = their rank-order sum or
  /// average, complete on the stream when this returns. residual (device memory, the
  /// exchange's size, or empty to drop it) gets what of sent was not sent. On any rank's
  /// failure it throws sidco::runtime_error, the same on every rank, having written nothing to
  /// dense and every entry of sent back into residual.
  exchange_report exchange(const sparse_vector<T, Index, memory::device>& sent, memory::device::view<T> residual,
                           memory::device::view<T> dense, std::uint64_t step) {
    begin();
    const std::size_t size = core_.size();
    // A buffer of the wrong size fails the step on every rank (it travels in the payload).
    const bool fits = dense.size() == size && (residual.empty() || residual.size() == size);
    residual_ = fits ? residual : memory::device::view<T>{};
    if (!fits) {
      const sidco::error wrong(sidco::detail::message("nccl_exchange: dense (", dense.size(), ") or residual (",
                                                      residual.size(), "): not the exchange's size ", size));
      core_.encode_failure(wrong, fields(step), std::span<std::byte>(payload_));
    } else {
      aborting_on_failure([&] { stage_.fetch(link_, sent, sent_); });
      core_.encode(sent_, staged_, fields(step), std::span<std::byte>(payload_));
      aborting_on_failure([&] { write_staged(); });
    }
    return finish(dense);
  }

  /// For a rank whose compress threw: joins the gather the others are in, so that none hangs,
  /// and throws (as every rank does) the error naming this rank and reason.
  [[noreturn]] void exchange_failed(const std::exception& reason, std::uint64_t step) {
    begin();
    residual_ = {};
    core_.encode_failure(reason, fields(step), std::span<std::byte>(payload_));
    finish({});
    sidco::detail::fail("nccl_exchange: rank ", rank(), " failed: ", reason.what());  // not reached
  }

 private:
  static constexpr const char* remedy = "create a new communicator and exchange on every rank";

  template <class F>
  void aborting_on_failure(F&& f) {
    link_.aborting_on_failure(f, remedy);
  }

  void begin() {
    if (link_.aborted())
      sidco::detail::fail_at_run_time("nccl_exchange: the NCCL communicator was aborted by an earlier failure; ",
                                      remedy);
    staged_.clear();
    sent_.clear(core_.size());
  }

  wire_fields fields(std::uint64_t step) const { return {options_.tag, step, delta_, options_.op}; }

  // Payloads at their used head: the compact coding's, or any with exact_sizes.
  bool by_head() const { return options_.exact_sizes || is_compact(core_.format().coding); }

  // The gather, then the core's decode on the host and the update on the device.
  exchange_report finish(memory::device::view<T> dense) {
    const std::size_t head = gather();
    const std::size_t bytes = core_.format().bytes(), ranks = std::size_t(link_.ranks());
    std::vector<std::span<const std::byte>> views(ranks);
    for (std::size_t r = 0; r < ranks; ++r) views[r] = std::span<const std::byte>(inbox_).subspan(r * bytes, bytes);
    exchange_report report;
    try {
      report = core_.decode_into(views, update_indices_, update_values_, staged_);
    } catch (...) {
      aborting_on_failure([&] { write_staged(); });  // a failed step: what this rank sent, back
      throw;
    }
    aborting_on_failure([&] {
      SIDCO_CUDA(cudaMemsetAsync(dense.data(), 0, dense.size() * sizeof(T), link_.stream()));
      stage_.write(link_, std::span<const Index>(update_indices_), std::span<const H>(update_values_), dense);
    });
    report.bytes = head;
    return report;
  }

  // Every rank's payload into its slot of inbox_ (zeros past what it sent). Returns the
  // bytes each rank sent: the format's, or the longest head.
  std::size_t gather() {
    const std::size_t bytes = core_.format().bytes(), ranks = std::size_t(link_.ranks());
    std::size_t head = bytes;
    aborting_on_failure([&] {
      if (by_head()) head = agreed_head(ranks);
      payload_device_.resize(head);
      gathered_device_.resize(head * ranks);
      link_.to_device(payload_device_.data(), payload_.data(), head);
      SIDCO_NCCL(ncclAllGather(payload_device_.data(), gathered_device_.data(), head, ncclUint8, link_.comm(),
                               link_.stream()));
      gathered_.resize(head * ranks);
      link_.to_host(gathered_.data(), gathered_device_.data(), head * ranks);
    });
    for (std::size_t r = 0; r < ranks; ++r) {
      std::memcpy(inbox_.data() + r * bytes, gathered_.data() + r * head, head);
      std::fill(inbox_.begin() + std::ptrdiff_t(r * bytes + head), inbox_.begin() + std::ptrdiff_t((r + 1) * bytes),
                std::byte{0});
    }
    return head;
  }

  // The longest payload's used bytes, every rank's all-gathered (one word each).
  std::size_t agreed_head(std::size_t ranks) {
    const std::vector<std::uint64_t> sizes = nccl_detail::all_gather_word(link_, sizes_device_, core_.used_bytes());
    std::uint64_t longest = 0;
    for (std::size_t r = 0; r < ranks; ++r) {
      // Outside any payload of this format: not this sidco's (the communicator is aborted).
      if (sizes[r] < sizeof(wire_header) || sizes[r] > core_.format().bytes())
        throw std::runtime_error(sidco::detail::message("rank ", r, " announced a payload of ", sizes[r],
                                                        " bytes, outside [", sizeof(wire_header), ", ",
                                                        core_.format().bytes(), "] (mixed sidco versions?)"));
      longest = std::max(longest, sizes[r]);
    }
    return std::size_t(longest);
  }

  // What goes back into the residual, in one go.
  void write_staged() {
    stage_.write(link_, std::span<const Index>(staged_.indices), std::span<const H>(staged_.values), residual_);
    staged_.clear();
  }

  nccl_detail::link link_;
  double delta_;
  exchange_options options_;
  allgather_core<H, Index> core_;
  std::vector<std::byte> payload_, gathered_, inbox_;
  memory::device_buffer<unsigned char> payload_device_, gathered_device_;
  memory::device_buffer<std::uint64_t> sizes_device_;
  sparse_vector<H, Index> sent_;      // this step's sent entries, on the host
  staged_residual<H, Index> staged_;  // what goes back into the residual, this step
  std::vector<Index> update_indices_;
  std::vector<H> update_values_;
  memory::device::view<T> residual_;
  nccl_detail::host_stage<T, Index> stage_;
};

}  // namespace sidco::comm
