// The compact8 coding's values (comm/compact.hpp): one byte a value, a sign bit and a 7-bit
// magnitude on a scale the payload shares, `top`, the binade of its largest value. Magnitude
// m (1 to 127) stands for (1 + (m mod 8) / 8) 2^(top - 15 + m / 8): 4 significant bits over
// the 16 binades below the largest value, where a top-k selection's values lie (they are
// the largest of their segments). m = 0 marks a value that is not finite (every rank refuses
// it, as it refuses a NaN in any coding). A value rounds to nearest, ties to even, on its
// own bits, and every rank decodes a code from the same table, so what the sender keeps as
// sent is what every receiver reads; the rounding's remainder (value - rounded, exact:
// Sterbenz, the two lie within a factor 2) goes back into the sender's residual. A value
// below the scale's range, or one whose code would not be exact in T, is not sent: it stays
// in the residual whole until it is large enough.
#pragma once

#include <array>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <span>
#include <type_traits>

#include "sidco/core/half.hpp"

namespace sidco::comm {

/// Binades a payload's 8-bit values span below its largest, and their mantissa bits.
inline constexpr int byte_value_binades = 16;
inline constexpr int byte_value_mantissa_bits = 3;

/// The scale of one payload's 8-bit values and its decoding table.
template <class T>
class byte_scale {
 public:
  /// The type values are rounded in: exact for every T sidco sends (16-bit types widen to float).
  using wide = std::conditional_t<sizeof(T) == 8, double, float>;

  /// The range of top a payload may name: every code finite in T at the highest; at the
  /// lowest, the largest codes still exact in T (4 significant bits above T's smallest
  /// subnormal).
  static constexpr std::int32_t highest_top =
      std::is_same_v<T, float16> ? 15 : std::numeric_limits<wide>::max_exponent - 1;
  static constexpr std::int32_t lowest_top = std::is_same_v<T, float16>    ? -14 - 10 + byte_value_mantissa_bits
                                             : std::is_same_v<T, bfloat16> ? -126 - 7 + byte_value_mantissa_bits
                                                                           : std::numeric_limits<wide>::min_exponent -
                                                                                 std::numeric_limits<wide>::digits +
                                                                                 byte_value_mantissa_bits;

  /// The scale a sender uses for values: the binade of the largest finite |value| once
  /// rounded to 4 significant bits, ignoring those beyond the highest scale's largest code,
  /// within the range (the lowest when there is none). That value is then sent (its code is
  /// exact), so the values sent have the same scale: pack_compact takes it from them.
  static byte_scale of(std::span<const T> values) {
    constexpr key beyond = (key(bias + highest_top) << mantissa_bits | (key(mantissa_mask) << dropped_bits)) + 1;
    key largest = 0;
    for (const T v : values) {
      const wide a = std::fabs(wide(v));
      if (!std::isfinite(a)) continue;
      const key bits = rounded_bits(std::bit_cast<key>(a));
      if (bits < beyond) largest = std::max(largest, bits);
    }
    const std::int32_t top = largest == 0 ? lowest_top : exponent_of(largest);
    return made(std::clamp(top, lowest_top, highest_top));
  }

  /// The scale a payload names (receivers); nullopt outside the range a sender may name.
  static std::optional<byte_scale> named(std::int32_t top) {
    if (top < lowest_top || top > highest_top) return std::nullopt;
    return made(top);
  }

  std::int32_t top() const { return top_; }

  /// The code of v (finite) and the T it stands for (rounded); false when no code stands for
  /// v exactly rounded: 0 or subnormal in the wide type, below the scale's range, above it (a
  /// value larger than the one the scale was taken from), or a code not exact in T (below
  /// T's normal range).
  bool encode(T v, std::uint8_t& code, T& rounded) const {
    const wide w = wide(v);
    const key bits = rounded_bits(std::bit_cast<key>(std::fabs(w)));
    if ((bits >> mantissa_bits) == 0) return false;  // 0 or subnormal in the wide type
    const std::int32_t binade = exponent_of(bits) - (top_ - (byte_value_binades - 1));
    if (binade < 0 || binade >= byte_value_binades) return false;
    const unsigned magnitude =
        (unsigned(binade) << byte_value_mantissa_bits) | (unsigned(bits >> dropped_bits) & mantissa_mask);
    if (magnitude == 0) return false;  // the marker's code
    code = std::uint8_t(magnitude | (std::signbit(w) ? 0x80u : 0u));
    rounded = table_[code];
    return wide(rounded) == std::copysign(std::bit_cast<wide>(bits), w);
  }

  /// The code that marks a value that is not finite.
  static std::uint8_t nonfinite_code() { return 0; }

  /// What code stands for (a quiet NaN for the marker).
  T decode(std::uint8_t code) const { return table_[code]; }

 private:
  using key = std::conditional_t<sizeof(wide) == 8, std::uint64_t, std::uint32_t>;
  static constexpr int mantissa_bits = std::numeric_limits<wide>::digits - 1;
  static constexpr int dropped_bits = mantissa_bits - byte_value_mantissa_bits;
  static constexpr unsigned mantissa_mask = (1u << byte_value_mantissa_bits) - 1;
  static constexpr std::int32_t bias = std::numeric_limits<wide>::max_exponent - 1;

  // The scale of top, its table from a small per-thread cache: building one takes 256
  // ldexp calls, and a step frames many payloads whose tops are a few binades apart (the
  // reduce exchange: two a block at 64 ranks, where building dominated the codec).
  static byte_scale made(std::int32_t top) {
    thread_local std::array<std::optional<byte_scale>, 16> cache;
    auto& slot = cache[std::size_t(std::uint32_t(top) % cache.size())];
    if (!slot || slot->top_ != top) slot.emplace(byte_scale(top));
    return *slot;
  }

  explicit byte_scale(std::int32_t top) : top_(top) {
    for (unsigned code = 0; code < 256; ++code) {
      const unsigned magnitude = code & 0x7fu;
      const int binade = int(magnitude >> byte_value_mantissa_bits);
      const wide value = std::ldexp(wide(int(mantissa_mask + 1 + (magnitude & mantissa_mask))),
                                    top - (byte_value_binades - 1) + binade - byte_value_mantissa_bits);
      const wide marked = magnitude == 0 ? std::numeric_limits<wide>::quiet_NaN() : value;
      table_[code] = T(code & 0x80u ? -marked : marked);
    }
  }

  // |value|'s bits rounded to byte_value_mantissa_bits bits of mantissa, nearest, ties to even
  // (a carry moves it to the next binade, as it should).
  static key rounded_bits(key bits) {
    const key half = (key(1) << (dropped_bits - 1)) - 1 + ((bits >> dropped_bits) & 1);
    return (bits + half) & ~((key(1) << dropped_bits) - 1);
  }
  static std::int32_t exponent_of(key bits) { return std::int32_t(bits >> mantissa_bits) - bias; }

  std::int32_t top_;
  std::array<T, 256> table_;
};

}  // namespace sidco::comm
