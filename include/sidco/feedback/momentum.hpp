// DGC's momentum correction with momentum-factor masking, as a feedback layer.
#pragma once

#include <algorithm>
#include <cstddef>
#include <span>
#include <vector>

#include "sidco/core/error.hpp"

namespace sidco::feedback {

/// Per-tensor state of DGC (Lin et al., ICLR 2018): velocity u <- m u + g and accumulation
/// v <- v + u; v is compressed, and where an entry is sent both u and v are cleared
/// (momentum-factor masking), so stale momentum does not keep pushing it. What is not sent
/// stays in v: sum of everything sent + v equals the sum of all u.
template <class T>
class momentum {
 public:
  momentum() = default;
  momentum(std::size_t size, T factor) : factor_(factor), velocity_(size, T(0)), accumulation_(size, T(0)) {
    if (!(factor >= T(0) && factor < T(1)))
      detail::fail("momentum: factor = ", double(factor), " is outside [0, 1)");
  }

  std::size_t size() const { return velocity_.size(); }
  T factor() const { return factor_; }
  std::span<const T> velocity() const { return velocity_; }
  std::span<const T> accumulation() const { return accumulation_; }
  T* velocity_data() { return velocity_.data(); }
  T* accumulation_data() { return accumulation_.data(); }

  void reset() {
    std::fill(velocity_.begin(), velocity_.end(), T(0));
    std::fill(accumulation_.begin(), accumulation_.end(), T(0));
  }

 private:
  T factor_ = T(0.9);
  std::vector<T> velocity_;
  std::vector<T> accumulation_;
};

}  // namespace sidco::feedback
