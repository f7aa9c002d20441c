// What a caller chooses for an exchange, whatever carries it (MPI, NCCL).
#pragma once

#include <cstdint>

#include "sidco/comm/report.hpp"

namespace sidco::comm {

struct exchange_options {
  double slack = 1.25;                 // capacity: ceil(slack k) entries per segment
  reduction op = reduction::average;
  std::uint32_t tag = 0;               // names the tensor in errors and payloads
  /// MPI transports: start() posts a non-blocking collective (MPI_Ialltoall, MPI_Iallgather)
  /// that overlaps what the caller does before wait(); false: start() runs the blocking one,
  /// whose algorithm the MPI library chooses by size and rank count (non-blocking ones are
  /// often a flat schedule: SimGrid's SMPI simulates those P^2 messages slowly).
  bool overlap = true;
};

}  // namespace sidco::comm
