// The all-gather exchange, whatever carries it (MPI_Iallgather, torch.distributed's
// all_gather, NCCL): every rank trims its selection to a fixed capacity per tensor (what is
// trimmed goes back into its residual) and packs it into a payload of fixed size; one
// all-gather moves every payload; every rank checks them alike (comm/agree.hpp) and adds
// them up in rank order (comm/sum.hpp). Transports hold only their collective and its wait:
// comm/exchange.hpp (MPI), the DDP hook's codecs (python/sidco_torch/csrc).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <span>
#include <string>
#include <vector>

#include "sidco/comm/agree.hpp"
#include "sidco/comm/capacity.hpp"
#include "sidco/comm/compact.hpp"
#include "sidco/comm/report.hpp"
#include "sidco/comm/residual_sink.hpp"
#include "sidco/comm/sum.hpp"
#include "sidco/comm/wire.hpp"
#include "sidco/core/error.hpp"
#include "sidco/core/segment.hpp"
#include "sidco/core/sparse_vector.hpp"

namespace sidco::comm {

/// What an all-gather exchange delivered.
struct exchange_report {
  std::size_t entries = 0;   // entries from every rank together
  std::size_t distinct = 0;  // indices written
  std::size_t trimmed = 0;   // entries ranks returned to their residuals for want of capacity
  std::size_t bytes = 0;     // bytes each rank sent
  int ranks = 0;
};

namespace detail {

template <class T, class Index>
std::vector<entry_run<T, Index>> runs_of(payload_views payloads, const wire_format& format) {
  std::vector<entry_run<T, Index>> runs(payloads.size());
  for (std::size_t r = 0; r < payloads.size(); ++r) {
    const std::size_t count = std::size_t(read_header(payloads[r]).count);
    runs[r] = {payloads[r].data() + format.indices_offset(), payloads[r].data() + format.values_offset(count), count};
  }
  return runs;
}

}  // namespace detail

namespace detail {

/// update(index, the rule's result for sum) per index, counted (by value: sum_runs' note).
template <class T, class Index, class Update>
struct combining {
  Update update;
  sum_rule rule;
  std::span<const entry_run<T, Index>> runs;
  std::size_t distinct;
  void operator()(std::uint64_t index, typename float_traits<T>::accumulator sum) {
    update(index, combine<T>(sum, rule, index, [&] { return sum_divided_first<T, Index>(runs, index, rule.ranks); }));
    ++distinct;
  }
};

/// decode_entries after agree().
template <class T, class Index, class Update>
exchange_report sum_agreed(payload_views payloads, const wire_format& format, Update&& update) {
  const wire_header first = read_header(payloads[0]);
  const auto runs = runs_of<T, Index>(payloads, format);
  exchange_report report;
  report.ranks = int(payloads.size());
  report.bytes = format.bytes();
  for (std::size_t r = 0; r < payloads.size(); ++r) {
    report.entries += runs[r].count;
    report.trimmed += std::size_t(read_header(payloads[r]).trimmed);
  }
  const sum_rule rule{reduction(first.op), payloads.size()};
  const std::span<const entry_run<T, Index>> all(runs);
  try {
    report.distinct =
        sum_runs<T, Index>(all, 0, std::size_t(first.dense_size), combining<T, Index, Update>{update, rule, all, 0})
            .distinct;
  } catch (const nonfinite_error& e) {
    throw nonfinite_exchange(e.what());  // every rank reads the same values: a failure of the exchange
  }
  return report;
}

}  // namespace detail

/// Calls agree() (on any problem it throws, the same on every rank, having called nothing),
/// then update(index, value) for every index some rank sent, ascending, value being the
/// ranks' values combined by comm/sum.hpp's rule (rank-order sum in the accumulator type,
/// divided once for an average, divided first where that sum overflows; rounded once).
/// A result beyond T's range throws nonfinite_exchange, every rank alike, part way.
template <class T, class Index, class Update>
exchange_report decode_entries(payload_views payloads, const wire_format& format, Update&& update) {
  agree<T, Index>(payloads, format);
  return detail::sum_agreed<T, Index>(payloads, format, update);
}

namespace detail {

/// decode() after agree().
template <class T, class Index>
exchange_report decode_agreed(payload_views payloads, const wire_format& format, std::span<T> dense) {
  const std::uint64_t size = detail::read_header(payloads[0]).dense_size;
  if (dense.size() != size)
    sidco::detail::fail("decode: dense: size ", dense.size(), " does not match the exchange's dense size ", size);
  std::fill(dense.begin(), dense.end(), T(0));
  try {
    return detail::sum_agreed<T, Index>(payloads, format, [&](std::uint64_t i, T v) { dense[std::size_t(i)] = v; });
  } catch (...) {
    std::fill(dense.begin(), dense.end(), T(0));
    throw;
  }
}

}  // namespace detail

/// dense (overwritten) = 0, and at every index some rank sent, the ranks' values combined
/// as decode_entries says. Every rank gets the same bits. On a problem agree() finds it
/// throws having written nothing; on a result beyond T's range it throws
/// nonfinite_exchange leaving dense all zero. dense must have the exchange's dense size.
template <class T, class Index>
exchange_report decode(payload_views payloads, const wire_format& format, std::span<T> dense) {
  agree<T, Index>(payloads, format);
  return detail::decode_agreed<T, Index>(payloads, format, dense);
}

/// One tensor's (or one buffer of tensors') all-gather exchange on one rank: its capacity
/// plan and payload format, and what this rank sent in the step under way (to give back
/// when the step fails). Transports call encode (or encode_failure), move the payloads,
/// then decode (or decode_entries, for device memory).
template <class T, class Index = std::uint32_t>
class allgather_core {
 public:
  allgather_core() = default;
  /// Plans the capacity: ceil(slack k_s) entries per segment (comm/capacity.hpp); payloads
  /// in the given entry coding (comm/compact.hpp).
  /// trim_limit: exchange_options::trim_limit.
  allgather_core(std::vector<segment> layout, double delta, double slack, entry_coding coding = entry_coding::plain,
                 double trim_limit = 1.0)
      : layout_(std::move(layout)),
        plan_(plan_capacity(layout_, delta, slack)),
        size_(layout_.back().end()),
        delta_(delta),
        trim_limit_(trim_limit) {
    check_trim_limit(trim_limit);
    if (size_ > sparse_vector<T, Index>::max_dense_size)
      sidco::detail::fail("exchange: ", size_, " values exceed the ", 8 * sizeof(Index), "-bit index range");
    if (coding != entry_coding::plain && !is_compact(coding))
      sidco::detail::fail("exchange: entry coding ", int(coding), " is not plain (0), compact (1) or compact8 (2)");
    format_ = format_for<T, Index>(plan_.total, coding, size_);
    plain_ = format_for<T, Index>(plan_.total);
  }

  /// The payload's format on the wire.
  const wire_format& format() const { return format_; }
  /// The plain format of the same capacity, which compact payloads are expanded into.
  const wire_format& plain_format() const { return plain_; }
  /// The bytes of the last payload encoded that a receiver needs (compact entries: their
  /// end; the rest are zeros it can fill in itself); format().bytes() otherwise.
  std::size_t used_bytes() const { return used_; }
  const capacity_plan& capacities() const { return plan_; }
  const std::vector<segment>& layout() const { return layout_; }
  std::size_t size() const { return size_; }

  /// Trims sent to each segment's capacity (what it removes goes to sink: nothing is lost)
  /// and packs it into payload; in the compact coding it also gives back what narrowing
  /// rounds off (sent then holds the values sent). A problem with the arguments is packed
  /// instead (every rank's decode raises it), and what sent held goes back to sink.
  /// Returns how many entries it gave back whole.
  template <class Sink>
  std::size_t encode(sparse_vector<T, Index>& sent, Sink& sink, const wire_fields& fields, std::span<std::byte> payload) {
    packed_.clear(size_);
    used_ = format_.bytes();
    bool checked = false, rounded = false;
    try {
      if (sent.dense_size() != size_)
        sidco::detail::fail("exchange: the sparse vector's dense size ", sent.dense_size(), " is not the exchange's ", size_);
      checked = true;
      std::size_t trimmed = trim_to_capacity(sent, layout_, plan_, sink);
      check_trimmed(trimmed, sent.size() + trimmed, trim_limit_, delta_);
      if (is_compact(format_.coding)) {
        trimmed += fit_compact_body(sent, format_, sink);
        packed_ = sent;  // the values before rounding: what a failed step gives back
        const std::size_t dropped = round_for_compact(sent, sink, sink, format_.coding);  // given back whole, now
        if (dropped > 0) keep_sent(packed_, sent.indices());
        rounded = true;
        trimmed += dropped;
        used_ = pack_compact<T, Index>(sent.indices(), sent.values(), size_, trimmed, fields, format_, payload);
      } else {
        pack(sent, trimmed, fields, format_, payload);
        used_ = format_.plain_bytes(sent.size());
        packed_ = sent;
      }
      return trimmed;
    } catch (const std::exception& e) {
      if (rounded) give_back_sent(sink);
      else if (checked) give_back_all<T, Index>(sent.indices(), sent.values(), sink);
      pack_failure<T, Index>(e, size_, fields, format_, payload);
      return 0;
    }
  }

  /// For a rank whose compress threw: its reason in the payload, for every rank to raise.
  void encode_failure(const std::exception& reason, const wire_fields& fields, std::span<std::byte> payload) {
    packed_.clear(size_);
    used_ = format_.bytes();
    pack_failure<T, Index>(reason, size_, fields, format_, payload);
  }

  /// After a step that failed (decode threw on every rank): what this rank sent, back to sink.
  template <class Sink>
  std::size_t give_back_sent(Sink& sink) {
    const std::size_t given = give_back_all<T, Index>(packed_.indices(), packed_.values(), sink);
    packed_.clear(size_);
    return given;
  }

  /// decode(), giving back what this rank sent when the exchange failed (a
  /// sidco::runtime_error, raised alike on every rank). A problem of this rank's alone (a
  /// dense of the wrong size: a sidco::error) gives nothing back: the others applied it.
  template <class Sink>
  exchange_report decode(payload_views payloads, std::span<T> dense, Sink& sink) {
    try {
      if (format_.coding == entry_coding::plain) return comm::decode<T, Index>(payloads, format_, dense);
      exchange_report report = detail::decode_agreed<T, Index>(expanded(payloads), plain_, dense);
      report.bytes = format_.bytes();
      return report;
    } catch (const runtime_error&) {
      give_back_sent(sink);
      throw;
    }
  }

  /// decode_entries() into indices and values (cleared first, then the update's entries,
  /// ascending), for transports that write the update elsewhere (device memory).
  template <class Sink>
  exchange_report decode_into(payload_views payloads, std::vector<Index>& indices, std::vector<T>& values,
                              Sink& sink) {
    indices.clear();
    values.clear();
    return decode_entries(
        payloads,
        [&](std::uint64_t i, T v) {
          indices.push_back(Index(i));
          values.push_back(v);
        },
        sink);
  }

  /// decode_entries(), giving back as decode() does.
  template <class Update, class Sink>
  exchange_report decode_entries(payload_views payloads, Update&& update, Sink& sink) {
    try {
      if (format_.coding == entry_coding::plain) return comm::decode_entries<T, Index>(payloads, format_, update);
      exchange_report report = detail::sum_agreed<T, Index>(expanded(payloads), plain_, update);
      report.bytes = format_.bytes();
      return report;
    } catch (const runtime_error&) {
      give_back_sent(sink);
      throw;
    }
  }

 private:
  // unrounded's entries whose index sent (ascending, a subset) holds: what rounding did not
  // give back whole, so that a failed step gives back no index twice.
  static void keep_sent(sparse_vector<T, Index>& unrounded, std::span<const Index> sent) {
    Index* indices = unrounded.index_data();
    T* values = unrounded.value_data();
    std::size_t write = 0, s = 0;
    for (std::size_t j = 0; j < unrounded.size() && s < sent.size(); ++j) {
      if (indices[j] != sent[s]) continue;
      indices[write] = indices[j];
      values[write++] = values[j];
      ++s;
    }
    unrounded.truncate(write);
  }

  /// Compact payloads as plain ones (comm/compact.hpp), checked by agree() (the caller
  /// decodes them as agreed): a failure or disagreement anywhere comes first, then the first
  /// payload that did not decode.
  payload_views expanded(payload_views payloads) {
    for (const auto& p : payloads) detail::check_payload_size(p, format_);
    const std::size_t bytes = plain_.bytes();
    expansion_.resize(bytes * payloads.size());
    expanded_views_.resize(payloads.size());
    std::string damage;
    for (std::size_t r = 0; r < payloads.size(); ++r) {
      const std::span<std::byte> plain = std::span<std::byte>(expansion_).subspan(r * bytes, bytes);
      std::string problem = expand_compact<T, Index>(payloads[r], format_, r, plain_, plain);
      if (damage.empty()) damage = std::move(problem);
      expanded_views_[r] = plain;
    }
    agree<T, Index>(expanded_views_, plain_);
    if (!damage.empty()) throw runtime_error(damage);
    return expanded_views_;
  }

  std::vector<segment> layout_;
  capacity_plan plan_;
  wire_format format_, plain_;
  std::vector<std::byte> expansion_;  // compact payloads expanded, one plain payload per rank
  std::vector<std::span<const std::byte>> expanded_views_;
  std::size_t size_ = 0;
  std::size_t used_ = 0;
  double delta_ = 0, trim_limit_ = 1.0;
  sparse_vector<T, Index> packed_;  // what this rank's payload holds, this step
};

}  // namespace sidco::comm
