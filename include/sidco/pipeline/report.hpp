// What one compress call did, so that a user can check it against what was asked.
#pragma once

#include <cstddef>

namespace sidco {

struct compress_report {
  double threshold = 0;        // the estimated threshold (-1: none was used)
  std::size_t selected = 0;    // entries in the sparse output
  std::size_t candidates = 0;  // entries above the threshold, before any trimming
  std::size_t size = 0;        // dense length
  std::size_t zeros = 0;       // exact zeros in the input
  double target_density = 0;   // delta as asked
  double density = 0;          // selected / size
  int stages = 0;              // distribution fits made (SIDCo's stages; Gaussian-k's one); 0: none
  int rescans = 0;             // extra passes a selection made because too few were found
  int passes = 0;              // passes the estimate made besides the moments pass
  bool fallback = false;       // the estimator's fit degenerated; the radix threshold was used

  double density_ratio() const { return density / target_density; }
};

}  // namespace sidco
