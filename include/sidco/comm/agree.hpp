// The check every rank runs on the payloads of one collective before it reads a value:
// the same payloads give the same verdict on every rank, so a problem anywhere (a rank that
// failed, one at another step, a payload damaged in transit) is the same error everywhere.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <string_view>

#include "sidco/comm/wire.hpp"
#include "sidco/core/error.hpp"
#include "sidco/core/float_traits.hpp"
#include "sidco/core/utf8.hpp"

namespace sidco::comm {

namespace detail {

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

}  // namespace detail

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
    if (h.coding != first.coding)
      fail(first, "rank ", r, " codes its entries ", int(h.coding), ", rank 0 ", int(first.coding));
    if (h.capacity != first.capacity)
      fail(first, "rank ", r, " has capacity ", h.capacity, ", rank 0 has ", first.capacity);
  }
  if (first.value_code != float_traits<T>::wire_code || first.index_bytes != sizeof(Index) ||
      first.capacity != format.capacity)
    fail(first, "the payloads hold ", detail::value_name(first.value_code), " values, ", int(first.index_bytes),
         "-byte indices and capacity ", first.capacity, "; this rank decodes ", float_traits<T>::name, ", ",
         sizeof(Index), "-byte indices and capacity ", format.capacity);
  if (first.coding != std::uint8_t(format.coding))
    fail(first, "the payloads' entries are coded ", int(first.coding), "; this rank decodes coding ",
         int(format.coding), " (0: plain, 1: compact, 2: compact8)");
  if (first.op != std::uint8_t(reduction::sum) && first.op != std::uint8_t(reduction::average))
    fail(first, "rank 0 asks for reduction ", int(first.op), ", neither sum nor average");
  for (std::size_t r = 0; r < ranks; ++r) {
    const wire_header h = detail::read_header(payloads[r]);
    if (h.count > h.capacity) fail(first, "rank ", r, " sent ", h.count, " entries, over the capacity ", h.capacity);
    const std::byte* at = payloads[r].data() + format.indices_offset();
    const std::byte* values = payloads[r].data() + format.values_offset(std::size_t(h.count));
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

}  // namespace sidco::comm
