// The compact entry coding of an exchange's payload: values narrowed to half their width
// (float32 as bfloat16, float64 as float32; 16-bit values stay as they are) and the
// ascending indices in the shorter of two codes, named in the header (index_code): their
// gaps in a variable-length code (LEB128: 7 bits a byte, one byte for a gap below 128;
// shortest where a selection clusters), or Elias-Fano (each index's low L bits packed, its
// high bits in unary: 2 + log2(N / count) bits an index however they spread; shorter near
// 10% density, where most gaps would take a whole byte). What narrowing rounds off goes
// back into the sender's residual, so a rank's residual plus what it sent is still exactly
// its gradient plus its old residual. The compact8 coding sends each value in one byte on
// a scale the payload names (comm/byte_values.hpp: 4 significant bits over the 16 binades
// below its largest value), its rounding given back alike: about 2 bytes an entry at 1%.
//
// Payloads keep a fixed size (the collectives move equal sizes): a 64-byte header, then
// count narrowed values (compact8: after their 8-byte scale), then the index code, in a body
// of room for capacity values and Elias-Fano's longest code of at most capacity indices
// (compact_format_for: about 2 + log2(N / capacity) bits an index, where the plain format
// spends 32). A body of a format made without the dense size holds compact_index_budget
// bytes an index; there a selection whose code would overflow gives its smallest entries
// back to the residual until it fits (only below δ = 2^-13 per segment, where Elias-Fano
// takes over 16 bits an index). A receiver expands each compact payload into the plain
// format (comm/wire.hpp) and checks and sums it as any other.
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <type_traits>

#include "sidco/backend/host/keep_top_k.hpp"
#include "sidco/comm/agree.hpp"
#include "sidco/comm/byte_values.hpp"
#include "sidco/comm/wire.hpp"
#include "sidco/core/error.hpp"
#include "sidco/core/float_traits.hpp"
#include "sidco/core/half.hpp"
#include "sidco/core/sparse_vector.hpp"

namespace sidco::comm {

/// What the compact coding sends a T value as.
template <class T>
struct compact_value {
  using type = T;  // 16-bit values: as they are
};
template <>
struct compact_value<float> {
  using type = bfloat16;  // float's exponent range: no value overflows
};
template <>
struct compact_value<double> {
  using type = float;
};
template <class T>
using compact_value_t = typename compact_value<T>::type;

/// compact_value_t<T>'s width for a T of value_bytes (for code that knows T at run time).
inline constexpr std::size_t compact_value_bytes(std::size_t value_bytes) {
  return value_bytes == 2 ? 2 : value_bytes / 2;
}
static_assert(compact_value_bytes(sizeof(float)) == sizeof(compact_value_t<float>) &&
              compact_value_bytes(sizeof(double)) == sizeof(compact_value_t<double>) &&
              compact_value_bytes(sizeof(float16)) == sizeof(compact_value_t<float16>));

/// How a compact payload codes its indices (wire_header::index_code).
enum class index_code : std::uint8_t { gaps = 0, elias_fano = 1 };

namespace detail {

inline std::size_t varint_bytes(std::uint64_t v) {
  std::size_t n = 1;
  while (v >= 0x80) {
    v >>= 7;
    ++n;
  }
  return n;
}

/// Bytes of the gap code of ascending indices (the first index, then each gap less one).
template <class Index>
std::size_t gap_code_bytes(std::span<const Index> indices) {
  std::size_t bytes = 0;
  std::uint64_t next = 0;  // the smallest index the next one may be
  for (const Index i : indices) {
    bytes += varint_bytes(std::uint64_t(i) - next);
    next = std::uint64_t(i) + 1;
  }
  return bytes;
}

inline std::byte* put_varint(std::uint64_t v, std::byte* at) {
  while (v >= 0x80) {
    *at++ = std::byte((v & 0x7f) | 0x80);
    v >>= 7;
  }
  *at++ = std::byte(v);
  return at;
}

/// Elias-Fano of count ascending indices below dense_size: the low bits kept per index
/// (L = floor(log2(dense_size / count)), so that the high parts' unary code takes at most
/// about 2 bits an index).
inline unsigned elias_fano_low_bits(std::uint64_t count, std::uint64_t dense_size) {
  const std::uint64_t ratio = count == 0 ? 0 : dense_size / count;
  return ratio == 0 ? 0 : unsigned(std::bit_width(ratio) - 1);
}

/// Bytes of the low bits' part (count x L bits, whole bytes).
inline std::size_t elias_fano_low_bytes(std::uint64_t count, unsigned low_bits) {
  return std::size_t((count * low_bits + 7) / 8);
}

/// Bytes of the Elias-Fano code of count indices below dense_size: the low bits, then the
/// high parts' unary code (index j's high part h sets bit h + j; at most 3 count + 1 bits).
inline std::size_t elias_fano_bytes(std::uint64_t count, std::uint64_t dense_size) {
  if (count == 0 || dense_size == 0) return 0;
  const unsigned low = elias_fano_low_bits(count, dense_size);
  return elias_fano_low_bytes(count, low) + std::size_t((count + ((dense_size - 1) >> low) + 1 + 7) / 8);
}

/// The shorter code of ascending indices below dense_size (the gaps on a tie) and its bytes.
template <class Index>
std::pair<index_code, std::size_t> shorter_index_code(std::span<const Index> indices, std::uint64_t dense_size) {
  const std::size_t gaps = gap_code_bytes(indices), elias_fano = elias_fano_bytes(indices.size(), dense_size);
  return elias_fano < gaps ? std::pair{index_code::elias_fano, elias_fano} : std::pair{index_code::gaps, gaps};
}

/// Writes the Elias-Fano code of ascending indices below dense_size at at (zeroed, with
/// elias_fano_bytes of room). Returns its end.
template <class Index>
std::byte* put_elias_fano(std::span<const Index> indices, std::uint64_t dense_size, std::byte* at) {
  const std::uint64_t n = indices.size();
  const unsigned low = elias_fano_low_bits(n, dense_size);
  std::uint64_t bits = 0;  // pending low bits, fewer than 8 after each index
  unsigned pending = 0;
  const auto put_bits = [&](std::uint64_t v, unsigned width) {  // width <= 32
    bits |= v << pending;
    pending += width;
    for (; pending >= 8; pending -= 8, bits >>= 8) *at++ = std::byte(bits & 0xff);
  };
  for (const Index i : indices) {
    const std::uint64_t v = std::uint64_t(i) & ((std::uint64_t(1) << low) - 1);  // low < 64: dense_size / n < 2^64
    if (low > 32) {
      put_bits(v & 0xffffffffu, 32);
      put_bits(v >> 32, low - 32);
    } else if (low > 0) {
      put_bits(v, low);
    }
  }
  if (pending > 0) *at++ = std::byte(bits & 0xff);
  std::byte* const upper = at;
  std::uint64_t last = 0;
  for (std::uint64_t j = 0; j < n; ++j) {
    last = (std::uint64_t(indices[j]) >> low) + j;
    upper[last / 8] |= std::byte(1u << (last % 8));
  }
  return n == 0 ? at : upper + last / 8 + 1;
}

/// The count (<= 8) bytes at at as a little-endian number, whatever the host's order.
inline std::uint64_t load_le(const std::byte* at, std::size_t count) {
  std::uint64_t v = 0;
  if (count == 8) {
    std::memcpy(&v, at, 8);
    if constexpr (std::endian::native == std::endian::big) v = __builtin_bswap64(v);
    return v;
  }
  for (std::size_t b = 0; b < count; ++b) v |= std::uint64_t(at[b]) << (8 * b);
  return v;
}

/// width (<= 32) bits from bit position bit of the little-endian bit string at at; end:
/// where readable bytes end (the string's own bytes all lie before it).
inline std::uint64_t bits_at(const std::byte* at, const std::byte* end, std::uint64_t bit, unsigned width) {
  const std::byte* const from = at + bit / 8;
  const std::uint64_t word = load_le(from, std::min<std::size_t>(8, std::size_t(end - from)));
  return (word >> (bit % 8)) & ((std::uint64_t(1) << width) - 1);
}

/// Where a body's index code starts: after the values' scale (compact8) and count narrowed
/// values, padded to 8 bytes.
inline std::size_t codes_offset(const wire_format& format, std::size_t count) {
  return format.scale_bytes() + (count * format.value_bytes + 7) / 8 * 8;
}

/// The bytes a body of format's size has room for after count narrowed values.
inline std::size_t gap_room(const wire_format& format, std::size_t count) {
  return format.message_bytes() - codes_offset(format, count);
}

/// A compact8 body's scale: top as a 32-bit integer, then 4 zero bytes.
inline void put_byte_scale(std::int32_t top, std::byte* body) {
  std::memcpy(body, &top, sizeof top);
}

}  // namespace detail

/// The most bytes the index code of at most capacity ascending indices below dense_size
/// takes: Elias-Fano's longest (pack_compact sends the shorter code), at whichever count.
/// Within one low-bit width L the code grows with the count, so the longest is at the
/// largest count of some L, capped at capacity (L = 0 takes the capacity itself).
inline std::size_t compact_index_room(std::size_t capacity, std::uint64_t dense_size) {
  const std::uint64_t most = std::min<std::uint64_t>(capacity, dense_size);
  std::size_t room = 0;
  for (unsigned low = 0; low < 64 && (dense_size >> low) > 0; ++low) {
    const std::uint64_t count = std::min(most, dense_size >> low);  // the largest with dense_size / count >= 2^low
    room = std::max(room, detail::elias_fano_bytes(count, dense_size));
  }
  return room;
}

/// compact_format_for for code that knows the index and value widths at run time (value_bytes:
/// the uncompressed value's).
inline wire_format compact_format(std::size_t capacity, std::size_t index_bytes, std::size_t value_bytes,
                                  std::uint64_t dense_size = 0, entry_coding coding = entry_coding::compact) {
  if (!is_compact(coding))
    sidco::detail::fail("compact_format: coding ", int(coding), " is neither compact (1) nor compact8 (2)");
  wire_format f{capacity, index_bytes, coding == entry_coding::compact8 ? 1 : compact_value_bytes(value_bytes), coding};
  if (dense_size > 0) f.index_room = compact_index_room(capacity, dense_size);  // 0 at capacity 0
  return f;
}

/// The compact format (compact or compact8) of capacity entries of T values. With the dense
/// size the index code's room is Elias-Fano's longest for that many entries (about 2 +
/// log2(dense_size / capacity) bits an index: no selection of at most capacity entries is
/// ever trimmed to fit); without it, compact_index_budget bytes an entry.
template <class T, class Index>
wire_format compact_format_for(std::size_t capacity, std::uint64_t dense_size = 0,
                               entry_coding coding = entry_coding::compact) {
  return compact_format(capacity, sizeof(Index), sizeof(T), dense_size, coding);
}

/// The format of capacity entries in the given coding (compact ones: compact_format_for).
template <class T, class Index>
wire_format format_for(std::size_t capacity, entry_coding coding, std::uint64_t dense_size = 0) {
  return is_compact(coding) ? compact_format_for<T, Index>(capacity, dense_size, coding)
                            : format_for<T, Index>(capacity);
}

/// Gives sent's smallest entries back to sink (whole: the compressor left +0 there) until
/// its index code fits format's body. Returns how many it gave back.
template <class T, class Index, class Sink>
std::size_t fit_compact_body(sparse_vector<T, Index>& sent, const wire_format& format, Sink& sink) {
  std::size_t removed = 0;
  for (;;) {
    const std::size_t n = sent.size();
    const std::size_t need = detail::shorter_index_code<Index>(sent.indices(), sent.dense_size()).second;
    if (n == 0 || need <= detail::gap_room(format, n)) return removed;
    // Shrink in proportion (at least by one), then measure again: fewer entries, wider gaps.
    const std::size_t keep = std::min(n - 1, std::size_t(double(n) * double(detail::gap_room(format, n)) / double(need)));
    const std::size_t kept = backend::host::keep_top_k(sent.index_data(), sent.value_data(), n, keep,
                                                       [&](Index i, T v) { sink.give_back(i, v); });
    removed += n - kept;
    sent.truncate(kept);
  }
}

/// v rounded to the nearest compact_value_t<T> into rounded; false when that value cannot
/// stand for v: beyond the narrow type's range, or 0 where v is not. The one rule for what a
/// rank sends (round_for_compact) and what an owner sends (comm/reduce/carry.hpp).
template <class T>
bool round_to_compact(T v, T& rounded) {
  rounded = T(compact_value_t<T>(v));
  return std::isfinite(double(rounded)) && (rounded != T(0) || v == T(0));
}

namespace detail {

/// round_for_compact's pass: round(v, rounded) for each finite value v (false: v goes back to
/// sink whole); non-finite values stay as they are.
template <class T, class Index, class Sink, class Remainders, class Round>
std::size_t round_each(sparse_vector<T, Index>& sent, Sink& sink, Remainders& remainders, Round&& round) {
  using wide = typename byte_scale<T>::wide;
  Index* indices = sent.index_data();
  T* values = sent.value_data();
  std::size_t write = 0;
  for (std::size_t j = 0; j < sent.size(); ++j) {
    const T v = values[j];
    if (!std::isfinite(double(v))) {  // sent as it is (compact8: as its marker): every rank refuses it (agree())
      indices[write] = indices[j];
      values[write++] = v;
      continue;
    }
    T rounded;
    if (!round(v, rounded)) {
      sink.give_back(indices[j], v);
      continue;
    }
    // Exact (Sterbenz): rounded lies within a factor 2 of v; in the wide type for 16-bit T.
    remainders.give_back(indices[j], T(wide(v) - wide(rounded)));
    indices[write] = indices[j];
    values[write] = rounded;
    ++write;
  }
  const std::size_t dropped = sent.size() - write;
  sent.truncate(write);
  return dropped;
}

}  // namespace detail

/// Rounds each value of sent to what the compact coding sends: compact_value_t<T>, to
/// nearest; compact8, its byte code on the scale of sent's values (comm/byte_values.hpp). An
/// entry that rounds to zero, or beyond the narrow type's (or the scale's) range, goes back to
/// sink whole and is not sent; what rounding leaves off the others goes to remainders, exactly
/// (value - rounded is a T): the all-gather core's residual at once, or nowhere
/// (host_residual<T>{}) for a caller that gives it back once each entry's fate is known
/// (give_back_rounded), so that a step gives each index back once (a device residual's entry
/// writer takes distinct indices: backend/cuda/entries.cuh). Returns how many entries it gave
/// back whole.
template <class T, class Index, class Sink, class Remainders>
std::size_t round_for_compact(sparse_vector<T, Index>& sent, Sink& sink, Remainders& remainders,
                              entry_coding coding = entry_coding::compact) {
  if (coding == entry_coding::compact8) {
    const byte_scale<T> scale = byte_scale<T>::of(sent.values());
    return detail::round_each(sent, sink, remainders, [&](T v, T& rounded) {
      std::uint8_t code;
      return scale.encode(v, code, rounded);
    });
  }
  if constexpr (std::is_same_v<compact_value_t<T>, T>) {
    return 0;
  } else {
    return detail::round_each(sent, sink, remainders,
                              [](T v, T& rounded) { return round_to_compact(v, rounded) && rounded != T(0); });
  }
}

/// For each entry of rounded (what round_for_compact left of unrounded, or a part of it;
/// both ascending): where applied(index) holds (asked in ascending order), what rounding left
/// off it, exactly (Sterbenz: rounded lies within a factor 2 of its value; nothing where
/// 16-bit values were sent as they are or the value is not finite: no step applies it);
/// elsewhere its value before rounding, whole. Returns how many it gave back whole.
template <class T, class Index, class Applied, class Sink>
std::size_t give_back_rounded(const sparse_vector<T, Index>& unrounded, const sparse_vector<T, Index>& rounded,
                              Applied&& applied, Sink& sink) {
  const auto from = unrounded.indices();
  const auto before = unrounded.values();
  const auto indices = rounded.indices();
  const auto values = rounded.values();
  std::size_t u = 0, whole = 0;
  for (std::size_t j = 0; j < indices.size(); ++j) {
    const Index i = indices[j];
    while (u < from.size() && from[u] < i) ++u;
    if (u == from.size() || from[u] != i)
      sidco::detail::fail("give_back_rounded: index ", i, " was not among the entries before rounding");
    const T v = before[u];
    if (applied(i)) {
      if (!std::isfinite(double(v))) continue;
      if constexpr (!std::is_same_v<compact_value_t<T>, T>) {
        sink.give_back(i, T(v - values[j]));
      } else if (std::memcmp(&v, &values[j], sizeof v) != 0) {  // 16-bit values: rounded by compact8 only
        using wide = typename byte_scale<T>::wide;
        sink.give_back(i, T(wide(v) - wide(values[j])));
      }
    } else {
      sink.give_back(i, v);
      ++whole;
    }
  }
  return whole;
}

/// Writes the entries (ascending indices below dense_size; values the format's coding holds
/// exactly, as round_for_compact leaves them; an index code that fits: fit_compact_body)
/// into a compact payload of format.bytes(), their indices in the shorter code; the unused
/// bytes are zeroed. Returns the bytes it uses (a multiple of 8): a receiver that zeroes the
/// rest reads the same payload.
template <class T, class Index>
std::size_t pack_compact(std::span<const Index> indices, std::span<const T> values, std::size_t dense_size,
                  std::size_t trimmed, const wire_fields& fields, const wire_format& format, std::span<std::byte> payload) {
  using N = compact_value_t<T>;
  detail::check_payload_size(payload, format);
  const bool bytes = format.coding == entry_coding::compact8;
  if (!is_compact(format.coding) || format.value_bytes != (bytes ? 1 : sizeof(N)) ||
      format.index_bytes != sizeof(Index))
    sidco::detail::fail("pack_compact: the format is not a compact one of ", float_traits<T>::name, " values");
  if (indices.size() != values.size())
    sidco::detail::fail("pack_compact: ", indices.size(), " indices and ", values.size(), " values");
  const std::size_t n = indices.size();
  if (n > format.capacity)
    sidco::detail::fail("pack_compact: ", n, " entries exceed the capacity ", format.capacity, " (trim first)");
  const auto [code, code_bytes] = detail::shorter_index_code(indices, dense_size);
  if (code_bytes > detail::gap_room(format, n))
    sidco::detail::fail("pack_compact: the indices' code exceeds the payload (fit_compact_body first)");
  wire_header h = detail::header_for<T, Index>(fields, dense_size, format);
  h.count = n;
  h.trimmed = trimmed;
  h.index_code = std::uint8_t(code);
  std::memset(payload.data() + sizeof h, 0, format.message_bytes());
  std::byte* const body = payload.data() + sizeof h;
  if (bytes) {
    const byte_scale<T> scale = byte_scale<T>::of(values);
    detail::put_byte_scale(scale.top(), body);
    std::byte* const codes = body + format.scale_bytes();
    for (std::size_t j = 0; j < n; ++j) {
      std::uint8_t code = byte_scale<T>::nonfinite_code();
      T rounded;
      if (std::isfinite(double(values[j])) && !(scale.encode(values[j], code, rounded) && rounded == values[j]))
        sidco::detail::fail("pack_compact: entry ", j, "'s value ", double(values[j]),
                            " is not one an 8-bit code holds (round_for_compact first)");
      codes[j] = std::byte(code);
    }
  } else {
    for (std::size_t j = 0; j < n; ++j) {
      const N narrow(values[j]);
      std::memcpy(body + j * sizeof(N), &narrow, sizeof narrow);
    }
  }
  std::byte* at = body + detail::codes_offset(format, n);
  if (code == index_code::elias_fano) {
    at = detail::put_elias_fano(indices, dense_size, at);
  } else {
    std::uint64_t next = 0;
    for (const Index i : indices) {
      at = detail::put_varint(std::uint64_t(i) - next, at);
      next = std::uint64_t(i) + 1;
    }
  }
  detail::write_header(h, payload);
  return std::min(format.bytes(), std::size_t(at - payload.data() + 7) / 8 * 8);
}

/// Writes compact payload r (of compact's format) into plain (of plain_format, the format
/// of the same capacity, T and Index), for agree() and the sums: a failure's header and
/// message as they are; entries widened and their indices decoded. A body that cannot be
/// decoded (damaged, or coded otherwise) leaves plain holding its header and no entries,
/// and returns the error every rank raises for it (an empty string when it decoded).
template <class T, class Index>
std::string expand_compact(std::span<const std::byte> compact, const wire_format& compact_format, std::size_t r,
                           const wire_format& plain_format, std::span<std::byte> plain) {
  using N = compact_value_t<T>;
  detail::check_payload_size(compact, compact_format);
  detail::check_payload_size(plain, plain_format);
  std::memset(plain.data(), 0, plain.size());
  wire_header h = detail::read_header(compact);
  const std::size_t body_bytes = compact_format.message_bytes();
  if (h.magic != wire_magic || h.version != wire_version || h.status != std::uint8_t(wire_status::ok)) {
    // agree() reads it: a failure's message (it fits: a plain body is never smaller).
    std::memcpy(plain.data(), compact.data(), sizeof h + std::min(body_bytes, plain_format.message_bytes()));
    return {};
  }
  auto damaged = [&](const auto&... parts) {
    wire_header empty = h;
    empty.count = 0;
    empty.coding = std::uint8_t(entry_coding::plain);
    std::memset(plain.data(), 0, plain.size());  // no entries: agree() finds nothing else wrong in it
    detail::write_header(empty, plain);
    return sidco::detail::message("exchange (tag ", h.tag, ", step ", h.sequence, "): rank ", r, " sent ", parts...);
  };
  if (h.coding != std::uint8_t(compact_format.coding))
    return damaged("a payload coded ", int(h.coding), " where the ranks agreed on the ",
                   coding_name(std::uint8_t(compact_format.coding)), " coding (", int(compact_format.coding), ")");
  if (h.capacity != compact_format.capacity || h.count > compact_format.capacity)
    return damaged(h.count, " entries of capacity ", h.capacity, ", this rank's capacity is ", compact_format.capacity);
  const std::size_t n = std::size_t(h.count);
  const std::byte* const body = compact.data() + sizeof h;
  const std::byte* const end = body + body_bytes;
  std::byte* const indices = plain.data() + plain_format.indices_offset();
  std::byte* const values = plain.data() + plain_format.values_offset(n);
  if (compact_format.coding == entry_coding::compact8) {
    std::int32_t top;
    std::memcpy(&top, body, sizeof top);
    const auto scale = byte_scale<T>::named(top);
    if (!scale)
      return damaged("a value scale 2^", top, " outside [2^", byte_scale<T>::lowest_top, ", 2^",
                     byte_scale<T>::highest_top, "] for ", float_traits<T>::name, " (damaged in transit?)");
    if (!detail::all_zero(body + sizeof top, body + compact_format.scale_bytes()))
      return damaged("a value scale whose spare bytes are not zero (damaged in transit?)");
    const std::byte* const codes = body + compact_format.scale_bytes();
    for (std::size_t j = 0; j < n; ++j) {
      const T wide = scale->decode(std::uint8_t(codes[j]));
      std::memcpy(values + j * sizeof(T), &wide, sizeof wide);
    }
  } else {
    for (std::size_t j = 0; j < n; ++j) {
      N narrow;
      std::memcpy(&narrow, body + j * sizeof(N), sizeof narrow);
      const T wide = T(narrow);
      std::memcpy(values + j * sizeof(T), &wide, sizeof wide);
    }
  }
  const std::byte* at = body + detail::codes_offset(compact_format, n);
  if (h.index_code == std::uint8_t(index_code::elias_fano)) {
    const unsigned low = detail::elias_fano_low_bits(n, h.dense_size);
    const std::size_t low_bytes = detail::elias_fano_low_bytes(n, low);
    if (low_bytes > std::size_t(end - at))
      return damaged("an index code that runs past its payload at entry 0 (damaged in transit?)");
    const std::uint64_t max_high = (h.dense_size - 1) >> low;
    // The high parts' unary code: the rest of the body, read a word at a time, bytes in
    // ascending order (bit b of byte i is bit 8i + b, as put_elias_fano set it).
    const std::byte* const upper = at + low_bytes;
    const std::size_t upper_bytes = std::size_t(end - upper);
    std::size_t loaded = 0;
    std::uint64_t word = 0, word_base = 0;
    // The high parts first (a tight loop over the set bits), written as index bits.
    for (std::size_t j = 0; j < n; ++j) {
      while (word == 0) {
        if (loaded == upper_bytes)
          return damaged("an index code that runs past its payload at entry ", j, " (damaged in transit?)");
        word = detail::load_le(upper + loaded, std::min<std::size_t>(8, upper_bytes - loaded));
        word_base = 8 * std::uint64_t(loaded);
        loaded += std::min<std::size_t>(8, upper_bytes - loaded);
      }
      const std::uint64_t high = word_base + unsigned(std::countr_zero(word)) - j;  // the j-th set bit is at >= j
      word &= word - 1;
      if (high > max_high) return damaged("an index past the dense size ", h.dense_size, " at entry ", j);
      const Index high_bits = Index(high << low);
      std::memcpy(indices + j * sizeof(Index), &high_bits, sizeof high_bits);
    }
    // Then the low parts, each index checked against the one before without a branch.
    std::uint64_t next = 0, bad = 0;
    for (std::size_t j = 0; j < n; ++j) {
      const std::uint64_t bit = std::uint64_t(j) * low;
      std::uint64_t low_part = detail::bits_at(at, end, bit, std::min(low, 32u));
      if (low > 32) low_part |= detail::bits_at(at, end, bit + 32, low - 32) << 32;
      Index high_bits;
      std::memcpy(&high_bits, indices + j * sizeof(Index), sizeof high_bits);
      const std::uint64_t index = std::uint64_t(high_bits) | low_part;
      bad |= std::uint64_t(index < next) | std::uint64_t(index >= h.dense_size);
      const Index narrow_index = Index(index);
      std::memcpy(indices + j * sizeof(Index), &narrow_index, sizeof narrow_index);
      next = index + 1;
    }
    if (bad != 0) {  // find the first wrong one, for the message
      std::uint64_t before = 0;
      for (std::size_t j = 0; j < n; ++j) {
        Index index;
        std::memcpy(&index, indices + j * sizeof(Index), sizeof index);
        if (index >= h.dense_size) return damaged("an index past the dense size ", h.dense_size, " at entry ", j);
        if (index < before) return damaged("indices out of order at entry ", j, " (damaged in transit?)");
        before = std::uint64_t(index) + 1;
      }
    }
    // Past the entries: the last low byte's spare bits, the unary code's, the rest.
    const unsigned spare = unsigned(std::uint64_t(n) * low % 8);
    const bool rest_zero = word == 0 && (spare == 0 || (std::uint8_t(at[low_bytes - 1]) >> spare) == 0) &&
                           detail::all_zero(upper + loaded, end);
    if (!rest_zero) return damaged("a payload with bytes past its ", n, " entries (damaged in transit?)");
  } else if (h.index_code != std::uint8_t(index_code::gaps)) {
    return damaged("an index code ", int(h.index_code), " this rank does not know (gaps ", int(index_code::gaps),
                   ", Elias-Fano ", int(index_code::elias_fano), ")");
  } else {
    std::uint64_t next = 0;
    for (std::size_t j = 0; j < n; ++j) {
      std::uint64_t gap = 0;
      if (at < end && std::uint8_t(*at) < 0x80) {  // one byte: most gaps
        gap = std::uint8_t(*at++);
      } else {
        for (unsigned shift = 0;; shift += 7) {
          if (at == end) return damaged("an index code that runs past its payload at entry ", j, " (damaged in transit?)");
          if (shift > 63) return damaged("an index code over 64 bits at entry ", j, " (damaged in transit?)");
          const auto byte = std::uint64_t(*at++);
          gap |= (byte & 0x7f) << shift;
          if (!(byte & 0x80)) break;
        }
      }
      if (gap >= h.dense_size || next + gap >= h.dense_size)
        return damaged("an index past the dense size ", h.dense_size, " at entry ", j);
      const Index index = Index(next + gap);
      std::memcpy(indices + j * sizeof(Index), &index, sizeof index);
      next = next + gap + 1;
    }
    if (!detail::all_zero(at, end))
      return damaged("a payload with bytes past its ", n, " entries (damaged in transit?)");
  }
  h.coding = std::uint8_t(entry_coding::plain);  // it is plain now
  h.index_code = 0;
  detail::write_header(h, plain);
  return {};
}

}  // namespace sidco::comm
