// An owner's carry in the reduce-scatter exchange's compact codings: the owners' sums travel
// narrowed too (compact: float as bfloat16; compact8: a byte each on the scale of the
// owner's largest update, comm/byte_values.hpp), and what narrowing leaves off an update
// stays with its owner, added to that index's update the next time the owner keeps it. Per
// kept index i, with u the update by the sum rule and c[i] the carry:
//
//   t = u + c[i] (rounded once to T, as the update itself is); sent = t narrowed to
//   nearest; c[i] = t - sent, exact (Sterbenz: sent lies within a factor 2 of t).
//
// So sent + the new carry is t, bit for bit, and no rank's residual takes another's
// rounding: a rank's residual + its applied contribution is still its gradient + its old
// residual. A t that does not narrow (beyond the narrow type's range, or below it) is sent
// as it is, its carry then 0 (its frame travels whole), except in compact8, where a t below
// the scale's range (under 2^-15 of the largest) is sent as 0 and carried whole; a u + c[i]
// that overflows leaves the carry for later and sends u. The carry is dense (the owner's
// indices only are ever nonzero: a hash spreads them), made on the first step that needs
// it, saved with the exchange's state (nonzero entries: 8 bytes each for float) and put back
// when a step fails. The plain coding makes no carry but applies one it loaded (a wire
// switched mid-run), so nothing is left behind.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <span>
#include <type_traits>
#include <utility>
#include <vector>

#include "sidco/comm/byte_values.hpp"
#include "sidco/comm/compact.hpp"
#include "sidco/comm/options.hpp"
#include "sidco/comm/wire.hpp"
#include "sidco/core/error.hpp"
#include "sidco/core/state_io.hpp"

namespace sidco::comm {

template <class T, class Index>
class owner_carry {
  using N = compact_value_t<T>;

 public:
  /// Whether compact narrows T (16-bit values it sends as they are; compact8 narrows every T).
  static constexpr bool narrows = !std::is_same_v<N, T>;

  /// The carry per index of the dense size (empty: none made yet, all zero).
  std::span<const T> values() const { return values_; }
  bool empty() const { return values_.empty(); }

  /// Adds the carry to each update of an ok selection payload (format: plain; the owner's)
  /// and rounds it for coding (plain: not at all), keeping the rest as the new carry; the
  /// payload then holds what is applied. Remembers what it changed until commit() or restore().
  void apply(std::span<std::byte> selection, const wire_format& format, std::size_t dense_size, entry_coding coding) {
    undo_.clear();
    const bool bytes = coding == entry_coding::compact8, rounds = bytes || (coding == entry_coding::compact && narrows);
    if (!rounds && values_.empty()) return;
    const wire_header h = detail::read_header(selection);
    if (h.status != std::uint8_t(wire_status::ok)) return;
    const std::size_t count = std::size_t(h.count);
    if (values_.empty()) values_.assign(dense_size, T(0));
    const std::byte* indices = selection.data() + format.indices_offset();
    std::byte* updates = selection.data() + format.values_offset(count);
    using wide = typename byte_scale<T>::wide;
    const auto index_of = [&](std::size_t j) {
      return std::size_t(detail::index_at<Index>(indices + j * sizeof(Index)));
    };
    const auto total = [&](std::size_t j, T old) {
      T u;
      std::memcpy(&u, updates + j * sizeof u, sizeof u);
      return T(wide(u) + wide(old));  // rounded once to T, as the update is
    };
    std::optional<byte_scale<T>> scale;
    if (bytes) {  // the scale of the owner's largest update (byte_scale::of skips what is not finite)
      totals_.resize(count);
      for (std::size_t j = 0; j < count; ++j) totals_[j] = total(j, values_[index_of(j)]);
      scale = byte_scale<T>::of(std::span<const T>(totals_));
    }
    for (std::size_t j = 0; j < count; ++j) {
      const std::size_t index = index_of(j);
      const T old = values_[index];
      const T t = scale ? totals_[j] : total(j, old);
      if (!std::isfinite(double(t))) continue;  // u sent as it is; the carry waits
      T sent = t, rounded;
      if (scale) {
        std::uint8_t code;
        if (scale->encode(t, code, rounded)) sent = rounded;
        else if (below_codes(*scale, t)) sent = T(0);
      } else if (rounds && round_to_compact(t, rounded)) {
        sent = rounded;
      }
      const T carried = T(wide(t) - wide(sent));  // exact (Sterbenz; 0 where sent is t)
      if (std::memcmp(&carried, &old, sizeof old) != 0) {
        undo_.emplace_back(Index(index), old);
        values_[index] = carried;
      }
      std::memcpy(updates + j * sizeof sent, &sent, sizeof sent);
    }
  }

  /// The step applied: keep the carry as apply left it.
  void commit() { undo_.clear(); }
  /// The step failed: the carry as before apply.
  void restore() {
    for (auto it = undo_.rbegin(); it != undo_.rend(); ++it) values_[std::size_t(it->first)] = it->second;
    undo_.clear();
  }

  /// The nonzero entries: their count, their layout (1: one word each, the index in the low
  /// 32 bits and the value's float bits in the high ones, where every index and value fits;
  /// 2: two words each, the index and the value as a double, exact for every T sidco sends),
  /// then the entries, ascending.
  void save(state_writer& out) const {
    std::size_t nonzero = 0;
    for (const T c : values_) nonzero += nonzero_value(c);
    const bool packed = std::is_same_v<T, float> && values_.size() <= (std::size_t(1) << 32);
    out.word(nonzero);
    out.word(packed ? 1 : 2);
    // In one go and without a branch per entry (the owner's indices fall at random: a
    // snapshot may be taken every step): each slot is written, and kept when nonzero.
    const std::size_t width = packed ? 8 : 16;
    std::byte* const at = out.extend(width * nonzero);
    for (std::size_t i = 0, written = 0; written < nonzero; ++i) {
      const T c = values_[i];
      std::byte* const slot = at + width * written;
      if (packed) {
        const auto bits = sidco::detail::bit_cast<std::uint32_t>(float(c));
        state_writer::put_word(slot, std::uint64_t(i) | std::uint64_t(bits) << 32);
      } else {
        state_writer::put_word(slot, i);
        state_writer::put_word(slot + 8, sidco::detail::bit_cast<std::uint64_t>(double(c)));
      }
      written += nonzero_value(c);
    }
  }

  /// Reads what save wrote (either layout, whatever T wrote it) for dense_size values;
  /// changes nothing unless all of it reads (ascending indices below dense_size, finite
  /// values T holds exactly).
  void load(state_reader& in, std::size_t dense_size) {
    const std::uint64_t count = in.word("reduce exchange state: carried entries");
    const std::uint64_t layout = in.word("reduce exchange state: the carry's layout");
    if (count > dense_size)
      sidco::detail::fail("reduce exchange state: ", count, " carried entries for ", dense_size, " values");
    if (layout != 1 && layout != 2)
      sidco::detail::fail("reduce exchange state: the carry's layout is ", layout, ", neither 1 nor 2");
    std::vector<T> loaded;
    if (count > 0) loaded.assign(dense_size, T(0));
    std::uint64_t next = 0;
    for (std::uint64_t e = 0; e < count; ++e) {
      std::uint64_t index = 0;
      double value = 0;
      if (layout == 1) {
        const std::uint64_t word = in.word("reduce exchange state: a carried entry");
        index = word & 0xffffffffu;
        value = double(sidco::detail::bit_cast<float>(std::uint32_t(word >> 32)));
      } else {
        index = in.word("reduce exchange state: a carried index");
        value = in.number("reduce exchange state: a carried value");
      }
      if (index < next || index >= dense_size)
        sidco::detail::fail("reduce exchange state: carried index ", index, " (not ascending, or not below ",
                            dense_size, ")");
      if (!std::isfinite(value) || double(T(value)) != value)
        sidco::detail::fail("reduce exchange state: carried value ", value, " at index ", index,
                            " is not a finite value of the exchange's type");
      loaded[std::size_t(index)] = T(value);
      next = index + 1;
    }
    values_ = std::move(loaded);
    undo_.clear();
  }

 private:
  // Whether c is not zero (16-bit types compare as float; float and double as they are,
  // which vectorizes the snapshot's scan).
  static bool nonzero_value(T c) {
    if constexpr (narrows) return c != T(0);
    else return float(c) != 0.0f;
  }

  // Whether t lies below every code of scale (compact8 sends it as 0, its carry whole).
  static bool below_codes(const byte_scale<T>& scale, T t) {
    using wide = typename byte_scale<T>::wide;
    return std::fabs(wide(t)) < wide(scale.decode(1));
  }

  std::vector<T> values_;
  std::vector<T> totals_;                  // this step's t per kept entry
  std::vector<std::pair<Index, T>> undo_;  // this step's changes: index, carry before
};

}  // namespace sidco::comm
