// The one-round exchange's payload: what each rank puts on the wire for one tensor in one
// step, whatever carries it (MPI_Iallgather, torch.distributed's all_gather, NCCL). Every
// payload has the same size: a 64-byte header, then `capacity` indices (32-bit below 2^32
// values), then `capacity` values in the tensor's own type; a rank whose compress failed
// sends its error message in their place. Every rank reads the same payloads, so every
// rank reaches the same verdict: the same result, bit for bit, or the same error.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <functional>
#include <queue>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

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
inline constexpr std::uint8_t wire_version = 1;

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
  std::uint16_t reserved;
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

/// Where things lie in a payload of `capacity` entries.
struct wire_format {
  std::size_t capacity = 0;
  std::size_t index_bytes = 4;
  std::size_t value_bytes = 4;

  static constexpr std::size_t header_bytes = sizeof(wire_header);
  /// Room for a failure's message, whatever the capacity.
  static constexpr std::size_t min_message_bytes = 256;

  std::size_t indices_offset() const { return header_bytes; }
  std::size_t values_offset() const { return header_bytes + padded(capacity * index_bytes); }
  std::size_t bytes() const {
    return std::max(values_offset() + padded(capacity * value_bytes), header_bytes + min_message_bytes);
  }
  std::size_t message_bytes() const { return bytes() - header_bytes; }

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

inline bool all_zero(const std::byte* from, const std::byte* to) {
  unsigned char any = 0;  // no early exit: the compiler vectorizes the OR
  for (const std::byte* b = from; b < to; ++b) any |= static_cast<unsigned char>(*b);
  return any == 0;
}

/// Whether count entries are all well formed: indices ascending and below dense_size,
/// values finite. agree() says what is wrong. Two loops without a branch or a carried
/// variable, each OR-ing into an integer of its element's width: g++ and clang vectorize
/// both (a bool accumulator, or one loop keeping the previous index, stayed scalar).
template <class T, class Index>
bool entries_ok(const std::byte* indices, const std::byte* values, std::size_t count, std::uint64_t dense_size) {
  if (count == 0) return true;
  Index descending = 0;  // ascending indices below dense_size: the last one bounds the rest
  for (std::size_t j = 1; j < count; ++j) {
    Index before, at;
    std::memcpy(&before, indices + (j - 1) * sizeof(Index), sizeof before);
    std::memcpy(&at, indices + j * sizeof(Index), sizeof at);
    descending |= Index(at <= before);
  }
  typename float_traits<T>::key nonfinite = 0;
  for (std::size_t j = 0; j < count; ++j) nonfinite |= decltype(nonfinite)(!finite_at<T>(values + j * sizeof(T)));
  Index last;
  std::memcpy(&last, indices + (count - 1) * sizeof(Index), sizeof last);
  return descending == 0 && nonfinite == 0 && std::uint64_t(last) < dense_size;
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
  if (format.index_bytes != sizeof(Index) || format.value_bytes != sizeof(T))
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
  // An empty vector may hold no buffer at all: memcpy from null is undefined even for 0 bytes.
  if (n > 0) std::memcpy(base + format.indices_offset(), indices.data(), n * sizeof(Index));
  std::memset(base + format.indices_offset() + n * sizeof(Index), 0, format.values_offset() - format.indices_offset() - n * sizeof(Index));
  if (n > 0) std::memcpy(base + format.values_offset(), values.data(), n * sizeof(T));
  std::memset(base + format.values_offset() + n * sizeof(T), 0, format.bytes() - format.values_offset() - n * sizeof(T));
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

/// Throws sidco::runtime_error for the first problem in rank order, with the same message on
/// every rank (they all read the same payloads): a payload that is not sidco's, or of
/// another version; a rank that failed (with its message); a tag, step, dense size,
/// density, value type, index width, reduction or capacity unlike rank 0's; a status that is
/// neither ok nor failed; a count over the capacity; indices not strictly ascending or
/// outside the dense size; a value that is not finite (it would poison every rank's
/// update); a slot past the count that is not zero (pack() zeroes them). Messages from failed ranks are read as UTF-8 with replacement. Reads only.
template <class T, class Index>
void agree(payload_views payloads, const wire_format& format) {
  if (payloads.empty()) sidco::detail::fail("exchange: no payloads");
  for (const auto& p : payloads) detail::check_payload_size(p, format);
  auto fail = [](const wire_header& h, const auto&... parts) { detail::disagree(h, parts...); };
  const std::size_t ranks = payloads.size();
  for (std::size_t r = 0; r < ranks; ++r) {
    const wire_header h = detail::read_header(payloads[r]);
    if (h.magic != wire_magic)
      throw runtime_error(sidco::detail::message("exchange: rank ", r, " sent a payload that is not sidco's (magic ",
                                                 h.magic, ")"));
    if (h.version != wire_version)
      throw runtime_error(sidco::detail::message("exchange: rank ", r, " speaks wire version ", int(h.version),
                                                 ", this rank ", int(wire_version), " (mixed sidco versions?)"));
    if (h.status > std::uint8_t(wire_status::relayed))
      fail(h, "rank ", r, " sent status ", int(h.status), ", neither ok (0), failed (1) nor relayed (2)");
  }
  // Failures first: they explain whatever else differs. Only non-finite input among them
  // raises nonfinite_exchange.
  const bool only_nonfinite = failed_for_nonfinite_input(payloads);
  for (std::size_t r = 0; r < ranks; ++r) {
    const wire_header h = detail::read_header(payloads[r]);
    if (h.status == std::uint8_t(wire_status::ok)) continue;
    std::size_t others = 0;
    for (std::size_t q = r + 1; q < ranks; ++q)
      others += detail::read_header(payloads[q]).status != std::uint8_t(wire_status::ok);
    const std::size_t length = std::min<std::size_t>(std::size_t(h.count), format.message_bytes());
    std::string_view reason(reinterpret_cast<const char*>(payloads[r].data() + sizeof h), length);
    if (reason.starts_with("sidco: ")) reason.remove_prefix(7);
    // A message cut mid-sequence, or bytes that are not text, still read as a message.
    const std::string text = sidco::detail::valid_utf8(reason);
    if (h.status == std::uint8_t(wire_status::relayed)) {
      if (only_nonfinite) throw nonfinite_exchange("sidco: " + text);
      throw runtime_error("sidco: " + text);
    }
    const std::string message =
        others ? sidco::detail::message("exchange (tag ", h.tag, ", step ", h.sequence, "): rank ", r, " failed (",
                                        others, " later rank(s) failed too): ", text)
               : sidco::detail::message("exchange (tag ", h.tag, ", step ", h.sequence, "): rank ", r, " failed: ", text);
    if (only_nonfinite) throw nonfinite_exchange(message);
    throw runtime_error(message);
  }
  const wire_header first = detail::read_header(payloads[0]);
  for (std::size_t r = 1; r < ranks; ++r) {
    const wire_header h = detail::read_header(payloads[r]);
    if (h.tag != first.tag) fail(first, "rank ", r, " sent tag ", h.tag, ", rank 0 tag ", first.tag, " (exchanges out of order)");
    if (h.sequence != first.sequence)
      fail(first, "rank ", r, " is at step ", h.sequence, ", rank 0 at step ", first.sequence, " (ranks out of step)");
    if (h.dense_size != first.dense_size)
      fail(first, "rank ", r, " has dense size ", h.dense_size, ", rank 0 has ", first.dense_size);
    if (std::memcmp(&h.delta, &first.delta, sizeof h.delta) != 0)
      fail(first, "rank ", r, " has density ", h.delta, ", rank 0 has ", first.delta);
    if (h.value_code != first.value_code)
      fail(first, "rank ", r, " sends ", detail::value_name(h.value_code), " values, rank 0 ",
           detail::value_name(first.value_code));
    if (h.index_bytes != first.index_bytes)
      fail(first, "rank ", r, " sends ", int(h.index_bytes), "-byte indices, rank 0 ", int(first.index_bytes));
    if (h.op != first.op)
      fail(first, "rank ", r, " reduces by ", detail::op_name(h.op), ", rank 0 by ", detail::op_name(first.op));
    if (h.capacity != first.capacity)
      fail(first, "rank ", r, " has capacity ", h.capacity, ", rank 0 has ", first.capacity);
  }
  if (first.value_code != float_traits<T>::wire_code || first.index_bytes != sizeof(Index) ||
      first.capacity != format.capacity)
    fail(first, "the payloads hold ", detail::value_name(first.value_code), " values, ", int(first.index_bytes),
         "-byte indices and capacity ", first.capacity, "; this rank decodes ", float_traits<T>::name, ", ",
         sizeof(Index), "-byte indices and capacity ", format.capacity);
  if (first.op != std::uint8_t(reduction::sum) && first.op != std::uint8_t(reduction::average))
    fail(first, "rank 0 asks for reduction ", int(first.op), ", neither sum nor average");
  for (std::size_t r = 0; r < ranks; ++r) {
    const wire_header h = detail::read_header(payloads[r]);
    if (h.count > h.capacity) fail(first, "rank ", r, " sent ", h.count, " entries, over the capacity ", h.capacity);
    const std::byte* at = payloads[r].data() + format.indices_offset();
    const std::byte* values = payloads[r].data() + format.values_offset();
    // One branch-free pass finds whether anything is wrong; the loops below say what.
    if (detail::entries_ok<T, Index>(at, values, std::size_t(h.count), h.dense_size) &&
        detail::all_zero(at + h.count * sizeof(Index), values) &&
        detail::all_zero(values + h.count * sizeof(T), payloads[r].data() + payloads[r].size()))
      continue;
    std::uint64_t previous = 0;
    for (std::size_t j = 0; j < h.count; ++j) {
      Index i;
      std::memcpy(&i, at + j * sizeof(Index), sizeof i);
      if (std::uint64_t(i) >= h.dense_size)
        fail(first, "rank ", r, " sent index ", std::uint64_t(i), " at position ", j, ", outside dense size ",
             h.dense_size);
      if (j > 0 && std::uint64_t(i) <= previous)
        fail(first, "rank ", r, " sent index ", std::uint64_t(i), " at position ", j, " after ", previous,
             " (indices must ascend)");
      previous = std::uint64_t(i);
    }
    for (std::size_t j = 0; j < h.count; ++j)
      if (!detail::finite_at<T>(values + j * sizeof(T)))
        fail(first, "rank ", r, " sent a non-finite value at position ", j, " (index ",
             detail::index_at<Index>(at + j * sizeof(Index)), ")");
    // pack() zeroes every slot past the count: a count lowered in transit shows here.
    if (!detail::all_zero(at + h.count * sizeof(Index), values) ||
        !detail::all_zero(values + h.count * sizeof(T), payloads[r].data() + payloads[r].size()))
      fail(first, "rank ", r, " sent a payload with entries past its count ", h.count, " (damaged in transit?)");
  }
}

/// Up to this many ranks, decode merges by scanning every rank's cursor per index.
inline constexpr std::size_t merge_scan_ranks = 8;

/// What an exchange delivered.
struct exchange_report {
  std::size_t entries = 0;   // entries from every rank together
  std::size_t distinct = 0;  // indices written
  std::size_t trimmed = 0;   // entries ranks returned to their residuals for want of capacity
  std::size_t bytes = 0;     // bytes each rank sent
  int ranks = 0;
};

/// dense = per index, 0 plus the ranks' values added in rank order (in T; in float for
/// 16-bit types) and, for reduction::average, divided once by the rank count (where that
/// sum overflows, each value divided before the sum instead, so an average is finite where
/// every value is); 0 where no rank sent anything. Every rank gets the same bits. Calls agree() first: on any problem it throws
/// having written nothing. dense must have the exchange's dense size.
template <class T, class Index>
exchange_report decode(payload_views payloads, const wire_format& format, std::span<T> dense) {
  agree<T, Index>(payloads, format);
  const wire_header first = detail::read_header(payloads[0]);
  if (dense.size() != first.dense_size)
    sidco::detail::fail("decode: dense: size ", dense.size(), " does not match the exchange's dense size ",
                        first.dense_size);
  using A = typename float_traits<T>::accumulator;
  const std::size_t ranks = payloads.size();
  struct cursor {
    const std::byte* indices;
    const std::byte* values;
    std::size_t count, at;
    std::uint64_t index() const {
      Index i;
      std::memcpy(&i, indices + at * sizeof(Index), sizeof i);
      return std::uint64_t(i);
    }
    A value() const {
      T v;
      std::memcpy(&v, values + at * sizeof(T), sizeof v);
      return A(v);
    }
  };
  exchange_report report;
  report.ranks = int(ranks);
  report.bytes = format.bytes();
  std::vector<cursor> cursors(ranks);
  for (std::size_t r = 0; r < ranks; ++r) {
    const wire_header h = detail::read_header(payloads[r]);
    cursors[r] = {payloads[r].data() + format.indices_offset(), payloads[r].data() + format.values_offset(),
                  std::size_t(h.count), 0};
    report.entries += std::size_t(h.count);
    report.trimmed += std::size_t(h.trimmed);
  }
  const bool average = first.op == std::uint8_t(reduction::average);
  const A divisor = A(double(ranks));
  std::vector<A> values;  // one index's values, in rank order
  values.reserve(ranks);
  // The sum, divided once for an average; where that sum overflows (every value is finite,
  // agree() checked), the sum of the values each divided first, as a dense all-reduce of
  // averaged buffers would give.
  auto write = [&](std::uint64_t index) {
    A sum = A(0);
    for (const A v : values) sum = A(sum + v);
    if (average) {
      if (std::isfinite(double(sum))) {
        sum = A(sum / divisor);
      } else {
        sum = A(0);
        for (const A v : values) sum = A(sum + A(v / divisor));
      }
    }
    dense[std::size_t(index)] = T(sum);
    values.clear();
    ++report.distinct;
  };
  std::fill(dense.begin(), dense.end(), T(0));
  // A ranks-way merge of ascending runs: each index's values added in rank order, written
  // once. Few ranks: a scan of the cursors; many: a heap ordered by (index, rank), which
  // pops an index's entries in rank order too.
  if (ranks <= merge_scan_ranks) {
    for (;;) {
      std::uint64_t next = UINT64_MAX;
      for (const cursor& c : cursors)
        if (c.at < c.count) next = std::min(next, c.index());
      if (next == UINT64_MAX) break;
      for (cursor& c : cursors)
        if (c.at < c.count && c.index() == next) {
          values.push_back(c.value());
          ++c.at;
        }
      write(next);
    }
    return report;
  }
  using entry = std::pair<std::uint64_t, std::size_t>;  // (index, rank)
  std::priority_queue<entry, std::vector<entry>, std::greater<entry>> heap;
  for (std::size_t r = 0; r < ranks; ++r)
    if (cursors[r].count) heap.push({cursors[r].index(), r});
  while (!heap.empty()) {
    const std::uint64_t index = heap.top().first;
    while (!heap.empty() && heap.top().first == index) {
      const std::size_t r = heap.top().second;
      cursor& c = cursors[r];
      heap.pop();
      values.push_back(c.value());
      if (++c.at < c.count) heap.push({c.index(), r});
    }
    write(index);
  }
  return report;
}

/// After a failed exchange: every entry this rank's payload sent goes back into residual
/// (residual[index] = value, where the compressor had left +0), so that the step's
/// gradient waits there for the next step instead of being lost.
template <class T, class Index>
void return_to_residual(std::span<const std::byte> own_payload, const wire_format& format, std::span<T> residual) {
  detail::check_payload_size(own_payload, format);
  const wire_header h = detail::read_header(own_payload);
  if (h.status != std::uint8_t(wire_status::ok)) return;  // it sent nothing
  for (std::size_t j = 0; j < h.count; ++j) {
    Index i;
    T v;
    std::memcpy(&i, own_payload.data() + format.indices_offset() + j * sizeof(Index), sizeof i);
    std::memcpy(&v, own_payload.data() + format.values_offset() + j * sizeof(T), sizeof v);
    if (std::size_t(i) < residual.size()) residual[std::size_t(i)] = v;
  }
}

/// The header of a payload (for reports and tests).
inline wire_header header_of(std::span<const std::byte> payload) {
  if (payload.size() < sizeof(wire_header)) sidco::detail::fail("payload: ", payload.size(), " bytes, shorter than a header");
  return detail::read_header(payload);
}

}  // namespace sidco::comm
