// The reduce-scatter exchange (comm/reduce_scatter.hpp) of device buffers over NCCL: bytes per
// rank about 2 slack 8k per step whatever the number of ranks, where nccl_allreducer's
// all-gather moves (P - 1) of every rank's selection.
//
// Round 1 is a grouped ncclSend/ncclRecv of fixed-size blocks (one to each owner), round 2
// one ncclAllGather of the owners' selections: both of fixed size, so no count exchange
// comes first. The per-step work between them (split, owner's reduction and selection,
// applying the global selection) is the host code the MPI and gloo transports run, on
// copies of O(k) bytes through page-locked memory; the device keeps the dense vectors and
// gets only the update's k entries and the entries going back into its residual. So every
// rank's update has the same bits as those transports' (the host code is tested without a
// GPU in tests/wire_test.cpp; the transport itself in tests/cuda/nccl_reduce_test.cu, which
// only runs where a GPU is).
//
// Failures: a rank's problem (arguments, a compress that threw) travels in its blocks and is
// relayed by the owners, so every rank raises the same sidco::runtime_error after round 2,
// with every entry it sent back in its residual. A runtime failure (a CUDA or NCCL call, a
// peer that died, no progress within the timeout) aborts the communicator
// (comm/nccl_link.cuh); create a new communicator and exchange on every rank.
#pragma once

#include <cuda_runtime.h>
#include <nccl.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <span>
#include <type_traits>
#include <utility>
#include <vector>

#include "sidco/backend/cuda/check.cuh"
#include "sidco/backend/cuda/half.cuh"
#include "sidco/backend/cuda/tuning.cuh"
#include "sidco/comm/capacity.hpp"
#include "sidco/comm/collective_wait.hpp"
#include "sidco/comm/nccl_link.cuh"
#include "sidco/comm/options.hpp"
// The owners' CPU compressor has loops over a compile-time probe count that may be 0,
// which nvcc's front end calls a pointless comparison (#186); g++ and clang++ do not.
#pragma nv_diag_suppress 186
#include "sidco/comm/reduce_scatter.hpp"
#pragma nv_diag_default 186
#include "sidco/comm/regions.hpp"
#include "sidco/comm/setup.hpp"
#include "sidco/core/error.hpp"
#include "sidco/core/sparse_vector.hpp"
#include "sidco/core/state_io.hpp"
#include "sidco/memory/device.cuh"

namespace sidco::comm {

namespace nccl_detail {

// to[indices[j]] = values[j] (distinct indices): entries back into a residual, or the
// global selection into a zeroed dense vector. Values arrive as bits of the same layout.
template <class Tuning, class T, class Index>
__global__ void __launch_bounds__(Tuning::block_threads)
    set_entries(const Index* indices, const T* values, std::size_t count, T* to) {
  for (std::size_t j = std::size_t(blockIdx.x) * Tuning::block_threads + threadIdx.x; j < count;
       j += std::size_t(gridDim.x) * Tuning::block_threads)
    to[indices[j]] = values[j];
}

}  // namespace nccl_detail

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
/// residual + applied contribution = gradient + old residual. Not thread-safe.
template <class T, class Index = std::uint32_t, class Policy = owner_sidco_e>
class nccl_reduce_exchange {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double> || std::is_same_v<T, __half> ||
                    std::is_same_v<T, __nv_bfloat16>,
                "nccl_reduce_exchange: float, double, __half or __nv_bfloat16 values");
  using H = host_value_t<T>;
  static_assert(sizeof(H) == sizeof(T));

 public:
  /// timeout: how long a host wait may see no completion before the communicator is
  /// aborted (zero: no limit; asynchronous NCCL errors abort it either way).
  nccl_reduce_exchange(ncclComm_t comm, std::vector<segment> layout, double delta, exchange_options options = {},
                       Policy policy = {}, cudaStream_t stream = nullptr,
                       std::chrono::milliseconds timeout = default_collective_timeout)
      : link_(comm, stream, timeout, "sparse_reduce_exchange"),
        delta_(delta),
        options_(options),
        policy_(std::move(policy)) {
    for (auto* buffer : {&blocks_device_, &received_device_, &selection_device_, &selections_device_, &setups_device_})
      buffer->use_stream(link_.stream());
    entry_indices_.use_stream(link_.stream());
    entry_values_.use_stream(link_.stream());
    const std::size_t ranks = std::size_t(link_.ranks());
    exchange_setup mine{};
    try {
      plan_ = plan_reduce<H, Index>(layout, delta, options.slack, ranks);
      if (plan_.size > sparse_vector<H, Index>::max_dense_size)
        sidco::detail::fail("sparse_reduce_exchange: ", plan_.size, " values exceed the ", 8 * sizeof(Index),
                            "-bit index range");
      regions_ = regions::even(plan_.size, ranks);
      const std::size_t bytes = plan_.format.bytes();
      blocks_.resize(bytes * ranks);
      received_.resize(bytes * ranks);
      selection_.resize(bytes);
      selections_.resize(bytes * ranks);
      blocks_device_.resize(bytes * ranks);
      received_device_.resize(bytes * ranks);
      selection_device_.resize(bytes);
      selections_device_.resize(bytes * ranks);
      mine = setup_of<H, Index>(layout, plan_.format, fields(0), options.slack);
    } catch (const std::exception& e) {
      mine = failed_setup(e, options.tag);
    }
    agree_setup(mine);
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
  const reduce_plan& plan() const { return plan_; }
  const regions& current_regions() const { return regions_; }
  /// The last global selection's indices, ascending (the same on every rank).
  std::span<const Index> global_selection() const { return global_; }
  Policy& policy() { return policy_; }
  /// Whether a runtime failure aborted the communicator (see the top of this file).
  bool aborted() const { return link_.aborted(); }

  /// One step: sent (device memory, as the compressor left it) split into blocks, both
  /// rounds, dense (device memory, overwritten) = the global selection's sums (or averages),
  /// complete on the stream when this returns. residual (device memory, the exchange's size,
  /// or empty to drop what is not applied) gets back what of sent was not applied. On any
  /// rank's failure it throws sidco::runtime_error, the same on every rank, having written
  /// nothing to dense and every entry of sent back into residual.
  reduce_report exchange(const sparse_vector<T, Index, memory::device>& sent, memory::device::view<T> residual,
                         memory::device::view<T> dense, std::uint64_t step) {
    begin(step);
    bool copied = false;
    try {
      if (dense.size() != plan_.size)
        sidco::detail::fail("sparse_reduce_exchange: dense: size ", dense.size(), " is not the exchange's ", plan_.size);
      check_step_sizes(plan_, residual.size(), sent.dense_size());
      copy_to_host(sent);
      untrimmed_ = sent_;
      copied = true;
      report_.trimmed = pack_blocks(sent_, regions_, plan_, fields(step), std::span<H>{}, std::span<std::byte>(blocks_));
      report_.sent = sent_.size();
      detail::return_unselected(untrimmed_, sent_.indices(), give_back());  // what pack_blocks trimmed
    } catch (const std::exception& e) {
      returned_indices_.clear();  // whatever was given back, all of it now
      returned_values_.clear();
      if (copied)
        for (std::size_t j = 0; j < untrimmed_.size(); ++j) give_back()(untrimmed_.indices()[j], untrimmed_.values()[j]);
      sent_.clear(plan_.size);
      pack_failed_blocks<H, Index>(e, plan_, fields(step), std::span<std::byte>(blocks_));
    }
    // A residual of the wrong size gets nothing back (the error names it on every rank).
    return finish(residual.size() == plan_.size ? residual : memory::device::view<T>{}, dense);
  }

  /// For a rank whose compress threw: joins the rounds the others are in, so that none
  /// hangs, and throws (as every rank does) the error naming this rank and reason.
  [[noreturn]] void exchange_failed(const std::exception& reason, std::uint64_t step) {
    begin(step);
    pack_failed_blocks<H, Index>(reason, plan_, fields(step), std::span<std::byte>(blocks_));
    finish({}, {});
    sidco::detail::fail("sparse_reduce_exchange: rank ", rank(), " failed: ", reason.what());  // not reached
  }

  /// What a checkpoint needs to resume bit for bit: the regions and the owner policy's
  /// state (the local compressor and residual are the caller's).
  void save_state(state_writer& out) const { save_reduce_state(out, regions_, policy_); }
  void load_state(state_reader& in) { load_reduce_state(in, plan_, regions_, policy_); }

 private:
  using launch = backend::cuda_detail::default_tuning;
  static unsigned grid(std::size_t n) { return backend::cuda_detail::grid<launch>(n); }
  static constexpr const char* remedy = "create a new communicator and exchange on every rank";

  template <class F>
  void aborting_on_failure(F&& f) {
    link_.aborting_on_failure(f, remedy);
  }

  void begin(std::uint64_t step) {
    if (link_.aborted())
      sidco::detail::fail_at_run_time("sparse_reduce_exchange: the NCCL communicator was aborted by an earlier failure; ",
                                      remedy);
    step_ = step;
    report_ = {};
    returned_indices_.clear();
    returned_values_.clear();
    sent_.clear(plan_.size);
  }

  wire_fields fields(std::uint64_t step) const { return {options_.tag, step, delta_, options_.op}; }

  // Where this step's entries for the residual wait until they are copied to the device.
  auto give_back() {
    return [this](Index i, H v) {
      returned_indices_.push_back(i);
      returned_values_.push_back(v);
    };
  }

  void copy_to_host(const sparse_vector<T, Index, memory::device>& sent) {
    link_.order_after_writer(sent);
    sent_.resize(sent.size());
    link_.to_host(sent_.index_data(), sent.indices().data(), sent.size() * sizeof(Index));
    link_.to_host(sent_.value_data(), sent.values().data(), sent.size() * sizeof(T));
  }

  // Both rounds, then the update; blocks_ holds this rank's blocks.
  reduce_report finish(memory::device::view<T> residual, memory::device::view<T> dense) {
    const std::size_t bytes = plan_.format.bytes(), ranks = std::size_t(link_.ranks()), me = std::size_t(link_.rank());
    aborting_on_failure([&] { all_to_all(bytes, ranks, me); });
    std::vector<std::span<const std::byte>> views(ranks);
    for (std::size_t r = 0; r < ranks; ++r) views[r] = std::span<const std::byte>(received_).subspan(r * bytes, bytes);
    select_region<H, Index>(views, regions_, me, plan_, fields(step_), policy_, std::span<std::byte>(selection_), report_,
                            reduced_);
    aborting_on_failure([&] { all_gather(bytes, ranks); });
    for (std::size_t r = 0; r < ranks; ++r) views[r] = std::span<const std::byte>(selections_).subspan(r * bytes, bytes);
    report_.ranks = int(ranks);
    report_.target = plan_.target;
    report_.bytes_sent = report_.bytes_received = 2 * (ranks - 1) * bytes;
    try {
      selected_entries<H, Index>(views, regions_, plan_, sent_, give_back(), global_, applied_, report_);
    } catch (...) {
      aborting_on_failure([&] { set(returned_indices_, returned_values_, residual); });
      throw;
    }
    aborting_on_failure([&] {
      set(returned_indices_, returned_values_, residual);
      SIDCO_CUDA(cudaMemsetAsync(dense.data(), 0, dense.size() * sizeof(T), link_.stream()));
      set(global_, applied_, dense);
      link_.wait();
    });
    regions_ = regions::balanced<Index>(global_, plan_.size, ranks);
    return report_;
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

  // to[indices[j]] = values[j] on the device (nothing when to is empty).
  void set(const std::vector<Index>& indices, const std::vector<H>& values, memory::device::view<T> to) {
    if (to.empty() || indices.empty()) return;
    entry_indices_.resize(indices.size());
    entry_values_.resize(values.size());
    link_.to_device(entry_indices_.data(), indices.data(), indices.size() * sizeof(Index));
    link_.to_device(entry_values_.data(), values.data(), values.size() * sizeof(T));
    nccl_detail::set_entries<launch><<<grid(indices.size()), launch::block_threads, 0, link_.stream()>>>(
        entry_indices_.data(), entry_values_.data(), indices.size(), to.data());
    SIDCO_CUDA(cudaGetLastError());
    link_.wait();  // the entries' buffers are reused by the next set
  }

  // Every rank's setup record, all-gathered; every rank throws alike what check_setups finds.
  void agree_setup(const exchange_setup& mine) {
    const std::size_t ranks = std::size_t(link_.ranks());
    std::vector<exchange_setup> setups(ranks);
    aborting_on_failure([&] {
      setups_device_.resize(sizeof mine * (ranks + 1));
      link_.to_device(setups_device_.data(), &mine, sizeof mine);
      SIDCO_NCCL(ncclAllGather(setups_device_.data(), setups_device_.data() + sizeof mine, sizeof mine, ncclUint8,
                               link_.comm(), link_.stream()));
      link_.to_host(setups.data(), setups_device_.data() + sizeof mine, sizeof mine * ranks);
    });
    check_setups(setups);
  }

  nccl_detail::link link_;
  double delta_;
  exchange_options options_;
  Policy policy_;
  reduce_plan plan_;
  regions regions_;
  std::vector<std::byte> blocks_, received_, selection_, selections_;
  memory::device_buffer<unsigned char> blocks_device_, received_device_, selection_device_, selections_device_,
      setups_device_;
  sparse_vector<H, Index> sent_;  // this step's sent entries, on the host (as its blocks hold them)
  sparse_vector<H, Index> untrimmed_;  // and before pack_blocks trimmed them
  std::vector<Index> global_, returned_indices_;
  std::vector<H> applied_, returned_values_;
  memory::device_buffer<Index> entry_indices_;
  memory::device_buffer<T> entry_values_;
  owner_workspace<H, Index> reduced_;
  std::uint64_t step_ = 0;
  reduce_report report_;
};

}  // namespace sidco::comm
