// What a moments pass gathers, chosen at compile time by the estimator.
#pragma once

#include <cstddef>

#include "sidco/core/config.hpp"

namespace sidco::backend {

/// Sums: sums of |x| and |x|^2 with min and max (else counts only: zeros, non-finite).
/// Log: also the sum of ln|x|. TailLog: the probes' excess moments also gather ln(|x| - p).
template <bool Sums, bool Log = false, bool TailLog = false>
struct pass_statistics {
  static_assert(Sums || (!Log && !TailLog), "pass_statistics: logs need sums");
  static constexpr bool sums = Sums;
  static constexpr bool log = Log;
  static constexpr bool tail_log = TailLog;
};

/// Where the first NaN or infinity is, and what it is (index == size: none).
struct nonfinite_value {
  std::size_t index = 0;
  double value = 0;
};

}  // namespace sidco::backend
