// What a caller chooses for an exchange, whatever carries it (MPI, NCCL).
#pragma once

#include <cstdint>

#include "sidco/comm/report.hpp"

namespace sidco::comm {

/// How entries lie in a payload: plain (32- or 64-bit indices, values in the tensor's type)
/// or compact (comm/compact.hpp: values narrowed to half their width, what rounding takes
/// back into the residual; indices as variable-length gaps): about half the bytes.
enum class entry_coding : std::uint8_t { plain = 0, compact = 1 };

struct exchange_options {
  double slack = 1.25;                 // capacity: ceil(slack k) entries per segment
  reduction op = reduction::average;
  std::uint32_t tag = 0;               // names the tensor in errors and payloads
  /// MPI transports: start() posts a non-blocking collective (MPI_Ialltoall, MPI_Iallgather)
  /// that overlaps what the caller does before wait(); false: start() runs the blocking one,
  /// whose algorithm the MPI library chooses by size and rank count (non-blocking ones are
  /// often a flat schedule: SimGrid's SMPI simulates those P^2 messages slowly).
  bool overlap = true;
  /// The all-gather exchange's payloads: plain, or compact (comm/compact.hpp). Every rank
  /// must choose alike (the constructors agree on it).
  entry_coding coding = entry_coding::plain;
  /// The MPI reduce-scatter exchange: blocks and selections travel at the head the longest
  /// block uses, agreed by a one-integer all-reduce (a latency more a step; fewer bytes where
  /// blocks are mostly slack or the 320-byte minimum: many ranks).
  /// The MPI all-gather exchange: each rank sends only the bytes its payload uses (compact:
  /// about 3.2 an entry at 1%, where the fixed size takes 5; plain: 8, not the slack's 10),
  /// at the price of a
  /// round: start() all-gathers the sizes, wait() the payloads (MPI_Allgatherv), so the
  /// payloads no longer travel while the caller works. Every rank must choose alike.
  bool exact_sizes = false;
};

}  // namespace sidco::comm
