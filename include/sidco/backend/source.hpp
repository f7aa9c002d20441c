// What a pass reads: the gradient alone, or the gradient plus error-feedback state.
//
// A source gives value(i), the vector being compressed. Sources with state settle it in the
// selection pass: settle(i, v, sent) leaves v in the state when it was not sent and clears
// it when it was. Selections that decide late (exact_k, top_k, trimming) settle every entry
// as unsent first and call mark_sent for the final choice; until then rescan_value(i) gives
// the value again from the settled state. Indices in the output are base + i.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <type_traits>

namespace sidco::backend {

/// v, or +0 when sent: written with a bit mask rather than ?:, so that loops calling it
/// vectorize.
template <class T>
T unless_sent(T v, bool sent) {
  using U = std::conditional_t<sizeof(T) == 4, std::uint32_t, std::uint64_t>;
  return std::bit_cast<T>(std::bit_cast<U>(v) & (U(0) - U(!sent)));
}

/// The gradient as it is.
template <class T>
struct plain_source {
  using value_type = T;
  static constexpr bool has_state = false;
  const T* gradient;
  std::size_t size;
  std::size_t base = 0;

  T value(std::size_t i) const { return gradient[i]; }
  T rescan_value(std::size_t i) const { return gradient[i]; }
  void settle(std::size_t, T, bool) const {}
  void mark_sent(std::size_t) const {}
};

/// gradient + residual: error feedback. What is not sent stays in the residual.
template <class T>
struct feedback_source {
  using value_type = T;
  static constexpr bool has_state = true;
  const T* gradient;
  T* residual;
  std::size_t size;
  std::size_t base = 0;

  T value(std::size_t i) const { return gradient[i] + residual[i]; }
  T rescan_value(std::size_t i) const { return residual[i]; }
  void settle(std::size_t i, T v, bool sent) const { residual[i] = unless_sent(v, sent); }
  void mark_sent(std::size_t i) const { residual[i] = T(0); }
};

/// DGC's momentum correction: u <- m u + g, v <- v + u, compress v; where sent, momentum
/// factor masking clears both u and v (Lin et al., ICLR 2018).
template <class T>
struct momentum_source {
  using value_type = T;
  static constexpr bool has_state = true;
  const T* gradient;
  T* velocity;      // u
  T* accumulation;  // v
  T momentum;
  std::size_t size;
  std::size_t base = 0;

  T value(std::size_t i) const { return accumulation[i] + (momentum * velocity[i] + gradient[i]); }
  T rescan_value(std::size_t i) const { return accumulation[i]; }
  void settle(std::size_t i, T v, bool sent) const {
    velocity[i] = unless_sent(momentum * velocity[i] + gradient[i], sent);
    accumulation[i] = unless_sent(v, sent);
  }
  void mark_sent(std::size_t i) const {
    velocity[i] = T(0);
    accumulation[i] = T(0);
  }
};

/// The excesses a - t of stored magnitudes a over t (0 where a <= t), for the moments
/// kernels: later SIDCo stages fit these. Computed in T without a branch, so it vectorizes.
template <class T>
struct excess_source {
  using value_type = T;
  static constexpr bool has_state = false;
  const T* magnitudes;
  std::size_t size;
  T threshold;
  std::size_t base = 0;

  T value(std::size_t i) const {
    using S = std::conditional_t<sizeof(T) == 4, std::int32_t, std::int64_t>;
    const S bits = std::bit_cast<S>(magnitudes[i] - threshold);
    return std::bit_cast<T>(S(bits & ~(bits >> (8 * sizeof(T) - 1))));  // negative -> +0
  }
  T rescan_value(std::size_t i) const { return value(i); }
  void settle(std::size_t, T, bool) const {}
  void mark_sent(std::size_t) const {}
};

}  // namespace sidco::backend
