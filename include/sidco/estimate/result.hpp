// What a threshold estimator hands to the selection step.
#pragma once

namespace sidco::estimate {

struct threshold_estimate {
  double threshold = 0;  // keep |x| > threshold
  int stages = 0;        // distribution fits made (0: no fit was needed)
  bool fallback = false; // the estimator's threshold was unusable; the radix threshold replaced it
};

}  // namespace sidco::estimate
