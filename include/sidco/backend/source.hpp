// What a pass reads: the gradient alone, or the gradient plus error-feedback state.
//
// A source gives value(i), the vector being compressed. Sources with state settle it in the
// selection pass: settle(i, v, sent) leaves v in the state when it was not sent and clears
// it when it was. Selections that decide late (exact_k, top_k, trimming) settle every entry
// as unsent first and call mark_sent for the final choice; until then rescan_value(i) gives
// the value again from the settled state. Indices in the output are base + i. Pointers are
// the memory space's (host or device); only backends read through them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "sidco/core/arithmetic.hpp"
#include "sidco/core/bit.hpp"
#include "sidco/core/config.hpp"
#include "sidco/core/float_traits.hpp"
#include "sidco/memory/host.hpp"

namespace sidco::backend {

/// v, or +0 when sent: written with a bit mask rather than ?:, so that loops calling it
/// vectorize.
template <class T>
SIDCO_HOST_DEVICE T unless_sent(T v, bool sent) {
  using U = typename float_traits<T>::key;
  return detail::bit_cast<T>(U(detail::bit_cast<U>(v) & U(U(0) - U(!sent))));
}

/// The gradient as it is.
template <class T, class Memory = memory::host>
struct plain_source {
  using value_type = T;
  using memory_space = Memory;
  static constexpr bool has_state = false;
  typename Memory::template pointer<const T> gradient;
  std::size_t size;
  std::size_t base = 0;

  SIDCO_HOST_DEVICE T value(std::size_t i) const { return gradient[i]; }
  SIDCO_HOST_DEVICE T rescan_value(std::size_t i) const { return gradient[i]; }
  SIDCO_HOST_DEVICE void settle(std::size_t, T, bool) const {}
  SIDCO_HOST_DEVICE void mark_sent(std::size_t) const {}
  /// Values [offset, offset + count) as a source of their own (indices stay global).
  plain_source slice(std::size_t offset, std::size_t count) const {
    return {gradient + offset, count, base + offset};
  }
};

/// gradient + residual: error feedback. What is not sent stays in the residual.
template <class T, class Memory = memory::host>
struct feedback_source {
  using value_type = T;
  using memory_space = Memory;
  static constexpr bool has_state = true;
  typename Memory::template pointer<const T> gradient;
  typename Memory::template pointer<T> residual;
  std::size_t size;
  std::size_t base = 0;

  SIDCO_HOST_DEVICE T value(std::size_t i) const { return detail::add(gradient[i], residual[i]); }
  SIDCO_HOST_DEVICE T rescan_value(std::size_t i) const { return residual[i]; }
  SIDCO_HOST_DEVICE void settle(std::size_t i, T v, bool sent) const { residual[i] = unless_sent(v, sent); }
  SIDCO_HOST_DEVICE void mark_sent(std::size_t i) const { residual[i] = from_accumulator<T>(0); }
  feedback_source slice(std::size_t offset, std::size_t count) const {
    return {gradient + offset, residual + offset, count, base + offset};
  }
};

/// DGC's momentum correction: u <- m u + g (one fused multiply-add, so that every backend
/// gives the same bits), v <- v + u, compress
/// v; where sent, momentum factor masking clears both u and v (Lin et al., ICLR 2018).
template <class T, class Memory = memory::host>
struct momentum_source {
  using value_type = T;
  using memory_space = Memory;
  static constexpr bool has_state = true;
  typename Memory::template pointer<const T> gradient;
  typename Memory::template pointer<T> velocity;      // u
  typename Memory::template pointer<T> accumulation;  // v
  T momentum;
  std::size_t size;
  std::size_t base = 0;

  SIDCO_HOST_DEVICE T value(std::size_t i) const {
    return detail::add(accumulation[i], detail::fused_multiply_add(momentum, velocity[i], gradient[i]));
  }
  SIDCO_HOST_DEVICE T rescan_value(std::size_t i) const { return accumulation[i]; }
  SIDCO_HOST_DEVICE void settle(std::size_t i, T v, bool sent) const {
    velocity[i] = unless_sent(detail::fused_multiply_add(momentum, velocity[i], gradient[i]), sent);
    accumulation[i] = unless_sent(v, sent);
  }
  SIDCO_HOST_DEVICE void mark_sent(std::size_t i) const {
    velocity[i] = T(0);
    accumulation[i] = T(0);
  }
  momentum_source slice(std::size_t offset, std::size_t count) const {
    return {gradient + offset, velocity + offset, accumulation + offset, momentum, count,
            base + offset};
  }
};

}  // namespace sidco::backend
