// What every rank says of its all-reduce call, exchanged before any payload, so that a
// mismatch or a failure on one rank becomes the same error on every rank: shared by the MPI
// and NCCL sparse all-reducers.
#pragma once

#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <string_view>

#include "sidco/comm/report.hpp"
#include "sidco/core/error.hpp"
#include "sidco/core/utf8.hpp"

namespace sidco::comm::detail {

enum class rank_status : std::uint64_t { ok, dense_mismatch, failed };

/// Plain bytes on the wire (all-gathered as such).
struct rank_header {
  std::uint64_t dense_size, count, delta_bits, state, op;
  char reason[216];  // why the rank failed (truncated)
};

inline rank_header make_header(std::size_t dense_size, std::size_t count, double delta, reduction op,
                               rank_status state, const char* reason) {
  rank_header h{dense_size, count, 0, std::uint64_t(state), std::uint64_t(op), {}};
  std::memcpy(&h.delta_bits, &delta, sizeof delta);
  const std::string_view text = sidco::detail::utf8_prefix(reason, sizeof h.reason - 1);
  std::memcpy(h.reason, text.data(), text.size());
  return h;
}

/// Throws, on every rank alike, the first problem any rank reported: a failure (with its
/// reason), a dense buffer that does not match, a dense size, density or reduction unlike
/// rank 0's.
inline void check_headers(std::span<const rank_header> headers) {
  for (std::size_t r = 0; r < headers.size(); ++r) {
    const rank_header& h = headers[r];
    if (h.state == std::uint64_t(rank_status::failed))
      sidco::detail::fail("sparse_allreduce: rank ", r, " failed: ",
                          sidco::detail::valid_utf8(std::string_view(h.reason, strnlen(h.reason, sizeof h.reason))));
    if (h.state != std::uint64_t(rank_status::ok) && h.state != std::uint64_t(rank_status::dense_mismatch))
      sidco::detail::fail("sparse_allreduce: rank ", r, " sent status ", h.state, ", which this sidco does not know "
                          "(mixed sidco versions?)");
    if (h.state == std::uint64_t(rank_status::dense_mismatch))
      sidco::detail::fail("sparse_allreduce: rank ", r,
                          " passed a dense buffer whose size does not match its sparse vector's dense size ", h.dense_size);
  }
  const rank_header& first = headers[0];
  for (std::size_t r = 0; r < headers.size(); ++r) {
    const rank_header& h = headers[r];
    if (h.dense_size != first.dense_size)
      sidco::detail::fail("sparse_allreduce: rank ", r, " has dense size ", h.dense_size, ", rank 0 has ", first.dense_size);
    if (h.delta_bits != first.delta_bits) {
      double theirs, rank0;
      std::memcpy(&theirs, &h.delta_bits, sizeof theirs);
      std::memcpy(&rank0, &first.delta_bits, sizeof rank0);
      sidco::detail::fail("sparse_allreduce: rank ", r, " has density ", theirs, ", rank 0 has ", rank0);
    }
    if (h.op != first.op) {
      const auto name = [](std::uint64_t op) { return op == std::uint64_t(reduction::sum) ? "sum" : "average"; };
      sidco::detail::fail("sparse_allreduce: rank ", r, " reduces by ", name(h.op), ", rank 0 by ", name(first.op));
    }
  }
}

}  // namespace sidco::comm::detail
