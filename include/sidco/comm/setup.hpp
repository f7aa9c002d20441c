// What every rank's one-round exchange must share before any payload moves: the payload's
// size and everything that decides it. Each rank all-gathers one fixed-size record when it
// sets up an exchange, so that ranks whose layouts, densities or options would make their
// payloads differ in size raise the same error instead of overrunning a receive buffer, and
// a rank that cannot set up (an invalid argument, no memory) makes every rank raise it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <span>
#include <string>
#include <string_view>

#include "sidco/comm/wire.hpp"
#include "sidco/core/error.hpp"
#include "sidco/core/segment.hpp"
#include "sidco/core/utf8.hpp"

namespace sidco::comm {

/// Plain bytes on the wire, the same size on every rank.
struct exchange_setup {
  std::uint64_t failed;         // 1: this rank could not set up; reason says why
  std::uint64_t payload_bytes;
  std::uint64_t dense_size;
  std::uint64_t segments;
  std::uint64_t layout_digest;  // FNV-1a of the segment sizes
  std::uint64_t capacity;
  double delta, slack;
  std::uint32_t tag;
  std::uint8_t op, value_code, index_bytes, coding;
  std::uint32_t exact_sizes;    // 1: payloads travel at the size they use (exchange_options)
  std::uint32_t schedule;       // reduce_schedule
  char reason[176];
};
static_assert(sizeof(exchange_setup) == 256, "exchange_setup: 256 bytes on every platform");

namespace detail {

inline std::uint64_t layout_digest(std::span<const segment> layout) {
  std::uint64_t h = 0xcbf29ce484222325ull;
  for (const segment& s : layout)
    for (int b = 0; b < 8; ++b) h = (h ^ ((std::uint64_t(s.size) >> (8 * b)) & 0xFF)) * 0x100000001b3ull;
  return h;
}

}  // namespace detail

/// The record of a rank that set up an exchange of format over layout.
template <class T, class Index>
exchange_setup setup_of(std::span<const segment> layout, const wire_format& format, const wire_fields& fields,
                        double slack) {
  exchange_setup s{};
  s.payload_bytes = format.bytes();
  s.dense_size = layout.empty() ? 0 : layout.back().end();
  s.segments = layout.size();
  s.layout_digest = detail::layout_digest(layout);
  s.capacity = format.capacity;
  s.delta = fields.delta;
  s.slack = slack;
  s.tag = fields.tag;
  s.op = std::uint8_t(fields.op);
  s.value_code = float_traits<T>::wire_code;
  s.index_bytes = std::uint8_t(sizeof(Index));
  s.coding = std::uint8_t(format.coding);
  return s;
}

/// The record of a rank that could not set up, and why.
inline exchange_setup failed_setup(const std::exception& reason, std::uint32_t tag) {
  exchange_setup s{};
  s.failed = 1;
  s.tag = tag;
  const std::string_view text = sidco::detail::utf8_prefix(reason.what(), sizeof s.reason - 1);
  std::memcpy(s.reason, text.data(), text.size());
  return s;
}

/// Throws sidco::runtime_error, the same on every rank (they all read the same records): a
/// rank that could not set up (with its reason), or one whose payload or what decides it
/// differs from rank 0's. Names the rank and both values.
inline void check_setups(std::span<const exchange_setup> setups) {
  auto fail = [&](const auto&... parts) {
    throw runtime_error(sidco::detail::message("exchange setup (tag ", setups[0].tag, "): ", parts...));
  };
  for (std::size_t r = 0; r < setups.size(); ++r)
    if (setups[r].failed) {
      std::string_view reason(setups[r].reason, strnlen(setups[r].reason, sizeof setups[r].reason));
      if (reason.starts_with("sidco: ")) reason.remove_prefix(7);
      fail("rank ", r, " failed: ", sidco::detail::valid_utf8(reason));
    }
  const exchange_setup& first = setups[0];
  for (std::size_t r = 1; r < setups.size(); ++r) {
    const exchange_setup& s = setups[r];
    if (s.tag != first.tag) fail("rank ", r, " sets up tag ", s.tag, ", rank 0 tag ", first.tag, " (set up in another order)");
    if (s.dense_size != first.dense_size) fail("rank ", r, " has dense size ", s.dense_size, ", rank 0 has ", first.dense_size);
    if (s.segments != first.segments || s.layout_digest != first.layout_digest)
      fail("rank ", r, " has a layout of ", s.segments, " segments unlike rank 0's ", first.segments,
           " (every rank must split the tensor alike)");
    if (std::memcmp(&s.delta, &first.delta, sizeof s.delta) != 0)
      fail("rank ", r, " has density ", s.delta, ", rank 0 has ", first.delta);
    if (std::memcmp(&s.slack, &first.slack, sizeof s.slack) != 0)
      fail("rank ", r, " has capacity slack ", s.slack, ", rank 0 has ", first.slack);
    if (s.value_code != first.value_code)
      fail("rank ", r, " sends ", detail::value_name(s.value_code), " values, rank 0 ", detail::value_name(first.value_code));
    if (s.index_bytes != first.index_bytes)
      fail("rank ", r, " sends ", int(s.index_bytes), "-byte indices, rank 0 ", int(first.index_bytes));
    if (s.exact_sizes != first.exact_sizes)
      fail("rank ", r, s.exact_sizes ? " sends" : " does not send", " payloads at their exact size, rank 0",
           first.exact_sizes ? " does" : " does not", " (exchange_options::exact_sizes)");
    if (s.schedule != first.schedule)
      fail("rank ", r, " moves its payloads ", s.schedule ? "in two hops" : "flat", ", rank 0 ",
           first.schedule ? "in two hops" : "flat", " (exchange_options::schedule)");
    if (s.coding != first.coding)
      fail("rank ", r, " codes entries ", coding_name(s.coding), ", rank 0 ", coding_name(first.coding));
    if (s.op != first.op) fail("rank ", r, " reduces by ", detail::op_name(s.op), ", rank 0 by ", detail::op_name(first.op));
    if (s.capacity != first.capacity || s.payload_bytes != first.payload_bytes)
      fail("rank ", r, " has capacity ", s.capacity, " (", s.payload_bytes, "-byte payloads), rank 0 has ",
           first.capacity, " (", first.payload_bytes, ")");
  }
}

}  // namespace sidco::comm
