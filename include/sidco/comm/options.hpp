// What a caller chooses for an exchange, whatever carries it (MPI, NCCL).
#pragma once

#include <cstdint>

#include "sidco/comm/report.hpp"

namespace sidco::comm {

struct exchange_options {
  double slack = 1.25;                 // capacity: ceil(slack k) entries per segment
  reduction op = reduction::average;
  std::uint32_t tag = 0;               // names the tensor in errors and payloads
};

}  // namespace sidco::comm
