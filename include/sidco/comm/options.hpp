// What a caller chooses for an exchange, whatever carries it (MPI, NCCL).
#pragma once

#include <cstdint>

#include "sidco/comm/report.hpp"

namespace sidco::comm {

/// How entries lie in a payload: plain (32- or 64-bit indices, values in the tensor's type),
/// compact (comm/compact.hpp: values narrowed to half their width, what rounding takes back
/// into the residual; indices coded: about 3 bytes an entry at 1%, where plain ones take 8)
/// or compact8 (the same with 8-bit values on a scale each payload shares:
/// comm/byte_values.hpp; about 2 bytes an entry).
enum class entry_coding : std::uint8_t { plain = 0, compact = 1, compact8 = 2 };

/// Whether a coding is one of the compact ones (coded indices, narrowed values).
constexpr bool is_compact(entry_coding coding) {
  return coding == entry_coding::compact || coding == entry_coding::compact8;
}

/// A coding's name, from its number on the wire.
constexpr const char* coding_name(std::uint8_t coding) {
  return coding == 0 ? "plain" : coding == 1 ? "compact" : coding == 2 ? "compact8" : "unknown";
}

/// How the MPI reduce-scatter exchange moves its blocks and selections: two_hop (the
/// default; comm/reduce/grid.hpp: through an intermediate of a sqrt(P) grid, O(sqrt P)
/// messages a rank each way, each payload at the size it uses behind a 4-byte header, indices
/// gap-coded: comm/reduce/frames.hpp) or flat (one all-to-all and one all-gather: P - 1
/// payloads each way, at a fixed size or, with exact_sizes, the agreed head). Under SimGrid's
/// SMPI two_hop took less time and fewer bytes at every P from 16 to 1,024, and fewer bytes on
/// the loopback at 4 to 16 ranks (docs/RESULTS.md). The NCCL exchange moves its blocks flat
/// whatever this says (as frames with exact_sizes or the compact coding); the PyTorch hook
/// chooses by State(reduce_schedule=...), over the same router (comm/reduce/hops.hpp).
enum class reduce_schedule : std::uint8_t { flat = 0, two_hop = 1 };

struct exchange_options {
  double slack = 1.25;                 // capacity: ceil(slack k) entries per segment
  reduction op = reduction::average;
  std::uint32_t tag = 0;               // names the tensor in errors and payloads
  /// MPI transports: start() posts a non-blocking collective (MPI_Ialltoall, MPI_Iallgather)
  /// that overlaps what the caller does before wait(); false: start() runs the blocking one,
  /// whose algorithm the MPI library chooses by size and rank count (non-blocking ones are
  /// often a flat schedule: SimGrid's SMPI simulates those P^2 messages slowly).
  bool overlap = true;
  /// How entries travel: plain, or compact (comm/compact.hpp; in the reduce-scatter
  /// exchanges as frames: MPI two hops, NCCL). Every rank must choose alike (the constructors
  /// agree on it).
  entry_coding coding = entry_coding::plain;
  /// Payloads at the size they use, not the capacity's. The MPI all-gather exchange: each
  /// rank sends only its payload's bytes (compact: about 3.2 an entry at 1%, where the fixed
  /// size takes 5; plain: 8, not the slack's 10), at the price of a round: start()
  /// all-gathers the sizes, wait() the payloads (MPI_Allgatherv), so the payloads no longer
  /// travel while the caller works. The MPI reduce-scatter exchange: blocks and selections
  /// travel at the head the longest block uses, agreed by a one-integer all-reduce (a latency
  /// more a step; fewer bytes where blocks are mostly slack or the 320-byte minimum: many
  /// ranks). The NCCL reduce-scatter exchange: blocks and selections as frames at their own
  /// size (comm/reduce/frames.hpp), each round's sizes first (the compact coding always
  /// does). Every rank must choose alike.
  bool exact_sizes = false;
  /// The share of the entries a rank hands start() that it may trim for want of capacity
  /// (what does not fit goes back into its residual; reports count it as trimmed). Beyond
  /// it the step fails on every rank, naming the rank and the share, with every entry back in
  /// its residual: a rank compressing well above the agreed density is told, not cut
  /// silently. 1: trim whatever does not fit. A rank's own choice (not agreed).
  double trim_limit = 1.0;
  /// The MPI reduce-scatter exchange's schedule (two_hop: payloads at their own size, so
  /// exact_sizes changes nothing; overlap neither: the first hop always travels while the
  /// caller works). Every rank must choose alike.
  reduce_schedule schedule = reduce_schedule::two_hop;
};

}  // namespace sidco::comm
