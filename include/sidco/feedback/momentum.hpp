// DGC's momentum correction with momentum-factor masking, as a feedback layer.
#pragma once

#include <cstddef>

#include "sidco/core/checks.hpp"
#include "sidco/core/error.hpp"
#include "sidco/feedback/residual.hpp"
#include "sidco/memory/host.hpp"

namespace sidco::feedback {

/// Per-tensor state of DGC (Lin et al., ICLR 2018): velocity u <- m u + g (fused) and accumulation
/// v <- v + u; v is compressed, and where an entry is sent both u and v are cleared
/// (momentum-factor masking), so stale momentum does not keep pushing it. What is not sent
/// stays in v: sum of everything sent + v equals the sum of all u.
template <class T, class Memory = memory::host>
class momentum {
 public:
  using memory_space = Memory;
  using view_type = typename Memory::template view<T>;
  using const_view_type = typename Memory::template view<const T>;

  momentum() = default;
  momentum(std::size_t size, T factor) : factor_(checked(factor)), velocity_(size), accumulation_(size) {}
  /// Both state vectors in memory the caller owns (used as they are, not cleared).
  momentum(view_type velocity, view_type accumulation, T factor)
      : factor_(checked(factor)), velocity_(velocity), accumulation_(accumulation) {
    check::same_size("momentum: accumulation", accumulation.size(), velocity.size());
  }

  std::size_t size() const { return velocity_.size(); }
  T factor() const { return factor_; }
  const_view_type velocity() const { return {velocity_.view().data(), size()}; }
  const_view_type accumulation() const { return {accumulation_.view().data(), size()}; }
  typename Memory::template pointer<T> velocity_data() { return velocity_.view().data(); }
  typename Memory::template pointer<T> accumulation_data() { return accumulation_.view().data(); }

  void reset() {
    Memory::zero(velocity_.view());
    Memory::zero(accumulation_.view());
  }

 private:
  static T checked(T factor) {
    if (!(factor >= T(0) && factor < T(1)))
      detail::fail("momentum: factor = ", double(factor), " is outside [0, 1)");
    return factor;
  }

  T factor_ = T(0.9);
  detail::state_storage<T, Memory> velocity_;
  detail::state_storage<T, Memory> accumulation_;
};

}  // namespace sidco::feedback
