// A payload (comm/wire.hpp) as a few bytes on the wire, for transports whose messages carry
// many payloads of one step (the two-hop schedule: comm/reduce/grid.hpp). Every rank knows
// the step's header fields (tag, step, density, reduction, sizes, types), so an ok payload
// travels as its count (and, for an owner's selection, its trimmed count) and its entries
// without padding: count values, then the indices as gaps in a variable-length code
// (comm/compact.hpp's: the first index, then each gap less one, 7 bits a byte), lossless,
// 2 or 3 bytes where a 4-byte index was. The counts use the same code, so a frame's head is
// one byte for up to 63 entries, two to 8,191: at a thousand ranks a block holds a handful
// of entries and 4-byte words would be a fifth of the bytes. Anything else (a failure and
// its message, a header a rank cannot rebuild) travels whole, as the used prefix of the
// payload. In the compact coding (comm/options.hpp) values travel narrowed (comm/compact.hpp's
// compact_value_t: float as bfloat16), in compact8 as one byte each after the frame's scale
// (comm/byte_values.hpp; a zero update as the code 0x80, which no value takes), which is
// lossless because the reduce core rounded them so: a block's before packing (the rest went
// back into the residual), an owner's updates when it selected (the rest into its carry,
// comm/reduce/carry.hpp); a value that does not narrow exactly sends the frame whole. Each
// message starts with an 8-byte digest of its sender's header fields, so that a rank at
// another step or tensor is caught by the first rank that hears from it; what it sent then
// arrives as a failure naming it.
//
//   frame:   code(2·count)      | code(trimmed) (selections) | [code(scale)] values | gap codes
//            code(2·length + 1) | the payload's first length bytes
// A frame is never longer than its whole form: at most max_frame_bytes(format).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <limits>
#include <span>
#include <type_traits>
#include <vector>

#include "sidco/comm/agree.hpp"
#include "sidco/comm/byte_values.hpp"
#include "sidco/comm/compact.hpp"
#include "sidco/comm/wire.hpp"
#include "sidco/core/error.hpp"

namespace sidco::comm {

/// The fields a step's payloads share, as one number (FNV-1a over the header with its count,
/// trimmed and status fields zero).
template <class T, class Index>
std::uint64_t fields_digest(const wire_fields& fields, std::size_t dense_size, const wire_format& format) {
  const wire_header h = detail::header_for<T, Index>(fields, dense_size, format);
  unsigned char bytes[sizeof h];
  std::memcpy(bytes, &h, sizeof h);
  std::uint64_t digest = 0xcbf29ce484222325ull;
  for (const unsigned char b : bytes) digest = (digest ^ b) * 0x100000001b3ull;
  return digest;
}

/// What a frame carries beyond the count and entries: a selection's trimmed count; values
/// narrowed (the compact coding's) or as byte codes on a scale (compact8's).
struct frame_kind {
  bool with_trimmed = false;
  bool narrow_values = false;
  bool byte_values = false;
};

/// The reduce exchange's frames: values narrowed in the compact coding, in a byte each in
/// compact8; an owner's selection with its trimmed count.
inline frame_kind frame_kind_for(bool selection, entry_coding coding) {
  return frame_kind{selection, coding == entry_coding::compact, coding == entry_coding::compact8};
}

/// The most bytes a frame of a payload of format takes (a whole payload behind its code).
inline std::size_t max_frame_bytes(const wire_format& format) { return 10 + format.bytes(); }

/// The bytes of one value in a frame of kind.
inline std::size_t frame_value_bytes(const wire_format& format, frame_kind kind) {
  return kind.byte_values ? 1 : kind.narrow_values ? compact_value_bytes(format.value_bytes) : format.value_bytes;
}

namespace detail {

inline void append_bytes(std::vector<std::byte>& out, const void* from, std::size_t size) {
  const auto* bytes = static_cast<const std::byte*>(from);
  out.insert(out.end(), bytes, bytes + size);
}

/// Writes count T values at from, narrowed to compact_value_t<T>, into `into`; false when some
/// value does not narrow exactly (not rounded for the compact coding; `into` is then partly
/// written). float -> bfloat16 in one branch-free pass that vectorizes: a float narrows exactly
/// when its low 16 bits are zero (and, a NaN, when it is quiet: the conversion quiets it).
template <class T>
bool narrow_exactly(const std::byte* from, std::size_t count, std::byte* into) {
  using N = compact_value_t<T>;
  if constexpr (std::is_same_v<T, float> && std::is_same_v<N, bfloat16>) {
    std::uint32_t inexact = 0;
    for (std::size_t j = 0; j < count; ++j) {
      std::uint32_t x;
      std::memcpy(&x, from + j * sizeof x, sizeof x);
      const std::uint32_t nan = std::uint32_t((x & 0x7fffffffu) > 0x7f800000u);
      inexact |= (x & 0xffffu) | (nan & ~(x >> 22) & 1u);
      const auto high = std::uint16_t(x >> 16);
      std::memcpy(into + j * sizeof high, &high, sizeof high);
    }
    return inexact == 0;
  } else {
    for (std::size_t j = 0; j < count; ++j) {
      T v;
      std::memcpy(&v, from + j * sizeof(T), sizeof v);
      const N narrowed(v);
      const T back(narrowed);
      if (std::memcmp(&back, &v, sizeof v) != 0) return false;
      std::memcpy(into + j * sizeof(N), &narrowed, sizeof narrowed);
    }
    return true;
  }
}

inline void append_code(std::vector<std::byte>& out, std::uint64_t v) {
  std::byte code[10];
  append_bytes(out, code, std::size_t(put_varint(v, code) - code));
}

/// The byte code a frame sends a zero update as: a negative marker, which no value codes to.
inline constexpr std::uint8_t zero_byte_code = 0x80;

/// A scale's top as an unsigned code (zigzag: small magnitudes, one byte).
inline std::uint64_t zigzag(std::int32_t v) { return (std::uint32_t(v) << 1) ^ std::uint32_t(v >> 31); }
inline std::int64_t unzigzag(std::uint64_t v) { return std::int64_t(v >> 1) ^ -std::int64_t(v & 1); }

/// append_byte_values for floats whose largest magnitude is a normal float, from the bits in
/// two passes that vectorize (the largest, then every code and whether each is exact; 16
/// binades of 3 mantissa bits: comm/byte_values.hpp's constants): the
/// same bytes as byte_scale's encode. Returns 1 (appended), 0 (some value has no code) or -1
/// (another case: the general path decides).
inline int append_float_byte_values(const std::byte* from, std::size_t count, std::vector<std::byte>& out) {
  std::uint32_t largest = 0;
  for (std::size_t j = 0; j < count; ++j) {
    std::uint32_t x;
    std::memcpy(&x, from + j * sizeof x, sizeof x);
    largest = std::max(largest, x & 0x7fffffffu);
  }
  const std::uint32_t biased = largest >> 23;  // the largest's biased exponent
  if (biased == 0 || biased == 0xff) return -1;  // zero or subnormal; not finite
  if ((largest & 0xfffffu) != 0) return 0;  // not rounded to 4 significant bits
  const std::int32_t top = std::int32_t(biased) - 127;
  append_code(out, zigzag(top));
  const std::size_t at = out.size();
  out.resize(at + count);
  const std::uint32_t lowest = biased - (byte_value_binades - 1);  // binade 0's biased exponent (may wrap)
  std::uint32_t inexact = 0;
  for (std::size_t j = 0; j < count; ++j) {
    std::uint32_t x;
    std::memcpy(&x, from + j * sizeof x, sizeof x);
    const std::uint32_t magnitude_bits = x & 0x7fffffffu, exponent = magnitude_bits >> 23;
    const std::uint32_t binade = exponent - lowest;
    const std::uint32_t magnitude = (binade << 3) | ((magnitude_bits >> 20) & 7u);
    const std::uint32_t zero = std::uint32_t(x == 0);
    const std::uint32_t coded = std::uint32_t(exponent != 0) & std::uint32_t(binade < 16u) &
                                std::uint32_t((magnitude_bits & 0xfffffu) == 0) & std::uint32_t(magnitude != 0);
    inexact |= ~(coded | zero) & 1u;
    const std::uint32_t code = zero ? std::uint32_t(zero_byte_code) : (magnitude & 0x7fu) | ((x >> 24) & 0x80u);
    out[at + j] = std::byte(code);
  }
  return inexact == 0 ? 1 : 0;
}

/// Appends count T values at from as compact8 codes: the scale of their largest (its top's
/// code), then a byte each; false when some value has no code that stands for it bit for bit
/// (not rounded for compact8, or not finite; out is then partly written). By byte_scale, for
/// every T.
template <class T>
bool append_byte_values_by_scale(const std::byte* from, std::size_t count, std::vector<T>& scratch,
                                 std::vector<std::byte>& out) {
  scratch.resize(count);
  std::memcpy(scratch.data(), from, count * sizeof(T));
  const auto scale = byte_scale<T>::of(std::span<const T>(scratch));
  append_code(out, zigzag(scale.top()));
  const std::size_t at = out.size();
  out.resize(at + count);
  const T zero(0);
  for (std::size_t j = 0; j < count; ++j) {
    const T v = scratch[j];
    std::uint8_t code = zero_byte_code;
    if (std::memcmp(&v, &zero, sizeof v) != 0) {
      T rounded;
      if (!std::isfinite(double(v)) || !scale.encode(v, code, rounded) || std::memcmp(&rounded, &v, sizeof v) != 0)
        return false;
    }
    out[at + j] = std::byte{code};
  }
  return true;
}

/// append_byte_values_by_scale's bytes, floats by their bits where they can be.
template <class T>
bool append_byte_values(const std::byte* from, std::size_t count, std::vector<T>& scratch,
                        std::vector<std::byte>& out) {
  if constexpr (std::is_same_v<T, float>) {
    const int fast = append_float_byte_values(from, count, out);
    if (fast >= 0) return fast == 1;
  }
  return append_byte_values_by_scale<T>(from, count, scratch, out);
}

/// Writes count compact8 codes at from as T values on the scale of top (one a payload may
/// name) into values.
template <class T>
void decode_byte_values(const std::byte* from, std::size_t count, std::int32_t top, std::byte* values) {
  const auto scale = *byte_scale<T>::named(top);
  for (std::size_t j = 0; j < count; ++j) {
    const auto code = std::uint8_t(from[j]);
    const T v = code == zero_byte_code ? T(0) : scale.decode(code);
    std::memcpy(values + j * sizeof(T), &v, sizeof v);
  }
}

/// A frame whose scale no payload of T may name (damaged) read as a failure naming it.
template <class T, class Index>
[[gnu::noinline, gnu::cold]] void pack_scale_failure(std::int64_t top, const wire_header& header,
                                                     const wire_format& format, std::span<std::byte> payload) {
  const runtime_error reason(sidco::detail::message("a frame named the 8-bit values' scale 2^", top,
                                                    ", outside the value type's (damaged in transit?)"));
  pack_failure<T, Index>(reason, std::size_t(header.dense_size),
                         wire_fields{header.tag, header.sequence, header.delta, reduction(header.op)}, format, payload);
}

/// Reads the code at bytes[at] into v and moves at past it; false when bytes end inside it
/// or it is longer than a 64-bit number's (damaged).
inline bool take_code(std::span<const std::byte> bytes, std::size_t& at, std::uint64_t& v) {
  v = 0;
  for (unsigned shift = 0; shift < 64 && at < bytes.size(); shift += 7) {
    const auto byte = std::uint64_t(bytes[at++]);
    v |= (byte & 0x7f) << shift;
    if (!(byte & 0x80)) return true;
  }
  return false;
}

}  // namespace detail

/// Appends payload (plain format) to out as a frame of kind.
template <class T, class Index>
void append_frame(std::span<const std::byte> payload, const wire_format& format, frame_kind kind,
                  std::vector<std::byte>& out) {
  using N = compact_value_t<T>;
  const wire_header h = header_of(payload);
  const std::size_t start = out.size();
  const auto append_whole = [&] {
    out.resize(start);
    const std::size_t length = used_bytes(payload, format);
    detail::append_code(out, 2 * std::uint64_t(length) + 1);
    detail::append_bytes(out, payload.data(), length);
  };
  const bool rebuilt = h.magic == wire_magic && h.version == wire_version && h.status == std::uint8_t(wire_status::ok) &&
                       format.coding == entry_coding::plain && h.count <= format.capacity;
  if (!rebuilt) return append_whole();
  const std::size_t count = std::size_t(h.count);
  detail::append_code(out, 2 * std::uint64_t(count));
  if (kind.with_trimmed) detail::append_code(out, h.trimmed);
  const std::byte* values = payload.data() + format.values_offset(count);
  if (kind.byte_values) {
    thread_local std::vector<T> scratch;
    if (count > 0 && !detail::append_byte_values<T>(values, count, scratch, out)) return append_whole();
  } else if (kind.narrow_values && !std::is_same_v<N, T>) {
    const std::size_t at = out.size();
    out.resize(at + count * sizeof(N));
    if (!detail::narrow_exactly<T>(values, count, out.data() + at)) return append_whole();  // not rounded for it
  } else {
    detail::append_bytes(out, values, count * sizeof(T));
  }
  const std::byte* indices = payload.data() + format.indices_offset();
  const std::size_t at = out.size();
  out.resize(at + count * 10);  // the longest a 64-bit gap codes to
  std::byte* code = out.data() + at;
  std::uint64_t next = 0;  // the smallest index the next one may be
  for (std::size_t j = 0; j < count; ++j) {
    const std::uint64_t index = detail::index_at<Index>(indices + j * sizeof(Index));
    code = detail::put_varint(index - next, code);  // ascending: index >= next
    next = index + 1;
  }
  out.resize(std::size_t(code - out.data()));
  // Gaps of a huge tensor can code longer than the payload: then the payload is shorter.
  if (out.size() - start > detail::varint_bytes(2 * std::uint64_t(used_bytes(payload, format)) + 1) +
                               used_bytes(payload, format))
    append_whole();
}

/// Frames of count payloads (format.bytes() each, one after another) into bytes, one after
/// another, and each one's span into frames (valid while bytes is unchanged).
template <class T, class Index>
void append_frames(std::span<const std::byte> payloads, std::size_t count, const wire_format& format, frame_kind kind,
                   std::vector<std::byte>& bytes, std::vector<std::span<const std::byte>>& frames) {
  const std::size_t payload = format.bytes();
  bytes.clear();
  std::vector<std::size_t> ends(count);
  for (std::size_t r = 0; r < count; ++r) {
    append_frame<T, Index>(payloads.subspan(r * payload, payload), format, kind, bytes);
    ends[r] = bytes.size();
  }
  frames.assign(count, {});
  for (std::size_t r = 0, begin = 0; r < count; begin = ends[r++])
    frames[r] = std::span<const std::byte>(bytes).subspan(begin, ends[r] - begin);
}

/// The length of the frame at the start of bytes, or 0 when bytes cannot hold it (damaged).
inline std::size_t frame_length(std::span<const std::byte> bytes, const wire_format& format, frame_kind kind) {
  std::size_t length = 0;
  std::uint64_t head = 0, trimmed = 0;
  if (!detail::take_code(bytes, length, head)) return 0;
  if (head & 1) {
    const std::uint64_t whole = head >> 1;
    return whole <= bytes.size() - length ? length + std::size_t(whole) : 0;
  }
  const std::uint64_t count = head >> 1;
  if (count > format.capacity) return 0;
  if (kind.with_trimmed && !detail::take_code(bytes, length, trimmed)) return 0;
  if (kind.byte_values && count > 0) {
    std::uint64_t top = 0;
    if (!detail::take_code(bytes, length, top) || top > 0xffffffffu) return 0;  // read_frame checks its range
  }
  const std::size_t values = std::size_t(count) * frame_value_bytes(format, kind);
  if (values > bytes.size() - length) return 0;
  length += values;
  for (std::uint64_t j = 0; j < count; ++j) {
    std::uint64_t gap;
    if (!detail::take_code(bytes, length, gap)) return 0;
  }
  return length;
}

/// Writes the frame (frame_length's bytes) into payload (format.bytes()) as the payload it
/// came from: an ok frame under header (this step's fields, as every rank has them). An
/// index that decodes past Index's range is written as its largest value, which agree()
/// refuses as outside the dense size.
template <class T, class Index>
void read_frame(std::span<const std::byte> frame, const wire_header& header, const wire_format& format,
                frame_kind kind, std::span<std::byte> payload) {
  using N = compact_value_t<T>;
  std::size_t at = 0;
  std::uint64_t head = 0, trimmed = 0;
  detail::take_code(frame, at, head);  // frame_length checked every code
  if (head & 1) {
    const std::size_t length = std::min<std::size_t>(std::size_t(head >> 1), payload.size());
    std::memcpy(payload.data(), frame.data() + at, length);
    std::memset(payload.data() + length, 0, payload.size() - length);
    return;
  }
  const std::size_t count = std::size_t(head >> 1);
  if (kind.with_trimmed) detail::take_code(frame, at, trimmed);
  std::uint64_t top = 0;  // compact8: the scale's top, its code
  if (kind.byte_values && count > 0) {
    detail::take_code(frame, at, top);
    if (!byte_scale<T>::named(std::int32_t(detail::unzigzag(top))))
      return detail::pack_scale_failure<T, Index>(detail::unzigzag(top), header, format, payload);
  }
  wire_header h = header;
  h.count = count;
  h.trimmed = trimmed;
  std::memset(payload.data(), 0, payload.size());
  detail::write_header(h, payload);
  std::byte* values = payload.data() + format.values_offset(count);
  if (kind.byte_values && count > 0) {
    detail::decode_byte_values<T>(frame.data() + at, count, std::int32_t(detail::unzigzag(top)), values);
    at += count;
  } else if (kind.narrow_values && !std::is_same_v<N, T>) {
    for (std::size_t j = 0; j < count; ++j, at += sizeof(N)) {
      N narrowed;
      std::memcpy(&narrowed, frame.data() + at, sizeof narrowed);
      const T v(narrowed);
      std::memcpy(values + j * sizeof(T), &v, sizeof v);
    }
  } else {
    std::memcpy(values, frame.data() + at, count * sizeof(T));
    at += count * sizeof(T);
  }
  std::byte* indices = payload.data() + format.indices_offset();
  std::uint64_t next = 0;
  for (std::size_t j = 0; j < count; ++j) {
    std::uint64_t gap = 0;
    detail::take_code(frame, at, gap);
    const std::uint64_t wide = next + gap;
    const Index index = wide > std::uint64_t(std::numeric_limits<Index>::max()) || wide < next
                            ? std::numeric_limits<Index>::max()
                            : Index(wide);
    std::memcpy(indices + j * sizeof(Index), &index, sizeof index);
    next = wide + 1;
  }
}

/// Writes each frame s (of frames) into slot(s), a payload's bytes, as read_frame does.
template <class T, class Index, class Slot>
void read_frames(std::span<const std::span<const std::byte>> frames, const wire_header& header,
                 const wire_format& format, frame_kind kind, Slot&& slot) {
  for (std::size_t s = 0; s < frames.size(); ++s) read_frame<T, Index>(frames[s], header, format, kind, slot(s));
}

/// Appends a frame that says rank `who` failed, for reason.
template <class T, class Index>
void append_failure_frame(const std::exception& reason, std::size_t dense_size, const wire_fields& fields,
                          const wire_format& format, std::vector<std::byte>& scratch, std::vector<std::byte>& out) {
  scratch.resize(format.bytes());
  pack_failure<T, Index>(reason, dense_size, fields, format, std::span<std::byte>(scratch));
  append_frame<T, Index>(std::span<const std::byte>(scratch), format, frame_kind{}, out);
}

/// Takes the 8-byte digest off the front of message; what is wrong with it (too short, or,
/// when compare, not mine: a rank at another step or tensor), or nullptr.
inline const char* take_digest(std::span<const std::byte>& message, std::uint64_t mine, bool compare) {
  std::uint64_t theirs = 0;
  if (message.size() < sizeof theirs) return "a message shorter than its digest";
  std::memcpy(&theirs, message.data(), sizeof theirs);
  message = message.subspan(sizeof theirs);
  if (compare && theirs != mine)
    return "another tensor, step, density, reduction or size than this rank's (ranks out of step?)";
  return nullptr;
}

/// A transport that sends each rank a message of its own holding one payload (the hook's
/// all-to-all at split sizes, its all-gather of selections): the sender's digest of the
/// step's fields when given (round 1), then the frame.
template <class T, class Index>
void append_message(std::span<const std::byte> payload, const wire_format& format, frame_kind kind,
                    const std::uint64_t* digest, std::vector<std::byte>& out) {
  if (digest != nullptr) detail::append_bytes(out, digest, sizeof *digest);
  append_frame<T, Index>(payload, format, kind, out);
}

/// Writes the payload a message of append_message carries (header: this step's fields, as
/// this rank has them) into payload (format.bytes()). A message from rank `sender` that
/// cannot be read (cut short, longer than its frame and not zero past it, or, with digest,
/// at another digest: a rank at another step or tensor) becomes a failure payload naming
/// it, which the owner relays.
template <class T, class Index>
void read_message(std::span<const std::byte> message, const wire_header& header, const wire_format& format,
                  frame_kind kind, const std::uint64_t* digest, std::size_t sender, std::span<std::byte> payload) {
  const char* problem = digest != nullptr ? take_digest(message, *digest, true) : nullptr;
  std::size_t length = 0;
  if (problem == nullptr) {
    length = frame_length(message, format, kind);
    if (length == 0) problem = "a message cut short (damaged in transit?)";
    else if (!detail::all_zero(message.data() + length, message.data() + message.size()))
      problem = "a message longer than its frame (damaged in transit?)";
  }
  if (problem == nullptr) return read_frame<T, Index>(message.first(length), header, format, kind, payload);
  const runtime_error reason(sidco::detail::message("the message from rank ", sender, " held ", problem));
  pack_failure<T, Index>(reason, std::size_t(header.dense_size),
                         wire_fields{header.tag, header.sequence, header.delta, reduction(header.op)}, format, payload);
}

/// count payloads (format.bytes() each, one after another) as messages of append_message,
/// one after another in out, each led by digest when given (one to each owner: round 1's
/// blocks; one for all: a selection). Returns each message's size.
template <class T, class Index>
std::vector<std::size_t> append_messages(std::span<const std::byte> payloads, std::size_t count,
                                         const wire_format& format, frame_kind kind, const std::uint64_t* digest,
                                         std::vector<std::byte>& out) {
  const std::size_t bytes = format.bytes();
  std::vector<std::size_t> sizes(count);
  for (std::size_t r = 0; r < count; ++r) {
    const std::size_t before = out.size();
    append_message<T, Index>(payloads.subspan(r * bytes, bytes), format, kind, digest, out);
    sizes[r] = out.size() - before;
  }
  return sizes;
}

/// Reads messages[r], the message from rank r, into slot(r) (a payload's bytes), as
/// read_message does: one that cannot be read becomes a failure payload naming rank r.
template <class T, class Index, class Slot>
void read_messages(std::span<const std::span<const std::byte>> messages, const wire_header& header,
                   const wire_format& format, frame_kind kind, const std::uint64_t* digest, Slot&& slot) {
  for (std::size_t r = 0; r < messages.size(); ++r)
    read_message<T, Index>(messages[r], header, format, kind, digest, r, slot(r));
}

}  // namespace sidco::comm
