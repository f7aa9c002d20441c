// DGC's density warm-up: start dense and tighten exponentially to the target density.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>

#include "sidco/core/error.hpp"

namespace sidco::feedback {

/// Over the first warmup_steps steps, the density falls in `stages` equal steps from
/// initial to final, geometrically: DGC's 25%, 6.25%, 1.5625%, 0.4%, 0.1% with the
/// defaults and final = 0.001. After warm-up it stays at final.
class density_warmup {
 public:
  density_warmup(double final_density, std::size_t warmup_steps, int stages = 4,
                 double initial_density = 0.25)
      : final_(final_density), initial_(initial_density), steps_(warmup_steps), stages_(stages) {
    if (!(final_density > 0 && final_density <= 1))
      detail::fail("density_warmup: final_density = ", final_density, " is outside (0, 1]");
    if (!(initial_density >= final_density && initial_density <= 1))
      detail::fail("density_warmup: initial_density = ", initial_density,
                   " is outside [final_density, 1]");
    if (stages < 1) detail::fail("density_warmup: stages = ", stages, " is below 1");
  }

  double density(std::size_t step) const {
    if (step >= steps_) return final_;
    const double stage = double(std::min<std::size_t>(stages_, step * std::size_t(stages_) / steps_));
    return initial_ * std::pow(final_ / initial_, stage / stages_);
  }

 private:
  double final_, initial_;
  std::size_t steps_;
  int stages_;
};

}  // namespace sidco::feedback
