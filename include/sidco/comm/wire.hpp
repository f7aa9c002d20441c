// The exchanges' payload: what a rank puts on the wire for one tensor in one collective,
// whatever carries it (MPI, torch.distributed, NCCL): the all-gather's payload, the
// reduce-scatter's blocks and owners' selections. Every payload of a collective has the
// same size: a 64-byte header, then its `count` indices (32-bit below 2^32 values, padded to
// 8 bytes), then `count` values in the tensor's own type, then zeros up to the capacity's
// size; a rank that failed sends its error message in their place. What a payload uses is
// a prefix (used_bytes), so a transport that exchanges sizes first sends only that. Every rank checks the same payloads (comm/agree.hpp), so every rank reaches
// the same verdict: the same result, bit for bit, or the same error.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "sidco/comm/options.hpp"
#include "sidco/comm/report.hpp"
#include "sidco/core/error.hpp"
#include "sidco/core/float_traits.hpp"
#include "sidco/core/sparse_vector.hpp"
#include "sidco/core/utf8.hpp"

namespace sidco::comm {

/// failed: this rank failed (the message is its reason); relayed: this rank passes on an
/// error a collective before this one raised (the reduce-scatter exchange's owners relay
/// what they found in the blocks they received; the message is the whole error).
enum class wire_status : std::uint8_t { ok = 0, failed = 1, relayed = 2 };
/// What a failed rank threw: an invalid argument (sidco::error), anything else, or input
/// that was not finite (sidco::nonfinite_error: an overflow under mixed precision, say).
enum class error_kind : std::uint8_t { none = 0, invalid_argument = 1, runtime = 2, nonfinite = 3 };

/// Raised alike on every rank when every rank that failed an exchange failed because its
/// input was not finite (its compress threw sidco::nonfinite_error); a loop that scales its
/// loss may skip the step (each rank's sent entries are back in its residual, as after any
/// failed exchange). Any other failure raises sidco::runtime_error.
class nonfinite_exchange : public runtime_error {
 public:
  using runtime_error::runtime_error;
};

inline constexpr std::uint32_t wire_magic = 0x57434453;  // "SDCW" in little-endian bytes
// 2: an owner's selection carries each index's update (sum or average), not its sum.
// 3: a plain payload's values follow its count indices (used bytes are a prefix).
// 4: a compact payload names its index code (gaps or Elias-Fano) in index_code.
inline constexpr std::uint8_t wire_version = 4;

/// Bytes of index code a compact payload holds per entry of capacity where its format does
/// not say (index_room 0): a gap below 2^14 takes at most two bytes; most take one.
inline constexpr std::size_t compact_index_budget = 2;

/// A payload's first 64 bytes, in host byte order (the ranks of one job share it). Every
/// field but status, error, count and trimmed must be equal on every rank.
struct wire_header {
  std::uint32_t magic;
  std::uint8_t version;
  std::uint8_t status;       // wire_status
  std::uint8_t value_code;   // float_traits<T>::wire_code
  std::uint8_t index_bytes;  // 4 or 8
  std::uint8_t op;           // reduction
  std::uint8_t error;        // error_kind, when failed
  std::uint8_t coding;       // entry_coding
  std::uint8_t index_code;   // compact payloads: comm/compact.hpp's index_code; plain: 0
  std::uint32_t tag;         // which tensor or bucket: the caller's number
  std::uint64_t dense_size;
  std::uint64_t capacity;
  std::uint64_t count;       // entries sent; when failed, the message's length in bytes
  std::uint64_t sequence;    // the step
  std::uint64_t trimmed;     // entries over capacity, returned to the residual
  double delta;
};
static_assert(sizeof(wire_header) == 64, "wire_header: 64 bytes on every platform");

/// What every rank sets alike in its header.
struct wire_fields {
  std::uint32_t tag = 0;
  std::uint64_t sequence = 0;
  double delta = 0;
  reduction op = reduction::average;
};

/// Where things lie in a payload of `capacity` entries. Plain: the count indices, then the
/// count values, then zeros. Compact (comm/compact.hpp): value_bytes is the narrowed value's
/// width, and the body holds the values' scale (compact8: 8 bytes), capacity values, then
/// index_room bytes of index code (capacity x compact_index_budget where index_room is 0).
struct wire_format {
  std::size_t capacity = 0;
  std::size_t index_bytes = 4;
  std::size_t value_bytes = 4;
  entry_coding coding = entry_coding::plain;
  std::size_t index_room = 0;  // compact: the index code's room (compact_format_for)

  static constexpr std::size_t header_bytes = sizeof(wire_header);
  /// Room for a failure's message, whatever the capacity.
  static constexpr std::size_t min_message_bytes = 256;

  std::size_t indices_offset() const { return header_bytes; }
  /// Plain: where the values of a payload of count entries begin.
  std::size_t values_offset(std::size_t count) const { return header_bytes + padded(count * index_bytes); }
  /// A payload's size: what its capacity (or a failure's message) may take.
  std::size_t bytes() const {
    if (is_compact(coding)) {
      const std::size_t body = scale_bytes() + (index_room > 0 ? padded(capacity * value_bytes) + index_room
                                                               : capacity * (value_bytes + compact_index_budget));
      return header_bytes + std::max(padded(body), min_message_bytes);
    }
    return std::max(padded(plain_bytes(capacity)), header_bytes + min_message_bytes);
  }
  /// Plain: the bytes a payload of count entries uses (the rest of bytes() is zero).
  std::size_t plain_bytes(std::size_t count) const { return values_offset(count) + count * value_bytes; }
  std::size_t message_bytes() const { return bytes() - header_bytes; }
  /// Compact8: the bytes of the values' scale at the body's start (comm/byte_values.hpp).
  std::size_t scale_bytes() const { return coding == entry_coding::compact8 ? 8 : 0; }

 private:
  static std::size_t padded(std::size_t n) { return (n + 7) / 8 * 8; }
};

/// The format for T values and Index indices; Index must hold every index below dense_size.
template <class T, class Index>
wire_format format_for(std::size_t capacity) {
  return {capacity, sizeof(Index), sizeof(T)};
}

namespace detail {

inline wire_header read_header(std::span<const std::byte> payload) {
  wire_header h;
  std::memcpy(&h, payload.data(), sizeof h);
  return h;
}

inline void write_header(const wire_header& h, std::span<std::byte> payload) {
  std::memcpy(payload.data(), &h, sizeof h);
}

inline void check_payload_size(std::span<const std::byte> payload, const wire_format& format) {
  if (payload.size() != format.bytes())
    sidco::detail::fail("payload: ", payload.size(), " bytes, the format takes ", format.bytes());
}

template <class T, class Index>
wire_header header_for(const wire_fields& f, std::size_t dense_size, const wire_format& format) {
  wire_header h{};
  h.magic = wire_magic;
  h.version = wire_version;
  h.status = std::uint8_t(wire_status::ok);
  h.value_code = float_traits<T>::wire_code;
  h.index_bytes = std::uint8_t(sizeof(Index));
  h.coding = std::uint8_t(format.coding);
  h.op = std::uint8_t(f.op);
  h.tag = f.tag;
  h.dense_size = dense_size;
  h.capacity = format.capacity;
  h.sequence = f.sequence;
  h.delta = f.delta;
  return h;
}

/// Whether the T stored at at is finite (by its bits: any T sidco sends, 16-bit included).
template <class T>
bool finite_at(const std::byte* at) {
  typename float_traits<T>::key bits;
  std::memcpy(&bits, at, sizeof bits);
  return (bits & ~float_traits<T>::sign) < float_traits<T>::infinity;
}

template <class Index>
std::uint64_t index_at(const std::byte* at) {
  Index i;
  std::memcpy(&i, at, sizeof i);
  return std::uint64_t(i);
}

inline const char* op_name(std::uint8_t op) {
  return op == std::uint8_t(reduction::sum) ? "sum" : op == std::uint8_t(reduction::average) ? "average" : "unknown";
}

inline const char* value_name(std::uint8_t code) {
  switch (code) {
    case 1: return "float32";
    case 2: return "float64";
    case 3: return "float16";
    case 4: return "bfloat16";
    default: return "an unknown type";
  }
}

/// The error every rank raises alike: sidco::runtime_error naming the exchange.
template <class... Parts>
[[noreturn]] void disagree(const wire_header& h, const Parts&... parts) {
  throw runtime_error(sidco::detail::message("exchange (tag ", h.tag, ", step ", h.sequence, "): ", parts...));
}

}  // namespace detail

/// Writes the entries (indices[j], values[j]) of a dense vector of dense_size values (at
/// most format.capacity of them, indices ascending) into payload (format.bytes() long); the
/// unused slots are zeroed, so no stale memory goes on the wire.
template <class T, class Index>
void pack(std::span<const Index> indices, std::span<const T> values, std::size_t dense_size, std::size_t trimmed,
          const wire_fields& fields, const wire_format& format, std::span<std::byte> payload) {
  detail::check_payload_size(payload, format);
  if (format.index_bytes != sizeof(Index) || format.value_bytes != sizeof(T) || format.coding != entry_coding::plain)
    sidco::detail::fail("pack: the format holds ", format.index_bytes, "-byte indices and ", format.value_bytes,
                        "-byte values, the sparse vector ", sizeof(Index), " and ", sizeof(T));
  if (indices.size() != values.size())
    sidco::detail::fail("pack: ", indices.size(), " indices and ", values.size(), " values");
  const std::size_t n = indices.size();
  if (n > format.capacity)
    sidco::detail::fail("pack: ", n, " entries exceed the capacity ", format.capacity, " (trim first)");
  wire_header h = detail::header_for<T, Index>(fields, dense_size, format);
  h.count = n;
  h.trimmed = trimmed;
  std::byte* const base = payload.data();
  const std::size_t values_at = format.values_offset(n), used = format.plain_bytes(n);
  // An empty vector may hold no buffer at all: memcpy from null is undefined even for 0 bytes.
  if (n > 0) std::memcpy(base + format.indices_offset(), indices.data(), n * sizeof(Index));
  std::memset(base + format.indices_offset() + n * sizeof(Index), 0, values_at - format.indices_offset() - n * sizeof(Index));
  if (n > 0) std::memcpy(base + values_at, values.data(), n * sizeof(T));
  std::memset(base + used, 0, format.bytes() - used);
  detail::write_header(h, payload);
}

/// Writes sent (at most format.capacity entries) into payload, as above.
template <class T, class Index>
void pack(const sparse_vector<T, Index>& sent, std::size_t trimmed, const wire_fields& fields,
          const wire_format& format, std::span<std::byte> payload) {
  pack<T, Index>(sent.indices(), sent.values(), sent.dense_size(), trimmed, fields, format, payload);
}

/// Writes a payload that says this rank failed, and why (the exception's message, cut to
/// the room the format has), so that every rank can raise the same error.
template <class T, class Index>
void pack_failure(const std::exception& reason, std::size_t dense_size, const wire_fields& fields,
                  const wire_format& format, std::span<std::byte> payload,
                  wire_status status = wire_status::failed) {
  detail::check_payload_size(payload, format);
  wire_header h = detail::header_for<T, Index>(fields, dense_size, format);
  h.status = std::uint8_t(status);
  h.error = std::uint8_t(dynamic_cast<const nonfinite_error*>(&reason) || dynamic_cast<const nonfinite_exchange*>(&reason)
                             ? error_kind::nonfinite
                         : dynamic_cast<const sidco::error*>(&reason) ? error_kind::invalid_argument
                                                                       : error_kind::runtime);
  const std::string_view text = sidco::detail::utf8_prefix(reason.what(), format.message_bytes());
  h.count = text.size();
  std::memset(payload.data() + sizeof h, 0, format.message_bytes());
  std::memcpy(payload.data() + sizeof h, text.data(), std::size_t(h.count));
  detail::write_header(h, payload);
}

/// The payloads of one exchange, one per rank in rank order.
using payload_views = std::span<const std::span<const std::byte>>;

/// Whether some payload reports a failure and every one that does failed (or relays a
/// failure) for input that was not finite: what agree() raises as nonfinite_exchange.
/// Reads the headers only (payloads shorter than a header count as not such a failure).
inline bool failed_for_nonfinite_input(payload_views payloads) {
  bool any = false;
  for (const auto& p : payloads) {
    if (p.size() < sizeof(wire_header)) return false;
    const wire_header h = detail::read_header(p);
    if (h.magic != wire_magic || h.version != wire_version) return false;
    if (h.status == std::uint8_t(wire_status::ok)) continue;
    if (h.error != std::uint8_t(error_kind::nonfinite)) return false;
    any = true;
  }
  return any;
}

/// The header of a payload (for reports and tests).
inline wire_header header_of(std::span<const std::byte> payload) {
  if (payload.size() < sizeof(wire_header)) sidco::detail::fail("payload: ", payload.size(), " bytes, shorter than a header");
  return detail::read_header(payload);
}

/// The bytes a plain payload (or a failure's) uses, as pack() and pack_failure() wrote it:
/// a prefix, past which it is zero. A receiver that zeroes the rest reads the same payload.
/// A header it cannot read (damaged, another version) counts whole: agree() explains it.
inline std::size_t used_bytes(std::span<const std::byte> payload, const wire_format& format) {
  const wire_header h = header_of(payload);
  if (h.magic != wire_magic || h.version != wire_version || format.coding != entry_coding::plain) return payload.size();
  if (h.status != std::uint8_t(wire_status::ok))
    return std::min(payload.size(), sizeof h + std::size_t(std::min<std::uint64_t>(h.count, format.message_bytes())));
  if (h.count > format.capacity) return payload.size();
  return std::min(payload.size(), format.plain_bytes(std::size_t(h.count)));
}

}  // namespace sidco::comm
