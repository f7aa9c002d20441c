// What an NCCL transport of an exchange core does around its collectives: the core runs on
// the host (the CPU transports' code, on the same bits), so a device sparse vector comes to
// the host, and what the core hands back (entries into a residual, an update's entries) goes
// to the device in one go; every rank's setup record is all-gathered before any step.
// Shared by comm/nccl_exchange.cuh (all-gather) and comm/nccl_reduce.cuh (reduce-scatter).
#pragma once

#include <cuda_runtime.h>
#include <nccl.h>

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "sidco/backend/cuda/entries.cuh"
#include "sidco/backend/cuda/half.cuh"
#include "sidco/comm/nccl_link.cuh"
#include "sidco/comm/setup.hpp"
#include "sidco/core/sparse_vector.hpp"
#include "sidco/memory/device.cuh"

namespace sidco::comm::nccl_detail {

/// Entries between a device sparse vector of T and the host, where the core reads them as
/// host_value_t<T> (the same bits). Keeps its device buffers from call to call.
template <class T, class Index>
class host_stage {
 public:
  using H = host_value_t<T>;
  static_assert(sizeof(H) == sizeof(T));

  /// sent (device memory) into out (host), after the stream that wrote sent.
  void fetch(link& l, const sparse_vector<T, Index, memory::device>& sent, sparse_vector<H, Index>& out) {
    l.order_after_writer(sent);
    out.clear(sent.dense_size());
    out.resize(sent.size());
    l.to_host(out.index_data(), sent.indices().data(), sent.size() * sizeof(Index));
    l.to_host(out.value_data(), sent.values().data(), sent.size() * sizeof(T));
  }

  /// to[indices[j]] = values[j] on the device (nothing when to is empty), through the link's
  /// page-locked staging and the one entry kernel (backend/cuda/entries.cuh).
  void write(link& l, std::span<const Index> indices, std::span<const H> values, memory::device::view<T> to) {
    if (to.empty() || indices.empty()) return;
    indices_.use_stream(l.stream());
    values_.use_stream(l.stream());
    indices_.resize(indices.size());
    values_.resize(values.size());
    l.to_device(indices_.data(), indices.data(), indices.size() * sizeof(Index));
    l.to_device(values_.data(), values.data(), values.size() * sizeof(T));
    backend::cuda_detail::launch_set_entries<backend::cuda_detail::default_tuning>(
        indices_.data(), values_.data(), indices.size(), to.data(), l.stream());
    l.wait();  // the buffers are reused by the next write
  }

 private:
  memory::device_buffer<Index> indices_;
  memory::device_buffer<T> values_;
};

/// Every rank's word (this rank's being mine), by one ncclAllGather through words (a device
/// buffer the caller keeps from call to call).
inline std::vector<std::uint64_t> all_gather_word(link& l, memory::device_buffer<std::uint64_t>& words,
                                                  std::uint64_t mine) {
  const std::size_t ranks = std::size_t(l.ranks());
  std::vector<std::uint64_t> all(ranks);
  words.resize(ranks + 1);
  l.to_device(words.data(), &mine, sizeof mine);
  SIDCO_NCCL(ncclAllGather(words.data(), words.data() + 1, 1, ncclUint64, l.comm(), l.stream()));
  l.to_host(all.data(), words.data() + 1, ranks * sizeof(std::uint64_t));
  return all;
}

/// Every rank's setup record, all-gathered; every rank throws alike what check_setups finds
/// (a failure of the collective itself aborts the communicator: remedy says what to do).
inline void agree_setup(link& l, const exchange_setup& mine, const char* remedy) {
  const std::size_t ranks = std::size_t(l.ranks());
  std::vector<exchange_setup> setups(ranks);
  memory::device_buffer<unsigned char> records;
  records.use_stream(l.stream());
  l.aborting_on_failure(
      [&] {
        records.resize(sizeof mine * (ranks + 1));
        l.to_device(records.data(), &mine, sizeof mine);
        SIDCO_NCCL(ncclAllGather(records.data(), records.data() + sizeof mine, sizeof mine, ncclUint8, l.comm(),
                                 l.stream()));
        l.to_host(setups.data(), records.data() + sizeof mine, sizeof mine * ranks);
      },
      remedy);
  check_setups(setups);
}

}  // namespace sidco::comm::nccl_detail
